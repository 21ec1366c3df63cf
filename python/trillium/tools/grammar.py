"""The llguidance (Lark) grammar that keeps a request's tool calls well formed.

``required`` and a named function: the output is one call (or, with ``parallel_tool_calls``,
several), each an object ``{"name": <one of the tools>, "arguments": <that tool's parameters
schema>}`` in the model's format, so arguments always parse and validate. ``auto``: any text
that does not contain the call opener, or text followed by well-formed calls (the opener starts
one). The frontend compiles the result like any ``structured_outputs.grammar``; its first line
names the format (``structured/call_checks.py``), so that keywords of a tool's schema that no
grammar expresses (``uniqueItems``, ``not``, ...) are relaxed out and checked as each call is
generated, as for a JSON Schema constraint.

A thinking model (``reasoning``: the server's ``--reasoning-parser`` format) reasons before it
calls: with ``required`` or a named function, a Hermes grammar lets a think section come first
-- optional where the model opens it (``<think>`` ... ``</think>``), required where the prompt
opened it (the output starts inside it and must close it) -- so the calls are constrained only
after the reasoning ends. Its text is free but for the closing tag and the call opener (a call
checker finds calls by their opener). ``auto`` lets any text come first already.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from trillium.protocol.structured import CALLS_HEADER, JSON_OPTIONS
from trillium.tools.formats import ToolFormat
from trillium.tools.spec import FunctionTool, ToolChoice


class ReasoningMarkers(Protocol):
    """How a thinking model marks its reasoning (``server/reasoning.py``'s ``ReasoningFormat``)."""

    @property
    def open_tag(self) -> str: ...
    @property
    def close_tag(self) -> str: ...
    @property
    def starts_inside(self) -> bool: ...


def tool_grammar(
    tools: list[FunctionTool],
    choice: ToolChoice,
    parallel: bool,
    fmt: ToolFormat,
    *,
    special_tags: bool = False,
    reasoning: ReasoningMarkers | None = None,
) -> str | None:
    """The grammar for this request, or None when calls are off (``tool_choice: none``).

    ``special_tags``: ``<tool_call>``/``</tool_call>`` are single special tokens of the vocabulary
    (Qwen), written as tokens in the grammar rather than as text. ``reasoning``: the model's
    think section, let in before ``required`` or named calls (module docstring)."""
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
    if reasoning is None:
        return "\n".join([*lines, f"start: {opener} call_body{rest}", r"SEP: /\n/", body])
    head = "think WS? " if reasoning.starts_inside else "(think WS?)? "
    opened = "" if reasoning.starts_inside else _regex_text(reasoning.open_tag)
    think = f"think[lazy]: /{opened}(?s:.*){_regex_text(reasoning.close_tag)}/ & ~/(?s:.*){_regex_text('<tool_call>')}(?s:.*)/"
    start = f"start: {head}{opener} call_body{rest}"
    return "\n".join([*lines, start, think, r"WS: /[ \t\n]+/", r"SEP: /\n/", body])


_REGEX_META = frozenset("\\.+*?()|[]{}^$#&-~/")


def _regex_text(text: str) -> str:
    """``text`` as a literal inside a Lark ``/regex/`` (only the regex's own metacharacters and the
    delimiter escaped: ``\\<`` would be a word boundary)."""
    return "".join("\\" + c if c in _REGEX_META else c for c in text)


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
