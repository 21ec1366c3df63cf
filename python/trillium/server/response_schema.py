"""Response bodies as msgspec Structs, for the OpenAPI document only (``server/openapi.py``).

The routes build these bodies as dicts (``openai_shapes.py``, ``routes.py``), on the hot path;
these Structs describe them. They cannot drift unnoticed: the fuzz test
(``tests/integration/test_openapi_fuzz.py``) validates every response the server gives against
the schema generated from here. A field with a default is one the server may leave out.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from trillium.protocol.usage import TenantUsage

# Generation ends with one of these; an aborted or failed request is an error response instead.
FinishReasonName = Literal["stop", "length", "tool_calls"]


class ErrorDetail(msgspec.Struct, kw_only=True):
    message: str
    type: str  # invalid_request_error, NotFoundError, server_overloaded, internal_error, ...
    param: str | None  # the offending request field, e.g. "messages[0].role"
    code: str | None  # machine-readable: invalid_value, context_length_exceeded, ...


class ErrorResponse(msgspec.Struct, kw_only=True):
    """Every 4xx/5xx JSON body (``server/errors.py``); an SSE stream that fails after its first
    event sends one as its last ``data:`` event."""

    error: ErrorDetail


class PromptTokensDetails(msgspec.Struct, kw_only=True):
    cached_tokens: int  # prompt tokens served from the prefix cache (choice 0)
    cached_tokens_per_choice: list[int] | None = None  # with n > 1 (not OpenAI's)


class CompletionTokensDetails(msgspec.Struct, kw_only=True):
    reasoning_tokens: int  # completion tokens spent reasoning (over all choices)


class Usage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int  # over all choices
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: CompletionTokensDetails | None = None  # chat, with --reasoning-parser


class TopLogprob(msgspec.Struct, kw_only=True):
    token: str
    logprob: float
    bytes: list[int]  # the token's UTF-8 bytes


class TokenLogprob(msgspec.Struct, kw_only=True):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]  # best first


class ChatLogprobs(msgspec.Struct, kw_only=True):
    content: list[TokenLogprob]


class CompletionLogprobs(msgspec.Struct, kw_only=True):
    """The legacy completions shape: parallel lists, one entry per token."""

    tokens: list[str]
    token_logprobs: list[float | None]  # None: the first token of an echoed prompt
    top_logprobs: list[dict[str, float] | None]  # token text -> logprob
    text_offset: list[int]  # where each token starts in the choice's text


class PromptTokenLogprob(msgspec.Struct, kw_only=True):
    logprob: float
    rank: int | None  # 1: the most likely token there; None: not among the top asked for
    decoded_token: str


# vLLM's ``prompt_logprobs``: per prompt position None (the first) or token id -> its logprob
PromptLogprobs = list[dict[str, PromptTokenLogprob] | None]


class FunctionCall(msgspec.Struct, kw_only=True):
    name: str
    arguments: str  # JSON text of an object


class ToolCall(msgspec.Struct, kw_only=True):
    id: str
    type: Literal["function"]
    function: FunctionCall


class AssistantMessage(msgspec.Struct, kw_only=True):
    role: Literal["assistant"]
    content: str | None  # None only next to tool_calls or reasoning_content
    # with --reasoning-parser: the reasoning split off the answer (None: the model did not reason)
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(msgspec.Struct, kw_only=True):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: FinishReasonName


class ChatCompletion(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_logprobs: PromptLogprobs | None = None  # with the request's prompt_logprobs


class FunctionCallDelta(msgspec.Struct, kw_only=True):
    name: str | None = None  # in the call's first delta
    arguments: str


class ToolCallDelta(msgspec.Struct, kw_only=True):
    index: int  # the call's position in the choice's tool_calls
    id: str | None = None  # in the call's first delta
    type: Literal["function"] | None = None
    function: FunctionCallDelta


class ChatDelta(msgspec.Struct, kw_only=True):
    role: Literal["assistant"] | None = None  # in each choice's first chunk
    reasoning_content: str | None = None  # with --reasoning-parser: reasoning text, before any content
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(msgspec.Struct, kw_only=True):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None
    finish_reason: FinishReasonName | None


class ChatCompletionChunk(msgspec.Struct, kw_only=True):
    """One SSE ``data:`` event of a streamed chat completion; the usage chunk (``stream_options.
    include_usage``) has no choices."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    prompt_logprobs: PromptLogprobs | None = None  # in a choice's first chunk, when asked for


class CompletionChoice(msgspec.Struct, kw_only=True):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReasonName | None  # None only in a streamed chunk
    prompt_logprobs: PromptLogprobs | None = None  # with the request's prompt_logprobs (first chunk)


