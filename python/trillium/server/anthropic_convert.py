"""An Anthropic Messages request as the chat completion request that serves it, whose checks,
chat template, tool calling and engine submission are then the chat route's (``Routes.prepare_chat``).

What maps to what:

- ``system`` (a string or text blocks, concatenated as written) -> the system message;
- a user turn's text blocks -> a user message; its ``tool_result`` blocks -> ``tool`` messages
  (before the text, as Anthropic wants results first);
- an assistant turn's text -> its content, its ``tool_use`` blocks -> its ``tool_calls``; its
  ``thinking`` blocks are dropped (reasoning models' templates drop earlier reasoning too);
- ``tools`` -> function tools, ``tool_choice`` auto/any/tool/none -> auto/required/named/none,
  ``disable_parallel_tool_use`` -> ``parallel_tool_calls: false``;
- ``max_tokens``, ``stop_sequences``, ``temperature``, ``top_p``, ``top_k``, ``metadata.user_id``
  -> ``max_tokens`` (at least 1: the route drops the token a ``max_tokens: 0`` cache warm-up
  makes), ``stop``, the same, the same, the same, ``user``; ``output_config.format`` ->
  ``response_format`` (JSON Schema); ``thinking`` ``enabled`` / ``disabled`` ->
  ``chat_template_kwargs.enable_thinking`` (Qwen3's switch).

Each chat message remembers the Anthropic field it came from, so that an error the chat checks
raise about ``messages[k]`` names the request's own field (:func:`anthropic_params`).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from typing import Any, Literal

from trillium.server.anthropic_shapes import (
    AnthropicTool,
    CountTokensRequest,
    MessagesRequest,
    TextBlock,
    TextPart,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
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
    ToolBody,
    ToolCallBody,
)

# Claude Code puts a per-request hash in a system block that starts with this: metadata for
# Anthropic's billing, not instructions, and it would defeat the prefix cache on every request.
BILLING_HEADER = "x-anthropic-billing-header"

_CHOICES: dict[str, Literal["none", "auto", "required"]] = {"auto": "auto", "any": "required", "none": "none"}
# Chat field -> Messages field, for the errors the chat checks raise (``messages``: ``renamed``).
_FIELDS = {"stop": "stop_sequences", "user": "metadata.user_id", "response_format": "output_config"}
_SUFFIXES = (
    (".function.parameters", ".input_schema"),
    (".function.name", ".name"),
    ("output_config.json_schema", "output_config.format"),
)


def served_model(requested: str, served: str) -> None:
    """Any ``claude...`` name, or the served model's own, is the served model; else APIError 404."""
    if requested != served and not requested.startswith("claude"):
        raise APIError(
            f"the model `{requested}` does not exist (this server serves `{served}`, and takes any "
            "model name starting with 'claude' for it)",
            status=404,
            type="not_found_error",
            param="model",
            code="model_not_found",
        )


def chat_request(body: MessagesRequest | CountTokensRequest) -> tuple[ChatCompletionRequest, list[str]]:
    """(the chat completion request serving ``body``, the Messages field each of its messages came
    from). Raises APIError naming the field of a tool the server cannot serve."""
    messages, origins = _conversation(body)
    tools = [_tool(i, tool) for i, tool in enumerate(body.tools or [])]
    choice = body.tool_choice
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    if choice is not None:
        if choice.type == "tool":
            if not choice.name:
                raise APIError('a tool_choice of type "tool" names the tool', param="tool_choice.name")
            tool_choice = NamedToolChoice(type="function", function=NamedFunction(name=choice.name))
        else:
            tool_choice = _CHOICES[choice.type]
    sampling: dict[str, Any] = {}
    if isinstance(body, MessagesRequest):
        sampling = {
            "max_tokens": max(1, body.max_tokens),
            "response_format": _response_format(body),
            "stop": body.stop_sequences,
            "temperature": body.temperature,
            "top_p": body.top_p,
            "top_k": body.top_k,
            "user": body.metadata.user_id if body.metadata is not None else None,
            "stream": body.stream,
        }
    thinking = body.thinking.type if body.thinking is not None else "adaptive"
    chat = ChatCompletionRequest(
        messages=messages,
        chat_template_kwargs={"enable_thinking": thinking == "enabled"} if thinking != "adaptive" else None,
        tools=tools or None,
        tool_choice=tool_choice,
        parallel_tool_calls=not (choice is not None and choice.disable_parallel_tool_use),
        **sampling,
    )
    return chat, origins


