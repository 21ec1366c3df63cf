"""OpenAI response objects: chat / completions bodies and chunks, usage, logprobs, and the
fan-out that reads the ``n`` choices of one request.

``n > 1`` shares the prompt's KV blocks through the prefix cache: choice 0 is submitted
first, and choices ``1..n-1`` only once its first delta arrived (its prompt's full blocks are
then cached), so they recompute only the last partial block.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

from trillium.engine_client import RequestStream, StreamOutput
from trillium.protocol import FinishReason

if TYPE_CHECKING:
    from trillium.server.choice_split import ChoiceSplitter, OutputParsing
    from trillium.tokenizer import Tokenizer


# One (chosen token's logprob, [(token id, logprob)] best first) per token, as the engine gives them.
TokenLogprobs: TypeAlias = list[tuple[float, list[tuple[int, float]]]]
# Aligned with a prompt's token ids: None for the first, then (logprob, top) as above.
PromptLogprobs: TypeAlias = list[tuple[float, list[tuple[int, float]]] | None]
# A JSON object of the response, as built here and encoded by msgspec.
JSONObject: TypeAlias = dict[str, Any]


class ChoiceFanout:
    """Reads the choices of one request round-robin (each stream's mailbox coalesces, so waiting
    on one choice delays the others' delivery but never their generation): ``n`` choices for
    each of ``num_prompts`` prompts, choice ``i`` being prompt ``i // n``'s choice ``i % n``.

    ``open_choice(i)`` submits choice ``i`` and may raise ``EngineOverloaded``; a prompt's choices
    after its first are submitted once the first's first delta arrived (its prompt blocks are then
    in the prefix cache). ``n`` is the number of choices in all; :meth:`abort` is synchronous
    (safe in ``finally``).
    """

    def __init__(self, open_choice: Callable[[int], RequestStream], n: int, num_prompts: int = 1) -> None:
        self._open = open_choice
        self.per_prompt = n
        self.n = n * num_prompts
        self.streams: list[RequestStream] = []  # in the order they were opened
        self._by_index: dict[int, RequestStream] = {}
        self._firsts: list[RequestStream] = []  # each prompt's first choice: its prompt usage
        self._active: list[int] = []
        self._cursor = 0
        self._decided: set[int] = set()  # first choices whose siblings were started (or never will be)
        try:
            for prompt in range(num_prompts):
                self._firsts.append(self._start(prompt * n))
        except BaseException:  # refused part-way (a full queue): nobody will read those opened
            self.abort()
            raise

    def _start(self, i: int) -> RequestStream:
        stream = self._open(i)
        self._by_index[i] = stream
        self.streams.append(stream)
        self._active.append(i)
        return stream

    async def next(self) -> tuple[int, StreamOutput] | None:
        if not self._active:
            return None
        self._cursor %= len(self._active)
        i = self._active[self._cursor]
        out = await self._by_index[i].__anext__()
        if i % self.per_prompt == 0 and self.per_prompt > 1 and i not in self._decided:
            self._decided.add(i)
            if out.finish_reason in (FinishReason.ERROR, FinishReason.ABORT):
                self.n -= self.per_prompt - 1  # no point in starting the siblings
            else:
                for j in range(i + 1, i + self.per_prompt):
                    self._start(j)
        if out.finish_reason is not None:
            self._active.remove(i)
        else:
            self._cursor += 1
        return i, out

    def abort(self) -> None:
        for stream in self.streams:
            stream.abort()

    def usage(self) -> JSONObject:
        p = sum(s.num_prompt_tokens for s in self._firsts)
        c = sum(s.num_completion_tokens for s in self.streams)
        details: JSONObject = {"cached_tokens": sum(s.num_cached_tokens for s in self._firsts)}
        if len(self.streams) > 1:  # not OpenAI's; shows the siblings reused their first choice's blocks
            details["cached_tokens_per_choice"] = [self._by_index[i].num_cached_tokens for i in sorted(self._by_index)]
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

    def completion_prompt(self, prompt_ids: list[int], logprobs: PromptLogprobs) -> JSONObject:
        """The echoed prompt's tokens in the completions shape: each token's logprob given the ones
        before it (the first's is None, as is its top), offsets from the start of the prompt."""
        tokens: list[str] = []
        token_logprobs: list[float | None] = []
        tops: list[dict[str, float] | None] = []
        offsets: list[int] = []
        offset = 0
        for token_id, entry in zip(prompt_ids, logprobs):
            text = self.token_text(token_id)
            tokens.append(text)
            token_logprobs.append(entry[0] if entry is not None else None)
            tops.append({self.token_text(i): lp for i, lp in entry[1]} if entry is not None else None)
            offsets.append(offset)
            offset += len(text)
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}

    def vllm_prompt(self, prompt_ids: list[int], logprobs: PromptLogprobs) -> list[JSONObject | None]:
        """vLLM's ``prompt_logprobs``: per prompt position None (the first) or ``{token id: {logprob,
        rank, decoded_token}}`` for the prompt's token and the top alternatives (rank: 1 is the
        most likely; None for the prompt's token when it is not among the top)."""
        out: list[JSONObject | None] = []
        for token_id, entry in zip(prompt_ids, logprobs):
            if entry is None:
                out.append(None)
                continue
            logprob, top = entry
            ranks = {i: r for r, (i, _) in enumerate(top, 1)}
            position = {
                str(token_id): {
                    "logprob": logprob,
                    "rank": ranks.get(token_id),
                    "decoded_token": self.token_text(token_id),
                }
            }
            for i, lp in top:
                position.setdefault(str(i), {"logprob": lp, "rank": ranks[i], "decoded_token": self.token_text(i)})
            out.append(position)
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

    ``parsing`` (chat only) makes a fresh splitter per choice (``server/choice_split.py``): the
    choice's text is then split into ``reasoning_content``, content and ``tool_calls``."""

    def __init__(
        self,
        request_id: str,
        model: str,
        chat: bool,
        logprobs: LogprobsFormatter | None = None,
        parsing: OutputParsing | None = None,
        prompt_logprobs: LogprobsFormatter | None = None,
    ) -> None:
        self.request_id = request_id
        self.model = model
        self.chat = chat
        self.logprobs = logprobs
        self.parsing = parsing
        self.prompt_logprobs = prompt_logprobs  # vLLM's prompt_logprobs were asked for
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
        prompt_logprobs: list[JSONObject | None] | None = None,
        closed_early: bool = False,
        unsatisfied_check: str | None = None,
        reasoning: str | None = None,
    ) -> JSONObject:
        """One SSE chunk of choice ``index``. ``closed_early`` (with finish reason ``length``)
        adds ``"closed_early": true`` to the choice, and ``unsatisfied_check`` its message:
        trillium's extensions, see :meth:`full`. ``reasoning``: reasoning text, as
        ``delta.reasoning_content`` (vLLM's and llama.cpp's field; chat only)."""
        if self.chat:
            delta: JSONObject = {}
            if first:
                delta["role"] = "assistant"
            if reasoning is not None:
                delta["reasoning_content"] = reasoning
            if text is not None:
                delta["content"] = text
            if tool_calls:
                delta["tool_calls"] = tool_calls
            lp = {"content": logprobs} if logprobs is not None else None
            choice = {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish_reason}
            _mark_closed(choice, closed_early, unsatisfied_check)
            chunk = {**self._envelope("chat.completion.chunk"), "choices": [choice]}
            if prompt_logprobs is not None:
                chunk["prompt_logprobs"] = prompt_logprobs
            return chunk
        choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
        _mark_closed(choice, closed_early, unsatisfied_check)
        if prompt_logprobs is not None:
            choice["prompt_logprobs"] = prompt_logprobs
        return {**self._envelope("text_completion"), "choices": [choice]}

    def usage_chunk(self, usage: JSONObject) -> JSONObject:
        return {
            **self._envelope("chat.completion.chunk" if self.chat else "text_completion"),
            "choices": [],
            "usage": usage,
        }

    def full(
        self,
        choices: list[tuple[str, str, JSONObject | list[JSONObject] | None]],
        usage: JSONObject,
        prompt_logprobs: list[list[JSONObject | None] | None] | None = None,
        closed_early: frozenset[int] = frozenset(),
        unsatisfied_checks: dict[int, str] | None = None,
        splitters: Sequence[ChoiceSplitter | None] = (),
    ) -> JSONObject:
        """``choices``: (text, finish_reason, formatted logprobs or None) per index;
        ``splitters``: a chat choice's split text per index, when its outputs were parsed (its
        message then holds the splitter's content, ``reasoning_content`` and ``tool_calls``
        instead of the text); ``prompt_logprobs``: vLLM's, per index (chat: the first's, at the top level).
        ``closed_early``: the indexes whose JSON output was closed by its grammar's shortest
        completion before ``max_tokens`` cut it (finish reason ``length``): their choice gets
        ``"closed_early": true``, a trillium extension (absent otherwise). ``unsatisfied_checks``:
        index -> the value check (a schema keyword beyond the grammar) that a closed output
        still fails, because no closing within ``max_tokens`` satisfied it: the choice gets
        ``"unsatisfied_check": MESSAGE`` (the JSON parses but does not validate)."""
        body: list[JSONObject]
        if self.chat:
            body = []
            for i, (text, reason, lp) in enumerate(choices):
                message: JSONObject = {"role": "assistant", "content": text}
                splitter = splitters[i] if i < len(splitters) else None
                if splitter is not None:
                    message, reason = _split_message(splitter, reason)
                body.append(
                    {
                        "index": i,
                        "message": message,
                        "logprobs": {"content": lp} if lp is not None else None,
                        "finish_reason": reason,
                    }
                )
            for i in closed_early:
                _mark_closed(body[i], True, (unsatisfied_checks or {}).get(i))
            response = {**self._envelope("chat.completion"), "choices": body, "usage": usage}
            if prompt_logprobs is not None:
                response["prompt_logprobs"] = prompt_logprobs[0]
            return response
        body = [
            {"index": i, "text": text, "logprobs": lp, "finish_reason": reason}
            for i, (text, reason, lp) in enumerate(choices)
        ]
        for i in closed_early:
            _mark_closed(body[i], True, (unsatisfied_checks or {}).get(i))
        if prompt_logprobs is not None:
            for choice, plp in zip(body, prompt_logprobs):
                choice["prompt_logprobs"] = plp
        return {**self._envelope("text_completion"), "choices": body, "usage": usage}


