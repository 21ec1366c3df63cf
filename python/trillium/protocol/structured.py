"""Structured-output messages: the constraint a request asks for, and the grammar actor's
compile request and reply; and how JSON is generated under any constraint."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # a stub-only TypedDict

# How every JSON constraint is generated (a JSON Schema, and the tool-call grammar's %json parts).
# Compact JSON: no whitespace between tokens. A small model given free whitespace may pad with
# newlines until max_tokens runs out; ", " / ": " would also be fine, but one form suffices.
# oneOf is compiled as anyOf: exact when the branches are disjoint (nearly always in practice);
# otherwise an output matching two branches gets through (JSONSchemaBench counts such cases).
JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False, "coerce_one_of": True}

# The first line of a tool-call grammar (tools/grammar.py), followed by the call format: the
# compiler then checks the calls' arguments against what their schemas' grammar cannot express
# (structured/call_checks.py).
CALLS_HEADER = "// trillium tool calls: "


class StructuredOutputs(msgspec.Struct, omit_defaults=True, kw_only=True, forbid_unknown_fields=True):
    """One output constraint, vLLM's ``structured_outputs`` shape: exactly one field is set.

    ``json``: a JSON Schema (object or its JSON text); ``json_object``: any JSON object;
    ``regex``: a regular expression (Rust ``regex`` syntax) the whole output must match;
    ``choice``: the output is exactly one of these strings; ``grammar``: a Lark or GBNF grammar.
    OpenAI's ``response_format`` is translated into the same struct by the frontend.
    """

    json: Any = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None


class ThinkSection(msgspec.Struct, frozen=True, kw_only=True):
    """A thinking model's think section, by the token ids of its tags (``--reasoning-parser``
    with single-token tags): an output constraint then applies only after it, so the model
    reasons first. ``opened``: the prompt opened it (the output starts inside the thinking);
    otherwise the model may open it with its first token or answer at once."""

    open_id: int
    close_id: int
    opened: bool = False


class CompileGrammar(msgspec.Struct, gc=False, kw_only=True):
    """Frontend -> grammar actor: compile (or find in the cache) one constraint.

    ``reply`` is a one-shot sink (``trio.MemorySendChannel``) that receives :class:`GrammarCompiled`.
    """

    constraint: StructuredOutputs
    reply: Any = None
    # The asker's cache namespace (its tenant's prefix-cache scope): compiled grammars are cached
    # per scope, so a compile's speed never tells one tenant what schema another sent.
    scope: str | None = None


class GrammarCompiled(msgspec.Struct, gc=False):
    """Grammar actor -> frontend: the compiled grammar (``structured.CompiledGrammar``; in-process
    only, handed on in ``AddRequest.grammar``), or why it could not be compiled."""

    grammar: Any = None
    error: str | None = None
