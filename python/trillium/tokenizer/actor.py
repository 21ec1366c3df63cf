"""TokenizerActor: renders chat templates, encodes prompts and decodes token ids off the event loop.

A fixed number of worker tasks read the bounded inbox, so a burst of long prompts queues
(and eventually pushes back on the frontend) instead of spawning unbounded threads.

Every message's reply channel is closed when its handling ends, answered or not: if the actor
fails (and the supervisor restarts it), whoever was waiting gets ``EndOfChannel`` at once
(``ActorFailed`` in the client) instead of waiting forever.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, TypeAlias

import trio

from trillium.protocol import DetokenizeRequest, DetokenizeResult, TokenizeRequest, TokenizeResult
from trillium.runtime import Actor, faults

if TYPE_CHECKING:
    from trillium.tokenizer.tokenizer import Tokenizer

log = logging.getLogger("trillium.tokenizer")

# Encoding threads. Tokenization is short next to a model step; one thread per core at most.
NUM_TOKENIZER_WORKERS = 2

_Request: TypeAlias = "TokenizeRequest | DetokenizeRequest"


class TokenizerActor(Actor):
    name = "tokenizer"

    def __init__(self, tokenizer: Tokenizer, inbox: trio.MemoryReceiveChannel[_Request]) -> None:
        super().__init__(inbox)
        self.tokenizer = tokenizer
        self._inbox = inbox
        self._limiter = trio.CapacityLimiter(NUM_TOKENIZER_WORKERS)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(NUM_TOKENIZER_WORKERS):
                nursery.start_soon(self._worker, self._inbox.clone())
            task_status.started()

    async def _worker(self, inbox: trio.MemoryReceiveChannel[_Request]) -> None:
        async with inbox:
            async for message in inbox:
                self.took_message()
                with message.reply:  # closed however the handling ends
                    await faults.ahit("tokenizer.message")
                    await self._answer(message)

    async def _answer(self, message: _Request) -> None:
        """Answer one message; a bad template or input is an error answer, not a failure."""
        result: TokenizeResult | DetokenizeResult
        try:
            if isinstance(message, DetokenizeRequest):
                text = await trio.to_thread.run_sync(self.tokenizer.decode, message.token_ids, limiter=self._limiter)
                result = DetokenizeResult(text)
            else:
                ids = await trio.to_thread.run_sync(self.encode, message, limiter=self._limiter)
                result = TokenizeResult(ids)
        except Exception as exc:  # a bad template or input fails this request only
            log.warning("%s failed: %s", type(message).__name__, exc)
            error = f"{type(exc).__name__}: {exc}"
            result = (
                DetokenizeResult("", error) if isinstance(message, DetokenizeRequest) else TokenizeResult([], error)
            )
        try:
            message.reply.send_nowait(result)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the requester went away

    def encode(self, message: TokenizeRequest) -> list[int]:
        """Chat messages are rendered with the model's template first (its special tokens included)."""
        if message.messages is not None:
            # The request's variables (``enable_thinking``, ...); the frontend refuses any that names
            # an argument given here (messages, tools, add_generation_prompt, bos_token, eos_token).
            extra = dict(message.chat_template_kwargs or {})
            if message.tools:
                extra["tools"] = message.tools
            text = self.tokenizer.apply_chat_template(
                message.messages, add_generation_prompt=message.add_generation_prompt, **extra
            )
            return self.tokenizer.encode(text, add_special_tokens=False)
        assert message.prompt is not None  # EngineClient sets exactly one of prompt and messages
        if message.suffix is not None:
            return self.tokenizer.fim_prompt(message.prompt, message.suffix)
        return self.tokenizer.encode(message.prompt, add_special_tokens=message.add_special_tokens)
