"""OpenAI response objects: chat / completions bodies and chunks, usage, logprobs, and the
fan-out that reads the ``n`` choices of one request.

``n > 1`` shares the prompt's KV blocks through the prefix cache: choice 0 is submitted
first, and choices ``1..n-1`` only once its first delta arrived (its prompt's full blocks are
then cached), so they recompute only the last partial block.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from trillium.engine_client import RequestStream, StreamOutput
from trillium.protocol import FinishReason
from trillium.tools import ToolCallParser

if TYPE_CHECKING:
    from trillium.tokenizer import Tokenizer


class ToolParsing(Protocol):
    """What :class:`ResponseShape` needs of a request's tool calling (``server/tool_calls.py``)."""

    def new_parser(self) -> ToolCallParser: ...

    def split(self, text: str) -> tuple[str, list[JSONObject]]:
        """A whole choice's text -> (content, OpenAI ``tool_calls``)."""
        ...


# One (chosen token's logprob, [(token id, logprob)] best first) per token, as the engine gives them.
TokenLogprobs: TypeAlias = list[tuple[float, list[tuple[int, float]]]]
# A JSON object of the response, as built here and encoded by msgspec.
JSONObject: TypeAlias = dict[str, Any]


class ChoiceFanout:
    """Reads the ``n`` streams of one request round-robin (each stream's mailbox coalesces,
    so waiting on one choice delays the others' delivery but never their generation).

    ``open_choice(i)`` submits choice ``i`` and may raise ``EngineOverloaded``. :meth:`abort`
    is synchronous (safe in ``finally``).
    """

    def __init__(self, open_choice: Callable[[int], RequestStream], n: int) -> None:
        self._open = open_choice
        self.n = n
        self.streams = [open_choice(0)]
        self._active = [0]
        self._cursor = 0

    async def next(self) -> tuple[int, StreamOutput] | None:
        if not self._active:
            return None
        self._cursor %= len(self._active)
        i = self._active[self._cursor]
        out = await self.streams[i].__anext__()
        if i == 0 and len(self.streams) < self.n:
            if out.finish_reason in (FinishReason.ERROR, FinishReason.ABORT):
                self.n = 1  # no point in starting the siblings
            else:
                for j in range(1, self.n):
                    self.streams.append(self._open(j))
                    self._active.append(j)
        if out.finish_reason is not None:
            self._active.remove(i)
        else:
            self._cursor += 1
        return i, out

    def abort(self) -> None:
        for stream in self.streams:
            stream.abort()

    def usage(self) -> JSONObject:
        first = self.streams[0]
        p = first.num_prompt_tokens
        c = sum(s.num_completion_tokens for s in self.streams)
        details: JSONObject = {"cached_tokens": first.num_cached_tokens}
        if len(self.streams) > 1:  # not OpenAI's; shows the siblings reused choice 0's blocks
            details["cached_tokens_per_choice"] = [s.num_cached_tokens for s in self.streams]
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c, "prompt_tokens_details": details}


class LogprobsFormatter:
    """Turns (chosen logprob, top alternatives) per token into OpenAI's two logprobs shapes."""

    def __init__(self, tokenizer: Tokenizer, chat: bool) -> None:
        self.tokenizer = tokenizer
        self.chat = chat
        self._text: dict[int, str] = {}

    def token_text(self, token_id: int) -> str:
        text = self._text.get(token_id)
        if text is None:
            text = self._text[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text

    def chat_content(self, token_ids: list[int], logprobs: TokenLogprobs) -> list[JSONObject]:
        out = []
        for token_id, (logprob, top) in zip(token_ids, logprobs):
            text = self.token_text(token_id)
            out.append(
                {
                    "token": text,
                    "logprob": logprob,
                    "bytes": list(text.encode()),
                    "top_logprobs": [
                        {"token": (t := self.token_text(i)), "logprob": lp, "bytes": list(t.encode())} for i, lp in top
                    ],
                }
            )
        return out

    def completion(self, token_ids: list[int], logprobs: TokenLogprobs, text_offset: int) -> JSONObject:
        """``text_offset`` is where the first of these tokens starts in the choice's text."""
        tokens: list[str] = []
        token_logprobs: list[float] = []
        tops: list[dict[str, float]] = []
        offsets: list[int] = []
        for token_id, (logprob, top) in zip(token_ids, logprobs):
            text = self.token_text(token_id)
            tokens.append(text)
            token_logprobs.append(logprob)
            tops.append({self.token_text(i): lp for i, lp in top})
            offsets.append(text_offset)
            text_offset += len(text)
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}


class ResponseShape:
    """Builds OpenAI response objects for one request (chat or legacy completions).

    ``tool_calls`` (chat only) makes a fresh parser per choice: the choice's text is then split
    into content and ``tool_calls`` (``trillium.tools.parsers``)."""

    def __init__(
        self,
        request_id: str,
        model: str,
        chat: bool,
        logprobs: LogprobsFormatter | None = None,
        tool_calls: ToolParsing | None = None,
    ) -> None:
        self.request_id = request_id
        self.model = model
        self.chat = chat
        self.logprobs = logprobs
        self.tool_calls = tool_calls
        self.created = int(time.time())

    def _envelope(self, object_: str) -> JSONObject:
        return {"id": self.request_id, "object": object_, "created": self.created, "model": self.model}

    def chunk(
        self,
        index: int,
        text: str | None,
        finish_reason: str | None,
        *,
        first: bool = False,
        logprobs: JSONObject | list[JSONObject] | None = None,
        tool_calls: list[JSONObject] | None = None,
    ) -> JSONObject:
        if self.chat:
            delta: JSONObject = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            if tool_calls:
                delta["tool_calls"] = tool_calls
            lp = {"content": logprobs} if logprobs is not None else None
            choice = {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish_reason}
            return {**self._envelope("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
        return {**self._envelope("text_completion"), "choices": [choice]}

    def usage_chunk(self, usage: JSONObject) -> JSONObject:
        return {
            **self._envelope("chat.completion.chunk" if self.chat else "text_completion"),
            "choices": [],
            "usage": usage,
        }

    def full(
        self, choices: list[tuple[str, str, JSONObject | list[JSONObject] | None]], usage: JSONObject
    ) -> JSONObject:
        """``choices``: (text, finish_reason, formatted logprobs or None) per index."""
        body: list[JSONObject]
        if self.chat:
            body = []
            for i, (text, reason, lp) in enumerate(choices):
                message: JSONObject = {"role": "assistant", "content": text}
                if self.tool_calls is not None:
                    content, calls = self.tool_calls.split(text)
                    message["content"] = content or None  # OpenAI: null next to tool calls
                    if calls:
                        message["tool_calls"] = calls
                        reason = "tool_calls" if reason == "stop" else reason
                    else:
                        message["content"] = content
                body.append(
                    {
                        "index": i,
                        "message": message,
                        "logprobs": {"content": lp} if lp is not None else None,
                        "finish_reason": reason,
                    }
                )
            return {**self._envelope("chat.completion"), "choices": body, "usage": usage}
        body = [
            {"index": i, "text": text, "logprobs": lp, "finish_reason": reason}
            for i, (text, reason, lp) in enumerate(choices)
        ]
        return {**self._envelope("text_completion"), "choices": body, "usage": usage}


def error_payload(message: str, request_id: str | None = None) -> JSONObject:
    """A server-side failure in OpenAI's error shape; the request id lets an operator find it in the
    log and the ledger."""
    if request_id is not None:
        message = f"{message} (request id {request_id})"
    return {"error": {"message": message, "type": "internal_error", "param": None, "code": "internal_error"}}