def _response_format(body: MessagesRequest) -> ResponseFormat | None:
    fmt = body.output_config.format if body.output_config is not None else None
    if fmt is None:
        return None
    return ResponseFormat(type="json_schema", json_schema=JSONSchemaFormat(name="output", schema_=fmt.schema_))


def _conversation(body: CountTokensRequest) -> tuple[list[ChatMessage], list[str]]:
    messages: list[ChatMessage] = []
    origins: list[str] = []
    system = _system_text(body.system)
    if system:
        messages.append(ChatMessage(role="system", content=system))
        origins.append("system")
    for i, turn in enumerate(body.messages):
        if isinstance(turn.content, str):
            messages.append(ChatMessage(role=turn.role, content=turn.content))
            origins.append(f"messages[{i}].content")
            continue
        texts: list[str] = []
        calls: list[ToolCallBody] = []
        for j, block in enumerate(turn.content):
            where = f"messages[{i}].content[{j}]"
            if isinstance(block, TextBlock):
                texts.append(block.text)
            elif isinstance(block, ToolResultBlock):
                if turn.role != "user":
                    raise APIError("tool_result blocks go in user turns", param=where)
                messages.append(ChatMessage(role="tool", content=_result_text(block), tool_call_id=block.tool_use_id))
                origins.append(where)
            elif isinstance(block, ToolUseBlock):
                if turn.role != "assistant":
                    raise APIError("tool_use blocks go in assistant turns", param=where)
                arguments = json.dumps(block.input, ensure_ascii=False, separators=(",", ":"))
                calls.append(ToolCallBody(id=block.id, function=FunctionCallBody(name=block.name, arguments=arguments)))
            elif isinstance(block, ThinkingBlock) and turn.role != "assistant":
                raise APIError("thinking blocks go in assistant turns", param=where)
            # else (redacted) thinking: not rendered (see the module docstring)
        if texts or calls or not any(isinstance(b, ToolResultBlock) for b in turn.content):
            messages.append(ChatMessage(role=turn.role, content="".join(texts), tool_calls=calls or None))
            origins.append(f"messages[{i}].content")
    return messages, origins


def _system_text(system: str | list[TextPart] | None) -> str:
    if system is None or isinstance(system, str):
        return system or ""
    return "".join(b.text for b in system if not b.text.startswith(BILLING_HEADER))


def _result_text(block: ToolResultBlock) -> str:
    text = block.content if isinstance(block.content, str) else "".join(b.text for b in block.content)
    # The model reads that the call failed (Anthropic's is_error), not only what the tool said.
    return f"Error: {text}" if block.is_error else text


def _tool(index: int, tool: AnthropicTool) -> ToolBody:
    if tool.type not in (None, "custom"):
        raise APIError(
            f"tool type {tool.type!r} is not supported (only client tools, with a name and an input_schema)",
            param=f"tools[{index}].type",
        )
    if tool.input_schema is None:
        raise APIError("Field required", param=f"tools[{index}].input_schema")
    return ToolBody(
        type="function",
        function=FunctionDefinition(name=tool.name, description=tool.description, parameters=tool.input_schema),
    )


@contextlib.contextmanager
def anthropic_params(origins: list[str]) -> Iterator[None]:
    """Errors of the chat checks, renamed to the Messages request's fields: ``messages[k]...``
    becomes the field chat message ``k`` came from (``origins[k]``), the other chat fields their
    Messages names."""
    try:
        yield
    except APIError as exc:
        if exc.param is not None:
            exc.param = renamed(exc.param, origins)
        raise


def renamed(param: str, origins: list[str]) -> str:
    """A chat request's field as the Messages request names it (see :func:`anthropic_params`)."""
    head = re.split(r"[.\[]", param, maxsplit=1)[0]
    if head == "messages":
        index = re.match(r"messages\[(\d+)\]", param)
        return origins[int(index.group(1))] if index and int(index.group(1)) < len(origins) else "messages"
    param = _FIELDS.get(head, head) + param[len(head) :]
    for chat, ours in _SUFFIXES:
        param = param.replace(chat, ours)
    return param
