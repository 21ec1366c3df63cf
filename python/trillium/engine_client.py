"""The client side of an engine: messages to its actors, and each request's output as text.

:class:`EngineClient` is the only way the HTTP server, the offline :class:`trillium.LLM` and
``trillium chat`` talk to the engine: every call is a message into a bounded actor inbox (a full
inbox is :class:`EngineOverloaded`). :class:`RequestStream` turns one request's token deltas into
text (incremental detokenization, stop strings), so every caller sees the same text, finish
reasons and token counts. The engine is built by ``trillium.launch``.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec
import trio

from trillium.models import ModelConfig
from trillium.protocol import (
    AbortRequest,
    AddRequest,
    CompileGrammar,
    DetokenizeRequest,
    DetokenizeResult,
    FinishReason,
    GrammarCompiled,
    GrammarStats,
    SamplingParams,
    SchedulerStats,
    StructuredOutputs,
    TokenDelta,
    TokenizeRequest,
    TokenizeResult,
)
from trillium.runtime import Mailbox, MailboxClosed, Snapshot
from trillium.scheduler.actor import merge_deltas
from trillium.structured import CompiledGrammar, GrammarError
from trillium.tokenizer import Tokenizer
from trillium.tokenizer.detokenizer import IncrementalDetokenizer
from trillium.tokenizer.stop import StopStringMatcher

Reply = TypeVar("Reply")


class EngineOverloaded(Exception):
    """An actor's inbox is full: the caller should retry later (HTTP 429/503)."""


class TokenizeError(ValueError):
    """The prompt could not be rendered, encoded or decoded (HTTP 400)."""


async def ask(
    inbox: trio.MemorySendChannel[Any], name: str, message_with_reply: Callable[[trio.MemorySendChannel[Reply]], Any]
) -> Reply:
    """Send ``message_with_reply(reply)`` to an actor's inbox and wait for its one answer.

    The request/reply pattern of every actor that answers (tokenizer, grammar): ``reply`` is a
    fresh one-slot channel, so the actor's ``send_nowait`` never blocks it. Raises
    EngineOverloaded (naming the actor) when the inbox is full; nothing is sent then.
    """
    send, recv = trio.open_memory_channel[Reply](1)
    try:
        inbox.send_nowait(message_with_reply(send))
    except trio.WouldBlock:
        raise EngineOverloaded(f"{name} queue is full") from None
    async with recv:
        return await recv.receive()


