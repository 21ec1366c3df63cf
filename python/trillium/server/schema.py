"""OpenAI request bodies as msgspec Structs, and their translation into :class:`SamplingParams`.

Unknown fields are ignored (clients send many); known fields are type-checked by msgspec
and range-checked here, each failure naming its field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

import msgspec

from trillium.protocol import SamplingParamError, SamplingParams, StructuredOutputs
from trillium.protocol.messages import MAX_LOGPROBS
from trillium.server.errors import APIError
from trillium.tools import FunctionTool, ToolChoice, ToolSpecError

_S = TypeVar("_S", bound=msgspec.Struct)

MAX_N = 16
MAX_TOP_LOGPROBS = MAX_LOGPROBS
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's limit for legacy completions
PRIORITY_MIN, PRIORITY_MAX = -(2**31), 2**31 - 1  # vLLM's ``priority``, bounded to 32 bits

# Constraints msgspec checks while decoding; they are also the OpenAPI document's (server/openapi.py).
Role = Literal["system", "user", "assistant", "tool", "developer"]  # developer is rendered as system
NonEmptyStr = Annotated[str, msgspec.Meta(min_length=1)]
TokenId = Annotated[int, msgspec.Meta(ge=0)]  # and below the vocabulary size, checked by the route


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


class ContentPart(msgspec.Struct):
    type: str
    text: str | None = None


class FunctionCallBody(msgspec.Struct, kw_only=True):
    name: str
    arguments: str = "{}"  # JSON text of an object, as OpenAI sends it


class ToolCallBody(msgspec.Struct, kw_only=True):
    """An earlier call in an assistant message of the history."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCallBody


class ChatMessage(msgspec.Struct, kw_only=True):
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallBody] | None = None  # assistant messages only
    tool_call_id: str | None = None  # tool messages: the call this result answers


class FunctionDefinition(msgspec.Struct, kw_only=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # JSON Schema of the arguments (an object)
    strict: bool | None = None  # accepted; arguments always follow the schema when calls are constrained


class ToolBody(msgspec.Struct, kw_only=True):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(msgspec.Struct, kw_only=True):
    name: str


class NamedToolChoice(msgspec.Struct, kw_only=True):
    type: Literal["function"]
    function: NamedFunction


class JSONSchemaFormat(msgspec.Struct, kw_only=True):
    """OpenAI ``response_format.json_schema``. ``strict`` is accepted; the schema is always enforced."""

    name: str | None = None
    description: str | None = None
    schema_: Any = msgspec.field(default=None, name="schema")
    strict: bool | None = None


class ResponseFormat(msgspec.Struct, kw_only=True):
    """OpenAI ``response_format``: ``text``, ``json_object`` or ``json_schema``."""

    type: Literal["text", "json_object", "json_schema"]
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
    priority: int = 0  # vLLM extension: inside the caller's tenant, lower is scheduled sooner
    response_format: ResponseFormat | None = None  # OpenAI structured output
    structured_outputs: StructuredOutputsBody | None = None  # vLLM structured output
    prompt_logprobs: int | None = None  # vLLM extension: each prompt token's logprob + the top k
    close_structured_output: bool = True  # trillium extension: close JSON output before max_tokens cuts it


class ChatCompletionRequest(_Common, kw_only=True):
    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1)]
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    tools: list[ToolBody] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None  # default: auto with tools
    parallel_tool_calls: bool = True
    # vLLM's extension: more variables for the chat template (``{"enable_thinking": false}``)
    chat_template_kwargs: dict[str, Any] | None = None


class CompletionRequest(_Common, kw_only=True):
    # text, [text, ...], token ids, or [token ids, ...]; a list holds one kind (checked by the route)
    prompt: (
        NonEmptyStr
        | Annotated[
            list[NonEmptyStr | TokenId | Annotated[list[TokenId], msgspec.Meta(min_length=1)]],
            msgspec.Meta(min_length=1),
        ]
    )
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
    chat_template_kwargs: dict[str, Any] | None = None  # as in a chat request


class DetokenizeBody(msgspec.Struct, kw_only=True):
    model: str | None = None
    tokens: list[TokenId]