class Completion(msgspec.Struct, kw_only=True):
    """A legacy completion, and (with ``stream``) each SSE ``data:`` event of one."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None  # always in a full response; in the last chunk with include_usage


class Model(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int  # prompt + completion tokens (vLLM's field)


class ModelList(msgspec.Struct, kw_only=True):
    object: Literal["list"]
    data: list[Model]


class TokenizeResponse(msgspec.Struct, kw_only=True):
    count: int
    max_model_len: int
    tokens: list[int]


class RenderedPrompt(msgspec.Struct, kw_only=True):
    """vLLM's render endpoints: the prompt's token ids as the request would run them."""

    model: str
    token_ids: list[int]
    count: int


class DetokenizeResponse(msgspec.Struct, kw_only=True):
    prompt: str


class Load(msgspec.Struct, kw_only=True):
    """``GET /get_load`` (vllm-router's ``power_of_two`` policy reads it): requests running plus
    waiting."""

    load: int


class CacheFlushed(msgspec.Struct, kw_only=True):
    """``POST /flush_cache``: the flush is queued for the scheduler's next turn."""

    status: Literal["flushing"] = "flushing"


class ConfigReloaded(msgspec.Struct, kw_only=True):
    """``POST /v1/admin/reload``: the re-read config is in force for new requests."""

    status: Literal["reloaded"] = "reloaded"
    tenants: int  # tenants in the config now in force
    tls: bool  # the TLS certificate files were loaded again
    warnings: list[str]  # what was not applied (a changed ledger path: needs a restart)


class ServerInfo(msgspec.Struct, kw_only=True):
    """``GET /get_server_info``: what a router or operator needs to know of this worker."""

    engine: Literal["trillium"] = "trillium"
    version: str
    model_id: str
    max_model_len: int
    kv_block_size: int | None = None
    kv_cache_tokens: int | None = None


class Liveness(msgspec.Struct, kw_only=True):
    """``GET /health``: 200 ``ok``, or 503 ``unhealthy`` with the reasons."""

    status: Literal["ok", "unhealthy"]
    reasons: list[str] = []


class Readiness(msgspec.Struct, kw_only=True):
    """``GET /health/ready``: 200 ``ready``, or 503 ``not ready`` (starting, draining, restarting)."""

    status: Literal["ready", "not ready"]
    reasons: list[str] = []


class UsageReport(msgspec.Struct, kw_only=True):
    """``GET /v1/usage``: per-tenant totals of the requests finished in ``[since, until]``."""

    object: Literal["list"]
    since: float | None  # unix time; None: from the first record
    until: float
    data: list[TenantUsage]


class OutputText(msgspec.Struct, kw_only=True):
    """A content part: ``output_text`` of a message, or ``reasoning_text`` of a reasoning item."""

    type: Literal["output_text", "reasoning_text"]
    text: str
    annotations: list[str] | None = None  # output_text only; always empty


class OutputItem(msgspec.Struct, kw_only=True):
    """An item of a response's ``output``: a ``reasoning`` item (``content``, an empty ``summary``;
    with --reasoning-parser), a ``message`` (``role``, ``content``) or a ``function_call``
    (``call_id``, ``name``, ``arguments``)."""

    type: Literal["reasoning", "message", "function_call"]
    id: str
    status: Literal["in_progress", "completed", "incomplete"]
    role: Literal["assistant"] | None = None
    content: list[OutputText] | None = None
    summary: list[dict[str, Any]] | None = None  # reasoning items: always empty
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None


class InputTokensDetails(msgspec.Struct, kw_only=True):
    cached_tokens: int


class OutputTokensDetails(msgspec.Struct, kw_only=True):
    reasoning_tokens: int


class ResponsesUsage(msgspec.Struct, kw_only=True):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(msgspec.Struct, kw_only=True):
    reason: Literal["max_output_tokens"]


class ResponseObject(msgspec.Struct, kw_only=True):
    """A Responses API response (``POST /v1/responses``, ``GET /v1/responses/{response_id}``)."""

    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["in_progress", "completed", "incomplete"]
    error: None
    incomplete_details: IncompleteDetails | None
    model: str
    output: list[OutputItem]
    instructions: str | None
    max_output_tokens: int | None
    temperature: float
    top_p: float
    tool_choice: str | dict[str, str]
    tools: list[dict[str, Any]]
    parallel_tool_calls: bool
    previous_response_id: str | None
    text: dict[str, Any]
    store: bool
    metadata: dict[str, str]
    user: str | None
    usage: ResponsesUsage | None  # None until the response is complete


class ResponseStreamEvent(msgspec.Struct, kw_only=True):
    """One SSE event of a streamed response (the event's name is its ``type``): ``response.created``,
    ``response.in_progress``, ``response.output_item.added``/``.done``, ``response.content_part.added``/
    ``.done``, ``response.reasoning_text.delta``/``.done``, ``response.output_text.delta``/``.done``,
    ``response.function_call_arguments.delta``/``.done``, then ``response.completed`` or
    ``response.incomplete``; ``error`` if generation failed."""

    type: str
    sequence_number: int
    response: ResponseObject | None = None
    output_index: int | None = None
    content_index: int | None = None
    item_id: str | None = None
    item: OutputItem | None = None
    part: OutputText | None = None
    delta: str | None = None
    text: str | None = None
    arguments: str | None = None
    code: str | None = None  # error events
    message: str | None = None


class ResponseDeleted(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["response.deleted"]
    deleted: bool
