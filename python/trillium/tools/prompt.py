"""A conversation with tools, made ready for the model's chat template.

Native templates (``formats.py``) get the tools as ``tools=`` and the history as OpenAI sends it,
with each call's ``arguments`` as an object (templates write it with ``tojson``). The fallback
describes the tools in the system message, writes earlier calls into the assistant turns as
Hermes blocks, and turns ``tool`` messages into user turns holding ``<tool_response>`` blocks,
which every template can render.
"""

from __future__ import annotations

import json
from typing import Any

from trillium.tools.formats import ToolFormat
from trillium.tools.spec import FunctionTool, arguments_object

FALLBACK_SYSTEM_PROMPT = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


def prepare_conversation(
    messages: list[dict[str, Any]], tools: list[FunctionTool], fmt: ToolFormat
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(messages, extra template variables) for rendering. ``messages`` are OpenAI messages as
    plain dicts (``content`` text or None, ``tool_calls`` on assistant turns, ``tool_call_id`` on
    tool turns). Raises ToolSpecError for a call whose arguments are not a JSON object."""
    if fmt.native:
        out = [_native_message(m, i) for i, m in enumerate(messages)]
        return out, ({"tools": [t.openai() for t in tools]} if tools else {})
    return _fallback_messages(messages, tools), {}


def _native_message(message: dict[str, Any], index: int) -> dict[str, Any]:
    calls = message.get("tool_calls")
    if not calls:
        return message
    converted = []
    for j, call in enumerate(calls):
        function = call["function"]
        param = f"messages[{index}].tool_calls[{j}].function.arguments"
        converted.append(
            {**call, "function": {**function, "arguments": arguments_object(function.get("arguments"), param)}}
        )
    return {**message, "tool_calls": converted}


def hermes_block(name: str, arguments: dict[str, Any]) -> str:
    """One call as the model is asked to write it (compact JSON, as the grammar generates it)."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False, separators=(",", ":"))
    return f"<tool_call>\n{body}\n</tool_call>"


def _fallback_messages(messages: list[dict[str, Any]], tools: list[FunctionTool]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if tools:
        described = "\n".join(json.dumps(t.openai(), ensure_ascii=False) for t in tools)
        system = FALLBACK_SYSTEM_PROMPT.format(tools=described)
        if messages and messages[0]["role"] == "system":
            system = f"{messages[0]['content'] or ''}\n\n{system}".lstrip()
            messages = messages[1:]
        out.append({"role": "system", "content": system})
    for i, message in enumerate(messages):
        role = message["role"]
        if role == "tool":
            block = f"<tool_response>\n{message.get('content') or ''}\n</tool_response>"
            if out and out[-1].get("_tool_responses"):  # consecutive results share one user turn
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_responses": True})
            continue
        calls = message.get("tool_calls")
        if role == "assistant" and calls:
            parts = [message["content"]] if message.get("content") else []
            for j, call in enumerate(calls):
                function = call["function"]
                param = f"messages[{i}].tool_calls[{j}].function.arguments"
                parts.append(hermes_block(function["name"], arguments_object(function.get("arguments"), param)))
            out.append({"role": "assistant", "content": "\n".join(parts)})
            continue
        out.append({"role": role, "content": message.get("content") or ""})
    return [{k: v for k, v in m.items() if k != "_tool_responses"} for m in out]