def _split_message(splitter: ChoiceSplitter, reason: str) -> tuple[JSONObject, str]:
    """A parsed choice's message and finish reason (``tool_calls`` for one that stopped after its
    calls). Content is null next to tool calls or reasoning when there is none (OpenAI's and
    vLLM's shape); ``reasoning_content`` is there whenever the reasoning was split (null: none)."""
    content, calls = splitter.content, [call.openai() for call in splitter.calls]
    message: JSONObject = {"role": "assistant", "content": content}
    if splitter.splits_reasoning:
        message["reasoning_content"] = splitter.reasoning or None
    if calls:
        message["tool_calls"] = calls
        reason = "tool_calls" if reason == "stop" else reason
    if calls or splitter.reasoning:
        message["content"] = content or None
    return message, reason


def reasoning_usage(usage: JSONObject, splitters: Sequence[ChoiceSplitter | None]) -> JSONObject:
    """``usage`` with ``completion_tokens_details.reasoning_tokens`` (OpenAI's field: the choices'
    tokens spent reasoning), when a reasoning parser read the choices; as it was otherwise."""
    split = [s for s in splitters if s is not None and s.splits_reasoning]
    if not split:
        return usage
    return {**usage, "completion_tokens_details": {"reasoning_tokens": sum(s.num_reasoning_tokens for s in split)}}


def error_payload(message: str, request_id: str | None = None) -> JSONObject:
    """A server-side failure in OpenAI's error shape; the request id lets an operator find it in the
    log and the ledger."""
    if request_id is not None:
        message = f"{message} (request id {request_id})"
    return {"error": {"message": message, "type": "internal_error", "param": None, "code": "internal_error"}}


def _mark_closed(choice: JSONObject, closed_early: bool, unsatisfied_check: str | None) -> None:
    """trillium's extensions on a choice closed before ``max_tokens`` (absent otherwise)."""
    if closed_early:
        choice["closed_early"] = True
        if unsatisfied_check is not None:
            choice["unsatisfied_check"] = unsatisfied_check
