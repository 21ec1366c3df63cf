"""The llguidance (Lark) grammar that keeps a request's tool calls well formed.

``required`` and a named function: the output is one call (or, with ``parallel_tool_calls``,
several), each an object ``{"name": <one of the tools>, "arguments": <that tool's parameters
schema>}`` in the model's format, so arguments always parse and validate. ``auto``: any text
that does not contain the call opener, or text followed by well-formed calls (the opener starts
one). The frontend compiles the result like any ``structured_outputs.grammar``; its first line
names the format (``structured/call_checks.py``), so that keywords of a tool's schema that no
grammar expresses (``uniqueItems``, ``not``, ...) are relaxed out and checked as each call is
generated, as for a JSON Schema constraint.
"""

from __future__ import annotations

import json
from typing import Any

from trillium.protocol.structured import CALLS_HEADER, JSON_OPTIONS
from trillium.tools.formats import ToolFormat
from trillium.tools.spec import FunctionTool, ToolChoice


def tool_grammar(
    tools: list[FunctionTool], choice: ToolChoice, parallel: bool, fmt: ToolFormat, *, special_tags: bool = False
) -> str | None:
    """The grammar for this request, or None when calls are off (``tool_choice: none``).

    ``special_tags``: ``<tool_call>``/``</tool_call>`` are single special tokens of the vocabulary
    (Qwen), written as tokens in the grammar rather than as text."""
    if choice.mode == "none" or not tools:
        return None
    offered = [t for t in tools if choice.mode != "function" or t.name == choice.name]
    args_key = "parameters" if fmt.name == "llama3_json" else "arguments"
    lines = [CALLS_HEADER + fmt.name, f"fn: {' | '.join(f'fn_{i}' for i in range(len(offered)))}"]
    lines += [
        f"fn_{i}: %json {json.dumps(_call_schema(t, args_key), ensure_ascii=False)}" for i, t in enumerate(offered)
    ]
    if fmt.name == "llama3_json":
        calls = 'fn (";" fn)*' if parallel else "fn"
        if choice.mode == "auto":
            return "\n".join([*lines, f"start: TEXT | {calls}", r"TEXT: /[^{](?s:.*)/"])
        return "\n".join([*lines, f"start: {calls}"])
    if special_tags:
        opener, body = "<tool_call>", 'call_body: "\\n" fn "\\n" </tool_call>'
    else:
        opener, body = '"<tool_call>"', 'call_body: "\\n" fn "\\n</tool_call>"'
    # Calls are separated by one newline: a free run of whitespace let a model pad to max_tokens.
    rest = f" (SEP {opener} call_body)*" if parallel else ""
    if choice.mode == "auto":
        if special_tags:  # special tokens never occur in text: no need to keep the opener out of it
            start = f"start: TEXT | TEXT? {opener} call_body{rest}"
            text = r"TEXT: /(?s:.+)/"
        else:
            start = f"start: TEXT | head call_body{rest}\nhead[lazy]: /(?s:.*)<tool_call>/"
            text = r"TEXT: /(?s:.*)/ & ~/(?s:.*)<tool_call>(?s:.*)/"
        return "\n".join([*lines, start, text, r"SEP: /\n/", body])
    return "\n".join([*lines, f"start: {opener} call_body{rest}", r"SEP: /\n/", body])


def _call_schema(tool: FunctionTool, args_key: str) -> dict[str, Any]:
    parameters = closed_objects(tool.parameters or {"type": "object"})
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, args_key: parameters},
        "required": ["name", args_key],
        "additionalProperties": False,
        "x-guidance": JSON_OPTIONS,  # generated as every JSON constraint is
    }


def closed_objects(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` on every object schema that lists
    ``properties`` and says nothing about others (OpenAI's strict function calling): a function
    takes the arguments it declares, and a small model offered free keys invents them until
    ``max_tokens``. A schema that sets ``additionalProperties`` keeps its own choice."""
    if isinstance(schema, list):
        return [closed_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed_objects(v) if k not in ("const", "enum", "default", "examples") else v for k, v in schema.items()}
    if isinstance(schema.get("properties"), dict) and "additionalProperties" not in schema:
        out["additionalProperties"] = False
    return out
