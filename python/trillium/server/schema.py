"""OpenAI request bodies as msgspec Structs, and their translation into :class:`SamplingParams`.

Unknown fields are ignored (clients send many); known fields are type-checked by msgspec
and range-checked here, each failure naming its field.
"""

from __future__ import annotations

from typing import Any

import msgspec

from trillium.protocol import SamplingParams, StructuredOutputs
from trillium.server.errors import APIError

MAX_STOP_STRINGS = 16
MAX_N = 16
MAX_TOP_LOGPROBS = 20
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's limit for legacy completions


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


class ContentPart(msgspec.Struct):
    type: str
    text: str | None = None


class ChatMessage(msgspec.Struct):
    role: str
    content: str | list[ContentPart] | None = None


class JSONSchemaFormat(msgspec.Struct, kw_only=True):
    """OpenAI ``response_format.json_schema``. ``strict`` is accepted; the schema is always enforced."""

    name: str | None = None
    description: str | None = None
    schema_: Any = msgspec.field(default=None, name="schema")
    strict: bool | None = None


class ResponseFormat(msgspec.Struct, kw_only=True):
    """OpenAI ``response_format``: ``text``, ``json_object`` or ``json_schema``."""

    type: str
    json_schema: JSONSchemaFormat | None = None


class StructuredOutputsBody(StructuredOutputs, kw_only=True, forbid_unknown_fields=True):
    """vLLM's ``structured_outputs``; the two flags are accepted because they describe what we always
    do (no fallback engine, no free whitespace in JSON). Any other unknown field is a 400."""

    disable_fallback: bool = False
    disable_any_whitespace: bool = False


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
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None  # token id (as a JSON key) -> bias
    min_p: float | None = None  # vLLM extension
    repetition_penalty: float | None = None  # vLLM extension
    min_tokens: int = 0  # vLLM extension
    cache_salt: str | None = None  # vLLM extension: a tenant's private prefix-cache namespace
    response_format: ResponseFormat | None = None  # OpenAI structured output
    structured_outputs: StructuredOutputsBody | None = None  # vLLM structured output


class ChatCompletionRequest(_Common, kw_only=True):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None


class CompletionRequest(_Common, kw_only=True):
    prompt: str | list[str | int]  # text, [text], or token ids (msgspec allows one list type)
    logprobs: int | None = None
    echo: bool | None = False
    suffix: str | None = None


class TokenizeBody(msgspec.Struct, kw_only=True):
    """vLLM's ``POST /tokenize``: a raw prompt or chat messages."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeBody(msgspec.Struct, kw_only=True):
    model: str | None = None
    tokens: list[int]


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


def sampling_params(request: _Common, max_tokens: int | None, default_max_tokens: int | None,
                    *, vocab_size: int, logprobs: int | None = None) -> SamplingParams:
    """Range-check the request's sampling fields and build :class:`SamplingParams`."""
    if not 1 <= request.n <= MAX_N:
        raise APIError(f"n must be between 1 and {MAX_N}, got {request.n}", param="n")
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
    min_p = 0.0 if request.min_p is None else request.min_p
    if not 0.0 <= min_p <= 1.0:
        raise APIError(f"min_p must be in [0, 1], got {min_p}", param="min_p")
    penalties = {}
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(request, name)
        value = 0.0 if value is None else value
        if not -2.0 <= value <= 2.0:
            raise APIError(f"{name} must be between -2 and 2, got {value}", param=name)
        penalties[name] = value
    repetition_penalty = 1.0 if request.repetition_penalty is None else request.repetition_penalty
    if repetition_penalty <= 0.0:
        raise APIError(f"repetition_penalty must be greater than 0, got {repetition_penalty}",
                       param="repetition_penalty")
    if request.min_tokens < 0 or (max_tokens is not None and request.min_tokens > max_tokens):
        raise APIError(f"min_tokens must be between 0 and max_tokens, got {request.min_tokens}", param="min_tokens")
    stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    if len(stop) > MAX_STOP_STRINGS:
        raise APIError(f"at most {MAX_STOP_STRINGS} stop strings are allowed", param="stop")
    stop_token_ids = list(request.stop_token_ids or [])
    if any(not 0 <= t < vocab_size for t in stop_token_ids):
        raise APIError(f"stop_token_ids must be in [0, {vocab_size})", param="stop_token_ids")
    return SamplingParams(
        max_tokens=max_tokens if max_tokens is not None else default_max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        seed=request.seed,
        stop=stop,
        stop_token_ids=stop_token_ids,
        ignore_eos=request.ignore_eos,
        skip_special_tokens=request.skip_special_tokens,
        repetition_penalty=repetition_penalty,
        logit_bias=_logit_bias(request.logit_bias, vocab_size),
        min_tokens=request.min_tokens,
        logprobs=logprobs,
        structured=structured_constraint(request),
        **penalties,
    )


