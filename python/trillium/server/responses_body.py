"""OpenAI's Responses API request (``POST /v1/responses``) and its translation into a chat
completion request, which the chat route's checks, tokenizing and tool calling then serve.

What the Responses API has and trillium does not (background runs, reasoning settings, built-in
tools, ``include``, stored prompts, conversations, truncation) is a 400 naming the field.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from trillium.server.errors import APIError
from trillium.server.schema import (
    ChatCompletionRequest,
    ChatMessage,
    FunctionCallBody,
    FunctionDefinition,
    JSONSchemaFormat,
    NamedFunction,
    NamedToolChoice,
    ResponseFormat,
    Role,
    ToolBody,
    ToolCallBody,
)


class InputPart(msgspec.Struct, kw_only=True):
    type: str  # input_text / output_text (text); anything else is refused
    text: str | None = None


class InputItem(msgspec.Struct, kw_only=True):
    """One item of ``input``: a message, an earlier ``function_call`` or a ``function_call_output``,
    or an earlier ``reasoning`` item (a client hands a response's output back whole; a thinking
    model's template leaves earlier turns' reasoning out, so it is skipped)."""

    type: Literal["message", "function_call", "function_call_output", "reasoning"] = "message"
    role: Role | None = None
    content: str | list[InputPart] | None = None
    id: str | None = None
    status: str | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | None = None


class ResponsesTool(msgspec.Struct, kw_only=True):
    type: str  # "function"; built-in tools (web_search, file_search, ...) are refused
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class TextFormat(msgspec.Struct, kw_only=True):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: Any = msgspec.field(default=None, name="schema")
    strict: bool | None = None


class TextConfig(msgspec.Struct, kw_only=True):
    format: TextFormat | None = None


class NamedFunctionChoice(msgspec.Struct, kw_only=True):
    type: Literal["function"]
    name: str


class ResponsesRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    text: TextConfig | None = None
    tools: list[ResponsesTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    store: bool = True  # kept in this server's memory (bounded: server/response_store.py)
    metadata: dict[str, str] | None = None
    user: str | None = None
    seed: int | None = None  # vLLM extension
    top_k: int | None = None  # vLLM extension
    # Known and not supported: set (to anything but their neutral value) -> 400.
    background: bool | None = None
    reasoning: Any = None
    include: list[str] | None = None
    prompt: Any = None
    conversation: Any = None
    truncation: str | None = None
    top_logprobs: int | None = None
    max_tool_calls: int | None = None


def check_supported(body: ResponsesRequest) -> None:
    """400 for a Responses feature this server does not have, naming the field."""
    refused = {
        "background": body.background,
        "reasoning": body.reasoning,
        "include": body.include or None,
        "prompt": body.prompt,
        "conversation": body.conversation,
        "top_logprobs": body.top_logprobs,
        "max_tool_calls": body.max_tool_calls,
    }
    for field, value in refused.items():
        if value not in (None, False):
            raise APIError(f"{field} is not supported by this server", param=field, code="unsupported_parameter")
    if body.truncation not in (None, "disabled"):
        raise APIError(
            'truncation is not supported (only "disabled")', param="truncation", code="unsupported_parameter"
        )
    for i, tool in enumerate(body.tools or []):
        if tool.type != "function":
            raise APIError(
                f"tool type {tool.type!r} is not supported (only function tools)",
                param=f"tools[{i}].type",
                code="unsupported_parameter",
            )
        if not tool.name:
            raise APIError("function tools need a name", param=f"tools[{i}].name")


def input_messages(body: ResponsesRequest) -> list[ChatMessage]:
    """``input`` as chat messages: text messages, earlier calls as assistant ``tool_calls`` (calls
    in a row share one assistant turn), their outputs as ``tool`` messages."""
    if isinstance(body.input, str):
        return [ChatMessage(role="user", content=body.input)]
    out: list[ChatMessage] = []
    for i, item in enumerate(body.input):
        if item.type == "reasoning":
            continue
        if item.type == "function_call":
            if not item.name or item.call_id is None:
                raise APIError("a function_call item needs call_id and name", param=f"input[{i}]")
            call = ToolCallBody(
                id=item.call_id, function=FunctionCallBody(name=item.name, arguments=item.arguments or "{}")
            )
            last = out[-1] if out else None
            if last is not None and last.role == "assistant" and last.tool_calls is not None:
                last.tool_calls.append(call)
            else:
                out.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))
        elif item.type == "function_call_output":
            if item.call_id is None:
                raise APIError("a function_call_output item needs call_id", param=f"input[{i}].call_id")
            out.append(ChatMessage(role="tool", content=item.output or "", tool_call_id=item.call_id))
        else:
            if item.role is None:
                raise APIError("a message item needs a role", param=f"input[{i}].role")
            out.append(ChatMessage(role=item.role, content=_text(item, i)))
    return out


def _text(item: InputItem, index: int) -> str:
    if item.content is None or isinstance(item.content, str):
        return item.content or ""
    for j, part in enumerate(item.content):
        if part.type not in ("input_text", "output_text", "text"):
            raise APIError(
                f"content part type {part.type!r} is not supported (text only)",
                param=f"input[{index}].content[{j}].type",
                code="unsupported_parameter",
            )
    return "".join(p.text or "" for p in item.content)


def chat_request(body: ResponsesRequest, history: list[ChatMessage]) -> ChatCompletionRequest:
    """The chat completion request that serves ``body``: ``instructions`` as the system message
    (not carried over from ``previous_response_id``, as in OpenAI's API), then the stored
    conversation ``history``, then this request's ``input``."""
    messages = [ChatMessage(role="system", content=body.instructions)] if body.instructions else []
    messages += history + input_messages(body)
    fmt = body.text.format if body.text is not None else None
    response_format = None
    if fmt is not None and fmt.type != "text":
        schema = JSONSchemaFormat(name=fmt.name, description=fmt.description, schema_=fmt.schema_, strict=fmt.strict)
        response_format = ResponseFormat(type=fmt.type, json_schema=schema if fmt.type == "json_schema" else None)
    tools = [
        ToolBody(
            type="function",
            function=FunctionDefinition(
                name=t.name or "", description=t.description, parameters=t.parameters, strict=t.strict
            ),
        )
        for t in body.tools or []
    ]
    choice = body.tool_choice
    tool_choice = (
        NamedToolChoice(type="function", function=NamedFunction(name=choice.name))
        if isinstance(choice, NamedFunctionChoice)
        else choice
    )
    return ChatCompletionRequest(
        model=body.model,
        messages=messages,
        max_tokens=body.max_output_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        seed=body.seed,
        user=body.user,
        stream=body.stream,
        response_format=response_format,
        tools=tools or None,
        tool_choice=tool_choice,
        parallel_tool_calls=body.parallel_tool_calls,
    )
