"""Input limits: how much one request may ask of the server, checked at the front door.

Every limit is a 4xx in the OpenAI error shape naming the field (``param``) and the
``trillium serve`` flag that sets it; the body size is a 413 sent before the body is read.
Checked in the order a request is processed, so that nothing unbounded runs first:

1. :class:`BodySizeLimit` (ASGI middleware): ``Content-Length`` over the limit -> 413 without
   reading; a chunked body -> 413 as soon as the bytes read pass it. Starlette then buffers at
   most ``max_body_bytes`` per request.
2. ``server.schema.decode_body``: msgspec's C decoder (too deep for it -> 400, never a 500).
3. :meth:`InputLimits.check_body`: message count, ``logit_bias`` entries, stop string
   characters, and (after ``SamplingParams`` is built) :meth:`InputLimits.check_structured`:
   grammar size and JSON nesting depth, before anything walks the schema.
4. :meth:`InputLimits.check_prompt_chars`: characters before tokenization (tokenizer CPU and
   memory grow with them: ~4 s and ~600 MB per MiB of random Unicode on one core, measured).
5. :meth:`InputLimits.check_tokens`: ``n`` x ``max_tokens`` and the KV cache a request holds.

Grammar compile *time* is the grammar actor's limit (``structured/actor.py``); the number of
stop strings and stop token ids, logprobs and ``n`` are fixed protocol ranges (``SamplingParams``,
``schema.MAX_N``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import msgspec

from trillium.protocol import StructuredOutputs
from trillium.server.anthropic_errors import error_response
from trillium.server.errors import APIError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MiB = 2**20
LIMIT_CODE = "limit_exceeded"
# A JSON schema written by hand nests a dozen levels; 64 leaves room for generated ones and keeps
# every recursive walk of it (the grammar compiler's json.loads/dumps) far from Python's limit.
DEFAULT_MAX_JSON_DEPTH = 64
# Characters per token seen in practice: ~4 for English, fewer for code and CJK, up to 64 for a
# run of spaces. 16 per token of context lets every real prompt that fits the context through.
PROMPT_CHARS_PER_TOKEN = 16
MIN_PROMPT_CHARS = 64 * 1024


@dataclasses.dataclass(frozen=True)
class InputLimits:
    """Per-request limits (``trillium serve --max-*``). ``None`` fields derive from the engine in
    :meth:`for_engine`: prompt characters from the context length, output tokens from it too,
    KV tokens from the KV pool. Raises ValueError (at start-up) for a limit below 1."""

    # 8 MiB holds any prompt the other limits let through (2 Mi characters for a 128k context);
    # the worst body to decode (many tiny messages) peaks near 70 MB at 8 MiB (measured).
    max_body_bytes: int = 8 * MiB
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH  # nesting of JSON schemas (the only untyped fields)
    max_messages: int = 2048
    max_prompt_chars: int | None = None  # default: max(64 Ki, 16 x max_model_len)
    max_logit_bias: int = 1024  # entries; each is applied to every sampled row
    max_stop_chars: int = 4096  # all stop strings together (each is matched on every delta)
    max_output_tokens: int | None = None  # n x max_tokens; default: 4 x max_model_len
    max_grammar_bytes: int = 256 * 1024  # a constraint's JSON encoding (schema, regex, grammar, choices)
    max_kv_tokens: int | None = None  # n x (prompt + max_tokens); default: the whole KV pool
    max_prompts: int = 256  # prompts in one completions request (each is tokenized on its own)
    # prompt positions x (k + 1) x choices of prompt logprobs: each entry is ~1 KB of response
    max_prompt_logprobs: int = 65536

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is not None and value < 1:
                raise ValueError(f"--{field.name.replace('_', '-')} must be at least 1, got {value}")

    def for_engine(self, max_model_len: int, num_kv_tokens: int | None) -> InputLimits:
        """These limits with the defaults that depend on the engine filled in."""
        return dataclasses.replace(
            self,
            max_prompt_chars=self.max_prompt_chars or max(MIN_PROMPT_CHARS, PROMPT_CHARS_PER_TOKEN * max_model_len),
            max_output_tokens=self.max_output_tokens or 4 * max_model_len,
            max_kv_tokens=self.max_kv_tokens or num_kv_tokens,
        )

    # ---- checks (each raises APIError naming the field) ----------------------------------------

    def check_body(
        self,
        *,
        messages: list[Any] | None = None,
        logit_bias: dict[str, float] | None = None,
        stop: Any = None,
        prompts: list[Any] | None = None,
    ) -> None:
        """Counts taken straight from the decoded body, before any per-item work."""
        if messages is not None and len(messages) > self.max_messages:
            raise _too_many("messages", len(messages), "messages", self.max_messages, "--max-messages")
        if prompts is not None and len(prompts) > self.max_prompts:
            raise _too_many("prompt", len(prompts), "prompts", self.max_prompts, "--max-prompts")
        if logit_bias is not None and len(logit_bias) > self.max_logit_bias:
            raise _too_many("logit_bias", len(logit_bias), "entries", self.max_logit_bias, "--max-logit-bias")
        if stop is not None:
            stop_chars = len(stop) if isinstance(stop, str) else sum(len(s) for s in stop)
            if stop_chars > self.max_stop_chars:
                raise _too_many("stop", stop_chars, "characters", self.max_stop_chars, "--max-stop-chars")

    def check_structured(self, constraint: StructuredOutputs | None, param: str) -> None:
        """Grammar size (its JSON encoding, any kind of constraint) and the nesting depth of a
        JSON schema (an object, or its JSON text). ``param`` names the field it came from."""
        if constraint is None:
            return
        value = next((v for v in (constraint.json, constraint.regex, constraint.choice, constraint.grammar) if v), None)
        if value is None:  # json_object: nothing to measure
            return
        try:  # msgspec's C encoder and decoder guard their own recursion: too deep for them is too deep
            size = len(msgspec.json.encode(value))
            if size > self.max_grammar_bytes:
                raise _too_many(param, size, "bytes", self.max_grammar_bytes, "--max-grammar-bytes")
            if isinstance(value, str) and value is constraint.json:
                value = msgspec.json.decode(value)  # the schema's JSON text: measure what it holds
        except RecursionError:
            raise self._too_deep(param) from None
        except msgspec.DecodeError:
            return  # not JSON at all: the grammar compiler says so
        if json_depth(value, self.max_json_depth) > self.max_json_depth:
            raise self._too_deep(param)

    def _too_deep(self, param: str) -> APIError:
        return APIError(
            f"{param} nests deeper than this server's limit of {self.max_json_depth} levels (--max-json-depth)",
            param=param,
            code=LIMIT_CODE,
        )

    def check_prompt_chars(self, prompt: str | list[dict[str, Any]], param: str) -> None:
        """Characters of a prompt, or of chat messages' roles and contents, before tokenization."""
        assert self.max_prompt_chars is not None, "call for_engine() first"
        messages = [{"role": "", "content": prompt}] if isinstance(prompt, str) else prompt
        num_chars = sum(len(m["role"]) + len(m["content"]) for m in messages)
        if num_chars > self.max_prompt_chars:
            raise _too_many(param, num_chars, "characters", self.max_prompt_chars, "--max-prompt-chars")

    def check_prompt_logprobs(self, num_positions: int, k: int | None, num_choices: int) -> None:
        """Prompt logprobs returned by one request: positions (over its prompts) x (k + 1) x the
        choices that carry them; the response holds them all at once."""
        if k is None:
            return
        entries = num_positions * (k + 1) * num_choices
        if entries > self.max_prompt_logprobs:
            raise _too_many(
                "prompt_logprobs", entries, "prompt logprob entries", self.max_prompt_logprobs, "--max-prompt-logprobs"
            )

    def check_token_ids(self, token_ids: list[int], param: str) -> None:
        """Token ids to detokenize: decoding cost grows with them as encoding's does with characters."""
        assert self.max_prompt_chars is not None, "call for_engine() first"
        if len(token_ids) > self.max_prompt_chars:
            raise _too_many(param, len(token_ids), "token ids", self.max_prompt_chars, "--max-prompt-chars")

    def check_tokens(self, num_prompt_tokens: int, max_tokens: int, n: int, num_kv_tokens: int | None) -> None:
        """``max_tokens`` is resolved (never None). ``num_kv_tokens`` is the KV pool: one choice
        that could never fit it would only fail later, in the scheduler."""
        assert self.max_output_tokens is not None, "call for_engine() first"
        if n * max_tokens > self.max_output_tokens:
            raise APIError(
                f"n x max_tokens is {n} x {max_tokens} = {n * max_tokens} tokens, more than this server's "
                f"limit of {self.max_output_tokens} tokens per request (--max-output-tokens); "
                "lower n or set a smaller max_tokens",
                param="max_tokens",
                code=LIMIT_CODE,
            )
        per_choice = num_prompt_tokens + max_tokens
        if num_kv_tokens is not None and per_choice > num_kv_tokens:
            raise APIError(
                f"prompt + max_tokens is {per_choice} tokens, more than the KV cache holds ({num_kv_tokens} "
                "tokens); lower max_tokens or shorten the prompt",
                param="max_tokens",
                code=LIMIT_CODE,
            )
        if self.max_kv_tokens is not None and n * per_choice > self.max_kv_tokens:
            raise APIError(
                f"n x (prompt + max_tokens) is {n} x {per_choice} = {n * per_choice} tokens of KV cache, more "
                f"than this server's limit of {self.max_kv_tokens} per request (--max-kv-tokens)",
                param="max_tokens",
                code=LIMIT_CODE,
            )