_STRUCTURED_FIELDS = ("json", "regex", "choice", "grammar", "json_object")


def structured_constraint(request: _Common) -> StructuredOutputs | None:
    """The output constraint of ``response_format`` or ``structured_outputs`` (not both), or None.
    Only the shape is checked here; the grammar actor compiles it (and names what is wrong)."""
    rf, so = request.response_format, request.structured_outputs
    if rf is not None and rf.type != "text" and so is not None:
        raise APIError("response_format and structured_outputs cannot be used together", param="structured_outputs")
    if so is not None:
        fields = [f for f in _STRUCTURED_FIELDS if getattr(so, f) not in (None, False)]
        if len(fields) != 1:
            raise APIError("structured_outputs needs exactly one of json, regex, choice, grammar, json_object; got "
                           f"{fields or 'none'}", param="structured_outputs")
        return StructuredOutputs(json=so.json, regex=so.regex, choice=so.choice, grammar=so.grammar,
                                 json_object=so.json_object)
    if rf is None or rf.type == "text":
        return None
    if rf.type == "json_object":
        return StructuredOutputs(json_object=True)
    if rf.type == "json_schema":
        if rf.json_schema is None or rf.json_schema.schema_ is None:
            raise APIError("response_format.json_schema.schema is required", param="response_format.json_schema.schema")
        return StructuredOutputs(json=rf.json_schema.schema_)
    raise APIError(f"response_format.type must be text, json_object or json_schema, got {rf.type!r}",
                   param="response_format.type")


def structured_param(request: _Common) -> str:
    """The request field a compile error of :func:`structured_constraint`'s result points at."""
    so = request.structured_outputs
    if so is not None:
        kind = next(f for f in _STRUCTURED_FIELDS if getattr(so, f) not in (None, False))
        return f"structured_outputs.{kind}"
    return "response_format.json_schema.schema" if request.response_format.type == "json_schema" else "response_format"


def chat_logprobs(request: ChatCompletionRequest) -> int | None:
    """``logprobs: true`` + ``top_logprobs`` -> how many alternatives to return (None: off)."""
    if request.top_logprobs is not None:
        if not 0 <= request.top_logprobs <= MAX_TOP_LOGPROBS:
            raise APIError(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {request.top_logprobs}",
                           param="top_logprobs")
        if not request.logprobs:
            raise APIError("top_logprobs requires logprobs to be true", param="top_logprobs")
    return (request.top_logprobs or 0) if request.logprobs else None


def completion_logprobs(request: CompletionRequest) -> int | None:
    if request.logprobs is not None and not 0 <= request.logprobs <= MAX_COMPLETION_LOGPROBS:
        raise APIError(f"logprobs must be between 0 and {MAX_COMPLETION_LOGPROBS}, got {request.logprobs}",
                       param="logprobs")
    return request.logprobs


def _logit_bias(bias: dict[str, float] | None, vocab_size: int) -> dict[int, float]:
    out: dict[int, float] = {}
    for key, value in (bias or {}).items():
        try:
            token_id = int(key)
        except ValueError:
            raise APIError(f"logit_bias keys must be token ids, got {key!r}", param="logit_bias") from None
        if not 0 <= token_id < vocab_size:
            raise APIError(f"logit_bias token id {token_id} is outside the vocabulary [0, {vocab_size})",
                           param="logit_bias")
        if not -100.0 <= value <= 100.0:
            raise APIError(f"logit_bias values must be between -100 and 100, got {value}", param="logit_bias")
        out[token_id] = float(value)
    return out