class EngineClient:
    """The message API to one engine's actors. Every method runs on the Trio event loop.

    ``tokenizer`` is read-only here: the frontend uses it for per-token incremental
    detokenization and logprob token strings; whole prompts go through the tokenizer actor.
    """

    def __init__(
        self,
        *,
        model_name: str,
        model_config: ModelConfig,
        max_model_len: int,
        tokenizer: Tokenizer,
        scheduler: trio.MemorySendChannel[Any],
        tokenizer_inbox: trio.MemorySendChannel[Any],
        grammar: trio.MemorySendChannel[Any],
        scheduler_stats: Snapshot[SchedulerStats],
        grammar_stats: Snapshot[GrammarStats],
    ) -> None:
        self.model_name = model_name
        self.model_config = model_config
        self.max_model_len = max_model_len
        self.tokenizer = tokenizer
        self._scheduler = scheduler
        self._tokenizer = tokenizer_inbox
        self._grammar = grammar
        self._scheduler_stats = scheduler_stats
        self._grammar_stats = grammar_stats
        self._ids = itertools.count()

    def new_request_id(self, prefix: str = "req") -> str:
        return f"{prefix}-{next(self._ids)}"

    async def tokenize(
        self,
        *,
        prompt: str | None = None,
        messages: list[dict[str, Any]] | None = None,
        add_special_tokens: bool = True,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        """Encode a prompt (raw text or chat messages). Raises TokenizeError or EngineOverloaded.

        ``add_special_tokens`` applies to raw text (BOS); chat messages get the template's own.
        ``add_generation_prompt`` ends a chat with the assistant turn's header."""
        result: TokenizeResult = await ask(
            self._tokenizer,
            "tokenizer",
            lambda reply: TokenizeRequest(
                prompt=prompt,
                messages=messages,
                add_special_tokens=add_special_tokens,
                add_generation_prompt=add_generation_prompt,
                reply=reply,
            ),
        )
        if result.error is not None:
            raise TokenizeError(result.error)
        return result.token_ids

    async def detokenize(self, token_ids: list[int]) -> str:
        """Decode token ids (special tokens skipped). Raises TokenizeError or EngineOverloaded."""
        result: DetokenizeResult = await ask(
            self._tokenizer, "tokenizer", lambda reply: DetokenizeRequest(token_ids, reply=reply)
        )
        if result.error is not None:
            raise TokenizeError(result.error)
        return result.text

    async def compile_grammar(self, constraint: StructuredOutputs) -> CompiledGrammar:
        """Compile an output constraint (cached by content). Raises GrammarError (malformed,
        unsupported, or over the compile time limit) or EngineOverloaded."""
        result: GrammarCompiled = await ask(
            self._grammar, "grammar", lambda reply: CompileGrammar(constraint=constraint, reply=reply)
        )
        if result.error is not None:
            raise GrammarError(result.error)
        grammar: CompiledGrammar = result.grammar  # protocol/ carries it untyped (no upward import)
        return grammar

    def submit(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: SamplingParams,
        cache_salt: str | None = None,
        grammar: CompiledGrammar | None = None,
    ) -> Mailbox[TokenDelta]:
        """Queue a request; its deltas arrive in the returned mailbox. Raises EngineOverloaded, or
        SamplingParamError for token ids outside the vocabulary.
        A request with ``sampling.structured`` needs its ``grammar`` from :meth:`compile_grammar`."""
        if (sampling.structured is None) != (grammar is None):
            raise ValueError("a constrained request needs its compiled grammar (and only it)")
        sampling.check_vocab(self.model_config.vocab_size)  # SamplingParamError (a ValueError)
        mailbox: Mailbox[TokenDelta] = Mailbox(merge_deltas)
        message = AddRequest(
            request_id=request_id,
            prompt_token_ids=prompt_token_ids,
            sampling=sampling,
            reply=mailbox,
            arrival_time=time.monotonic(),
            cache_salt=cache_salt,
            grammar=grammar,
        )
        try:
            self._scheduler.send_nowait(message)
        except trio.WouldBlock:
            raise EngineOverloaded("scheduler queue is full") from None
        return mailbox

    def open_stream(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: SamplingParams,
        cache_salt: str | None = None,
        grammar: CompiledGrammar | None = None,
    ) -> RequestStream:
        """Submit a request and return its text stream. Raises EngineOverloaded."""
        mailbox = self.submit(request_id, prompt_token_ids, sampling, cache_salt, grammar)
        return RequestStream(self, request_id, len(prompt_token_ids), sampling, mailbox)

    def abort(self, request_id: str, mailbox: Mailbox[TokenDelta] | None = None) -> None:
        """Abort without awaiting (safe in ``finally`` blocks). The closed mailbox is the fallback
        signal: the scheduler also aborts requests whose consumer went away."""
        if mailbox is not None:
            mailbox.close_consumer()
        try:
            self._scheduler.send_nowait(AbortRequest(request_id))
        except (trio.WouldBlock, trio.ClosedResourceError):
            pass

    def stats(self) -> dict[str, Any]:
        """The latest counters the scheduler and grammar actors published (``/stats``, ``/metrics``)."""
        return {
            **msgspec.structs.asdict(self._scheduler_stats.latest),
            **msgspec.structs.asdict(self._grammar_stats.latest),
        }


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

    def __init__(
        self,
        client: EngineClient,
        request_id: str,
        num_prompt_tokens: int,
        sampling: SamplingParams,
        mailbox: Mailbox[TokenDelta],
    ) -> None:
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
