"""Anthropic's Messages API as msgspec Structs: the request bodies of ``POST /v1/messages`` and
``POST /v1/messages/count_tokens`` (decoded by the routes, ``messages.py``), and the response
bodies, for the OpenAPI document only (the builder, ``anthropic_builder.py``, writes dicts on the
hot path; the fuzz test checks them against these).

Unknown fields are ignored, as on every route (clients send many: ``service_tier``, ``container``,
a text block's ``citations``, a top-level ``cache_control``, ...). ``cache_control`` is accepted on
every block and tool: the prefix cache reuses any prompt's cached prefix without breakpoints.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

# Anthropic's own rule for tool names.
ToolName = Annotated[str, msgspec.Meta(pattern="^[a-zA-Z0-9_-]{1,128}$")]
StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class CacheControl(msgspec.Struct, kw_only=True):
    """A prompt-caching breakpoint; accepted and not needed (every prefix is cached)."""

    type: str = "ephemeral"
    ttl: str | None = None


# ---- request ------------------------------------------------------------------------------------


class TextBlock(msgspec.Struct, kw_only=True, tag_field="type", tag="text"):
    text: str
    cache_control: CacheControl | None = None


class TextPart(msgspec.Struct, kw_only=True):
    """A text block where only text goes (the system prompt, a tool result's content). Not the
    tagged :class:`TextBlock`: msgspec requires a tag only to tell a union's members apart."""

    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None


class ToolUseBlock(msgspec.Struct, kw_only=True, tag_field="type", tag="tool_use"):
    """An earlier call, in an assistant turn of the history."""

    id: str
    name: str
    input: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolResultBlock(msgspec.Struct, kw_only=True, tag_field="type", tag="tool_result"):
    """A call's result, in a user turn; ``tool_use_id`` names the call."""

    tool_use_id: str
    content: str | list[TextPart] = ""
    is_error: bool = False
    cache_control: CacheControl | None = None


class ThinkingBlock(msgspec.Struct, kw_only=True, tag_field="type", tag="thinking"):
    """An assistant turn's reasoning, handed back in the history: accepted, left out of the prompt
    (as reasoning models' chat templates drop earlier turns' reasoning)."""

    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(msgspec.Struct, kw_only=True, tag_field="type", tag="redacted_thinking"):
    data: str


ContentBlock = TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock


class InputMessage(msgspec.Struct, kw_only=True):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class AnthropicTool(msgspec.Struct, kw_only=True):
    """A client tool. Anthropic's server tools (``web_search_...``, ``bash_...``: a ``type`` other
    than ``custom``) are refused by the route, naming the tool."""

    name: ToolName
    description: str | None = None
    input_schema: dict[str, Any] | None = None  # required for a client tool (checked by the route)
    type: str | None = None
    cache_control: CacheControl | None = None


class AnthropicToolChoice(msgspec.Struct, kw_only=True):
    """``auto`` (the default with tools), ``any`` (some tool), ``tool`` (the one named), ``none``."""

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None  # with ``tool``
    disable_parallel_tool_use: bool = False


class AnthropicMetadata(msgspec.Struct, kw_only=True):
    user_id: str | None = None  # an open server's fair-share tenant, as chat's ``user``


class ThinkingConfig(msgspec.Struct, kw_only=True):
    """Extended thinking: ``enabled`` / ``disabled`` become the chat template's ``enable_thinking``
    (Qwen3's switch; templates without it ignore it), ``adaptive`` leaves the template's default.
    ``budget_tokens`` is accepted and not enforced (``max_tokens`` bounds the whole output)."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None


class JSONOutputFormat(msgspec.Struct, kw_only=True):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = msgspec.field(name="schema")


class OutputConfig(msgspec.Struct, kw_only=True):
    """Structured output (``format``: the text is JSON valid against its schema, as chat's
    ``response_format``); ``effort`` is accepted and has no effect."""

    format: JSONOutputFormat | None = None
    effort: str | None = None


class CountTokensRequest(msgspec.Struct, kw_only=True):
    """``POST /v1/messages/count_tokens``: what makes up a prompt."""

    model: str  # any name starting with "claude", or the served model's
    messages: Annotated[list[InputMessage], msgspec.Meta(min_length=1)]
    system: str | list[TextPart] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    thinking: ThinkingConfig | None = None


class MessagesRequest(CountTokensRequest, kw_only=True):
    """``POST /v1/messages``."""

    max_tokens: Annotated[int, msgspec.Meta(ge=0)]  # 0: fill the prefix cache with the prompt, generate nothing
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool = False
    metadata: AnthropicMetadata | None = None
    output_config: OutputConfig | None = None


# ---- response (OpenAPI document) -----------------------------------------------------------------


class OutputTokensDetails(msgspec.Struct, kw_only=True):
    thinking_tokens: int  # of output_tokens, those in thinking blocks


class AnthropicUsage(msgspec.Struct, kw_only=True):
    """``input_tokens`` + ``cache_read_input_tokens`` is the prompt (Anthropic counts them apart)."""

    input_tokens: int  # prompt tokens not served from the prefix cache
    output_tokens: int
    cache_read_input_tokens: int  # prompt tokens served from the prefix cache
    cache_creation_input_tokens: int  # always 0: caching costs nothing extra here
    output_tokens_details: OutputTokensDetails | None = None  # under --reasoning-parser


class AnthropicBlock(msgspec.Struct, kw_only=True):
    """A ``text`` block (``text``), a ``tool_use`` block (``id``, ``name``, ``input``) or a
    ``thinking`` block (``thinking``, ``signature``)."""

    type: Literal["text", "tool_use", "thinking"]
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    thinking: str | None = None
    signature: str | None = None


class AnthropicMessage(msgspec.Struct, kw_only=True):
    id: str  # msg_...
    type: Literal["message"]
    role: Literal["assistant"]
    content: list[AnthropicBlock]
    model: str  # the name the request gave
    stop_reason: StopReason | None  # None only in ``message_start``
    stop_sequence: str | None  # the one of ``stop_sequences`` that ended it
    usage: AnthropicUsage


class AnthropicDelta(msgspec.Struct, kw_only=True):
    """``content_block_delta``'s ``delta`` (``text_delta``, ``input_json_delta``, ``thinking_delta``)
    or ``message_delta``'s (``stop_reason``, ``stop_sequence``)."""

    type: Literal["text_delta", "input_json_delta", "thinking_delta", "signature_delta"] | None = None
    text: str | None = None
    partial_json: str | None = None
    thinking: str | None = None
    signature: str | None = None
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None


class AnthropicErrorDetail(msgspec.Struct, kw_only=True):
    type: Literal[
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "request_too_large",
        "rate_limit_error",
        "api_error",
        "overloaded_error",
    ]
    message: str  # names the request field at fault, if one is


class AnthropicErrorResponse(msgspec.Struct, kw_only=True):
    """Every 4xx/5xx body of the Messages routes; a stream that fails sends it as an ``error`` event."""

    type: Literal["error"]
    error: AnthropicErrorDetail


class AnthropicStreamEvent(msgspec.Struct, kw_only=True):
    """One SSE event (its ``event:`` name is its ``type``): ``message_start``, then per content block
    ``content_block_start``, ``content_block_delta``..., ``content_block_stop``, then
    ``message_delta`` (stop reason, final usage) and ``message_stop``; ``error`` if generation failed."""

    type: Literal[
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
        "ping",
        "error",
    ]
    message: AnthropicMessage | None = None
    index: int | None = None
    content_block: AnthropicBlock | None = None
    delta: AnthropicDelta | None = None
    usage: AnthropicUsage | None = None
    error: AnthropicErrorDetail | None = None


class AnthropicTokenCount(msgspec.Struct, kw_only=True):
    input_tokens: int  # the prompt the same request would run, chat template and tools included
