"""One request's output as text: detokenization and stop strings on top of the token deltas.

Shared by the HTTP handlers and the offline :class:`trillium.LLM`, so both see the same
text, the same finish reasons and the same token counts.
"""

from __future__ import annotations

import dataclasses
import time

from trillium.protocol import FinishReason, SamplingParams, TokenDelta
from trillium.runtime import Mailbox, MailboxClosed
from trillium.tokenizer.detokenizer import IncrementalDetokenizer
from trillium.tokenizer.stop import StopStringMatcher


@dataclasses.dataclass
class StreamOutput:
    """What one iteration of a :class:`RequestStream` adds."""

    text: str  # new text; always whole UTF-8 characters, never part of a stop string
    token_ids: list[int]  # new token ids
    finish_reason: FinishReason | None = None
    error: str | None = None
    # One (chosen logprob, [(token id, logprob)] best first) per new token id, when asked.
    logprobs: list[tuple[float, list[tuple[int, float]]]] | None = None


class RequestStream:
    """Async iterator of :class:`StreamOutput` for one submitted request.

    Stopping early (a stop string, or the consumer leaving) aborts the engine request;
    :meth:`abort` is synchronous so that it is safe in ``finally`` blocks.
    """

    def __init__(self, client, request_id: str, num_prompt_tokens: int, sampling: SamplingParams,
                 mailbox: Mailbox[TokenDelta]) -> None:
        self.client = client
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens
        self.num_completion_tokens = 0
        self.num_cached_tokens = 0
        self.finish_reason: FinishReason | None = None
        # Timing for metering (monotonic seconds): when tokens reached this stream, the seconds
        # between consecutive deltas spread over their tokens (k tokens after t seconds count
        # t/k each), and the scheduler's queue time.
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        self.inter_token_seconds: list[float] = []
        self.queue_time: float | None = None
        self._mailbox = mailbox
        self._engine_done = False  # the engine finished or was told to abort
        self._detok = IncrementalDetokenizer(client.tokenizer, skip_special_tokens=sampling.skip_special_tokens)
        self._stop = StopStringMatcher(sampling.stop)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> StreamOutput:
        if self.finish_reason is not None:
            raise StopAsyncIteration
        try:
            delta = await self._mailbox.get()
        except MailboxClosed:
            self._engine_done = True
            self.finish_reason = FinishReason.ABORT
            return StreamOutput("", [], FinishReason.ABORT)
        self.num_completion_tokens += len(delta.token_ids)
        if delta.token_ids:
            self._time_tokens(len(delta.token_ids))
        if delta.queue_time is not None:
            self.queue_time = delta.queue_time
        self.num_cached_tokens = max(self.num_cached_tokens, delta.num_cached_tokens)
        reason = delta.finish_reason
        self._engine_done = reason is not None
        text = self._detok.add(delta.token_ids)
        if reason is not None:
            text += self._detok.flush()
        text = self._stop.feed(text)
        if self._stop.stopped:
            if reason is None:
                self.abort()  # the engine would go on generating past the stop string
            reason = FinishReason.STOP
        elif reason is not None:
            text += self._stop.flush()
        self.finish_reason = reason
        return StreamOutput(text, delta.token_ids, reason, delta.error, delta.logprobs)

    def _time_tokens(self, num_tokens: int) -> None:
        now = time.monotonic()
        if self.last_token_time is None:
            self.first_token_time = now
        else:
            gap = (now - self.last_token_time) / num_tokens
            self.inter_token_seconds.extend([gap] * num_tokens)
        self.last_token_time = now

    def abort(self) -> None:
        """Tell the engine to drop this request and free its blocks now (idempotent)."""
        if self._engine_done:
            return
        self._engine_done = True
        self.client.abort(self.request_id, self._mailbox)
