"""OpenAI request bodies as msgspec Structs, and their translation into :class:`SamplingParams`.

Unknown fields are ignored (clients send many); known fields are type-checked by msgspec
and range-checked here, each failure naming its field.
"""

from __future__ import annotations

import msgspec

from trillium.protocol import SamplingParams
from trillium.server.errors import APIError

MAX_STOP_STRINGS = 16


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


class ContentPart(msgspec.Struct):
    type: str
    text: str | None = None


class ChatMessage(msgspec.Struct):
    role: str
    content: str | list[ContentPart] | None = None


class _Common(msgspec.Struct, kw_only=True):
    """Fields shared by chat and completions (OpenAI names, plus vLLM's extensions)."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # vLLM extension
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None  # vLLM extension
    seed: int | None = None
    ignore_eos: bool = False  # vLLM extension
    skip_special_tokens: bool = True  # vLLM extension
    user: str | None = None
    cache_salt: str | None = None  # vLLM extension: a tenant's private prefix-cache namespace


class ChatCompletionRequest(_Common, kw_only=True):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None


class CompletionRequest(_Common, kw_only=True):
    prompt: str | list[str | int]  # text, [text], or token ids (msgspec allows one list type)


def decode_body(body: bytes, kind: type[msgspec.Struct]):
    """Parse JSON into ``kind``; malformed JSON or wrong types -> 400 naming the field."""
    from trillium.server.errors import from_validation_error

    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:  # before DecodeError: it is a subclass
        raise from_validation_error(exc) from None
    except msgspec.DecodeError as exc:
        raise APIError(f"request body is not valid JSON: {exc}", code="invalid_json") from None


def chat_messages(request: ChatCompletionRequest) -> list[dict]:
    """Messages as plain dicts for the chat template; text parts are joined."""
    if not request.messages:
        raise APIError("messages must contain at least one message", param="messages")
    out = []
    for i, m in enumerate(request.messages):
        if m.role not in ("system", "user", "assistant", "tool", "developer"):
            raise APIError(f"unknown role {m.role!r}", param=f"messages[{i}].role")
        content = m.content
        if isinstance(content, list):
            if any(p.type != "text" for p in content):
                raise APIError("only text content parts are supported", param=f"messages[{i}].content")
            content = "".join(p.text or "" for p in content)
        out.append({"role": "system" if m.role == "developer" else m.role, "content": content or ""})
    return out


def sampling_params(request: _Common, max_tokens: int | None, default_max_tokens: int | None) -> SamplingParams:
    """Range-check the request's sampling fields and build :class:`SamplingParams`."""
    if request.n != 1:
        raise APIError("only n=1 is supported", param="n")
    if max_tokens is not None and max_tokens < 1:
        raise APIError(f"max_tokens must be at least 1, got {max_tokens}", param="max_tokens")
    temperature = 1.0 if request.temperature is None else request.temperature
    if not 0.0 <= temperature <= 2.0:
        raise APIError(f"temperature must be between 0 and 2, got {temperature}", param="temperature")
    top_p = 1.0 if request.top_p is None else request.top_p
    if not 0.0 < top_p <= 1.0:
        raise APIError(f"top_p must be in (0, 1], got {top_p}", param="top_p")
    top_k = -1 if request.top_k is None else request.top_k
    if top_k == 0 or top_k < -1:
        raise APIError(f"top_k must be -1 (disabled) or at least 1, got {top_k}", param="top_k")
    stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    if len(stop) > MAX_STOP_STRINGS:
        raise APIError(f"at most {MAX_STOP_STRINGS} stop strings are allowed", param="stop")
    return SamplingParams(
        max_tokens=max_tokens if max_tokens is not None else default_max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=request.seed,
        stop=stop,
        stop_token_ids=list(request.stop_token_ids or []),
        ignore_eos=request.ignore_eos,
        skip_special_tokens=request.skip_special_tokens,
    )