def _too_many(param: str, value: int, unit: str, limit: int, flag: str) -> APIError:
    return APIError(
        f"{param} has {value} {unit}, more than this server's limit of {limit} ({flag})", param=param, code=LIMIT_CODE
    )


def json_depth(value: Any, stop_above: int) -> int:
    """Nesting depth of decoded JSON (a scalar is 0, ``[]`` is 1, ``[[1]]`` is 2), without
    recursion. Stops early and returns ``stop_above + 1`` once the depth passes ``stop_above``.
    O(number of values): call it after the value's size is known to be bounded."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        depth += 1
        if depth > stop_above:
            return depth
        deepest = max(deepest, depth)
        stack.extend((child, depth) for child in children)
    return deepest


def body_too_large(limit: int) -> APIError:
    return APIError(
        f"request body is larger than this server's limit of {limit} bytes (--max-body-bytes)",
        status=413,
        code="request_too_large",
        headers={"Connection": "close"},  # the rest of the body is never read: the connection cannot be reused
    )


class BodySizeLimit:
    """Pure ASGI middleware: a request body over ``max_body_bytes`` is a 413.

    With a ``Content-Length`` over the limit the 413 is sent before any of the body is read
    (hypercorn then closes the connection). Without one (chunked), ``receive`` counts the bytes
    and raises the 413 :class:`APIError` once they pass the limit, so the route that reads the
    body stops there (the app's ``APIError`` handler writes it). Not ``BaseHTTPMiddleware``: that
    would run the app in another task and buffer streamed responses.
    """

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_body_bytes
        for name, value in scope.get("headers", ()):
            if name.lower() == b"content-length":
                if value.strip().isdigit() and int(value) > limit:  # h11 has rejected a malformed one
                    await error_response(body_too_large(limit), scope["path"])(scope, receive, send)
                    return
                break
        num_received = 0

        async def limited_receive() -> Message:
            nonlocal num_received
            message = await receive()
            if message["type"] == "http.request":
                num_received += len(message.get("body", b""))
                if num_received > limit:
                    raise body_too_large(limit)
            return message

        await self.app(scope, limited_receive, send)
