"""Structured-output messages: the constraint a request asks for, and the grammar actor's
compile request and reply."""

from __future__ import annotations

from typing import Any

import msgspec


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


class CompileGrammar(msgspec.Struct, gc=False, kw_only=True):
    """Frontend -> grammar actor: compile (or find in the cache) one constraint.

    ``reply`` is a one-shot sink (``trio.MemorySendChannel``) that receives :class:`GrammarCompiled`.
    """

    constraint: StructuredOutputs
    reply: Any = None


class GrammarCompiled(msgspec.Struct, gc=False):
    """Grammar actor -> frontend: the compiled grammar (``structured.CompiledGrammar``; in-process
    only, handed on in ``AddRequest.grammar``), or why it could not be compiled."""

    grammar: Any = None
    error: str | None = None