def decode_body(body: bytes, kind: type[_S]) -> _S:
    """Parse JSON into ``kind``; malformed JSON or wrong types -> 400 naming the field.

    Invalid UTF-8 and lone surrogate escapes are malformed JSON here. Nesting deeper than
    msgspec's stack guard (~1000 levels, even in ignored fields) is a 400; shallower nesting
    only matters in untyped fields, which ``InputLimits.check_structured`` measures."""
    from trillium.server.errors import from_validation_error

    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:  # before DecodeError: it is a subclass
        raise from_validation_error(exc) from None
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise APIError(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:
        raise APIError("request body nests too deeply to parse", code="invalid_json") from None


def chat_messages(request: ChatCompletionRequest) -> list[dict[str, Any]]:
    """Messages as plain dicts for the chat template; text parts are joined. An assistant turn's
    ``tool_calls`` and a tool turn's ``tool_call_id`` are kept (``tools/prompt.py`` renders them)."""
    if not request.messages:
        raise APIError("messages must contain at least one message", param="messages")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(request.messages):
        content = m.content
        if isinstance(content, list):
            if any(p.type != "text" for p in content):
                raise APIError("only text content parts are supported", param=f"messages[{i}].content")
            content = "".join(p.text or "" for p in content)
        message: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": content or ""}
        if m.tool_calls:
            if m.role != "assistant":
                raise APIError("only assistant messages carry tool_calls", param=f"messages[{i}].tool_calls")
            message["tool_calls"] = [
                {
                    "id": c.id or f"call_{i}_{j}",
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": c.function.arguments},
                }
                for j, c in enumerate(m.tool_calls)
            ]
        if m.role == "tool" and m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        if m.name is not None:
            message["name"] = m.name
        out.append(message)
    return out


# What the chat template is given by the server itself: a request's variables may not replace them.
_TEMPLATE_ARGUMENTS = ("messages", "tools", "add_generation_prompt", "bos_token", "eos_token")


def chat_template_kwargs(request: ChatCompletionRequest | TokenizeBody) -> dict[str, Any] | None:
    """The request's ``chat_template_kwargs`` (its type, an object, is checked while decoding),
    or None; 400 naming the key that would replace one of the template's own arguments."""
    kwargs = request.chat_template_kwargs
    for key in kwargs or {}:
        if key in _TEMPLATE_ARGUMENTS:
            raise APIError(
                f"chat_template_kwargs may not set {key!r}: the server renders it from the request",
                param=f"chat_template_kwargs.{key}",
            )
    return kwargs or None


def chat_tools(request: ChatCompletionRequest) -> tuple[list[FunctionTool], ToolChoice]:
    """The request's function tools and tool choice (OpenAI's default: ``auto`` with tools,
    ``none`` without)."""
    try:
        tools = [
            FunctionTool(
                t.function.name,
                t.function.description,
                t.function.parameters if t.function.parameters is not None else {"type": "object", "properties": {}},
            )
            for t in request.tools or []
        ]
        if len({t.name for t in tools}) != len(tools):
            raise ToolSpecError("tools", "function names must be unique")
        raw = request.tool_choice
        if raw is None:
            choice = ToolChoice("auto" if tools else "none")
        elif isinstance(raw, NamedToolChoice):
            choice = ToolChoice("function", raw.function.name)
        else:
            choice = ToolChoice(raw)
        choice.check(tools)
    except ToolSpecError as exc:
        raise APIError(str(exc), param=exc.param) from None
    return tools, choice


def sampling_params(
    request: _Common,
    max_tokens: int | None,
    default_max_tokens: int | None,
    *,
    vocab_size: int,
    logprobs: int | None = None,
    prompt_logprobs: int | None = None,
) -> SamplingParams:
    """Build :class:`SamplingParams` from the request; its ranges are checked there, once, and a
    bad value becomes a 400 naming the field. Only request-shape checks live here."""
    if not 1 <= request.n <= MAX_N:
        raise APIError(f"n must be between 1 and {MAX_N}, got {request.n}", param="n")
    if not PRIORITY_MIN <= request.priority <= PRIORITY_MAX:
        raise APIError(
            f"priority must be between {PRIORITY_MIN} and {PRIORITY_MAX}, got {request.priority}", param="priority"
        )
    if request.stream_options is not None and not request.stream:
        raise APIError("stream_options is only allowed when stream is true", param="stream_options")
    stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])

    def given(value: Any, default: Any) -> Any:
        return default if value is None else value

    try:
        sampling = SamplingParams(
            max_tokens=max_tokens if max_tokens is not None else default_max_tokens,
            temperature=given(request.temperature, 1.0),
            top_p=given(request.top_p, 1.0),
            top_k=given(request.top_k, -1),
            min_p=given(request.min_p, 0.0),
            seed=request.seed,
            stop=stop,
            stop_token_ids=list(request.stop_token_ids or []),
            ignore_eos=request.ignore_eos,
            skip_special_tokens=request.skip_special_tokens,
            presence_penalty=given(request.presence_penalty, 0.0),
            frequency_penalty=given(request.frequency_penalty, 0.0),
            repetition_penalty=given(request.repetition_penalty, 1.0),
            logit_bias=_logit_bias(request.logit_bias),
            min_tokens=request.min_tokens,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            structured=structured_constraint(request),
            close_structured_output=request.close_structured_output,
        )
        sampling.check_vocab(vocab_size)
    except SamplingParamError as exc:
        raise APIError(str(exc), param=exc.param) from None
    return sampling


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
            raise APIError(
                "structured_outputs needs exactly one of json, regex, choice, grammar, json_object; got "
                f"{fields or 'none'}",
                param="structured_outputs",
            )
        return StructuredOutputs(
            json=so.json, regex=so.regex, choice=so.choice, grammar=so.grammar, json_object=so.json_object
        )
    if rf is None or rf.type == "text":
        return None
    if rf.type == "json_object":
        return StructuredOutputs(json_object=True)
    if rf.type == "json_schema":
        if rf.json_schema is None or rf.json_schema.schema_ is None:
            raise APIError("response_format.json_schema.schema is required", param="response_format.json_schema.schema")
        return StructuredOutputs(json=rf.json_schema.schema_)
    raise APIError(
        f"response_format.type must be text, json_object or json_schema, got {rf.type!r}", param="response_format.type"
    )


def structured_param(request: _Common) -> str:
    """The request field a compile error of the request's constraint points at: the field of
    :func:`structured_constraint`'s result, else ``tools`` (the tool-call grammar)."""
    so = request.structured_outputs
    if so is not None:
        kind = next(f for f in _STRUCTURED_FIELDS if getattr(so, f) not in (None, False))
        return f"structured_outputs.{kind}"
    rf = request.response_format
    if rf is None or rf.type == "text":
        return "tools"  # a chat request's tool-call grammar
    return "response_format.json_schema.schema" if rf.type == "json_schema" else "response_format"


def chat_logprobs(request: ChatCompletionRequest) -> int | None:
    """``logprobs: true`` + ``top_logprobs`` -> how many alternatives to return (None: off)."""
    if request.top_logprobs is not None:
        if not 0 <= request.top_logprobs <= MAX_TOP_LOGPROBS:
            raise APIError(
                f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {request.top_logprobs}",
                param="top_logprobs",
            )
        if not request.logprobs:
            raise APIError("top_logprobs requires logprobs to be true", param="top_logprobs")
    return (request.top_logprobs or 0) if request.logprobs else None


def completion_logprobs(request: CompletionRequest) -> int | None:
    if request.logprobs is not None and not 0 <= request.logprobs <= MAX_COMPLETION_LOGPROBS:
        raise APIError(
            f"logprobs must be between 0 and {MAX_COMPLETION_LOGPROBS}, got {request.logprobs}", param="logprobs"
        )
    return request.logprobs


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float]:
    """JSON object keys are strings: parse them as token ids (ranges: SamplingParams)."""
    out: dict[int, float] = {}
    for key, value in (bias or {}).items():
        try:
            out[int(key)] = float(value)
        except ValueError:
            raise APIError(f"logit_bias keys must be token ids, got {key!r}", param="logit_bias") from None
    return out
