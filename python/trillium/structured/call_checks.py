"""Value checks of tool calls: the keywords of a tool's parameters schema that no grammar expresses.

A tool-call grammar (``tools/grammar.py``) starts with the line ``// trillium tool calls: FORMAT``
and has one ``fn_i: %json {...}`` rule per offered tool: the call object ``{"name": <const>,
"arguments" (or "parameters"): <the tool's parameters schema>}``. :func:`prepare_call_grammar`
relaxes each call schema as a ``json`` constraint is relaxed (``schema_rewrite.prepare_schema``)
and, when a call needs checks (``uniqueItems``, ``not``, ``contains``, ...), returns
:class:`CallChecks`. Its :class:`CallsChecker` has the ``ValueChecker`` interface over the whole
output, so ``OutputGuard`` rolls back and holds back tool calls exactly as it does JSON output:

    Let me check.<tool_call>\\n{"name":"tag","arguments":{"tags":["a","a"]}}\\n</tool_call>
                             ^ a call starts at the first '{' after the opener
                                                               ^ the duplicate item fails here

The call's tool is known once its ``"name"`` is complete (the grammar writes it first); until
then nothing in the call can fail. Calls of tools without checks are only parsed, to find where
they end. Where calls start, per format: ``hermes``, at the first ``{`` after each
``<tool_call>`` (the special token or the same text); ``llama3_json``, at the start of the output
and after each ``;`` that follows a call.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from trillium.protocol.structured import CALLS_HEADER
from trillium.structured.value_checks import NOT_JSON, CheckFailure, CheckNode, ValueChecker

_RULE = re.compile(r"^(fn_\d+): %json (\{.*\})$", re.MULTILINE)
_HERMES_OPENER = b"<tool_call>"
_NAME_OPEN = b'{"name":"'  # how every call object starts (compact JSON, "name" first)
_NAME = re.compile(rb'\{"name":"((?:[^"\\]|\\.)*)"')
_WHITESPACE = b" \t\r\n"


@dataclass(frozen=True)
class CallChecks:
    """The checks of one tool-call grammar: its format and, per tool name, the node of its call
    object (tools whose calls need no checks are absent). Immutable; shared by its requests."""

    fmt: str  # "hermes" or "llama3_json"
    nodes: dict[str, CheckNode]

    def new_checker(self) -> CallsChecker:
        return CallsChecker(self)


def prepare_call_grammar(text: str, *, strict_formats: bool = False) -> tuple[str, CallChecks | None]:
    """(the grammar to compile, its checks or None). A grammar that is not a tool-call grammar
    comes back unchanged. Raises what ``prepare_schema`` raises for a tool's schema (with
    ``strict_formats``, an unknown format too; else it is ignored)."""
    from trillium.structured.schema_rewrite import prepare_schema  # schema_rewrite imports llguidance probes

    if not text.startswith(CALLS_HEADER):
        return text, None
    fmt = text[len(CALLS_HEADER) : text.index("\n")].strip()
    nodes: dict[str, CheckNode] = {}

    def relax(match: re.Match[str]) -> str:
        schema = json.loads(match.group(2))
        try:
            name = schema["properties"]["name"]["const"]
        except (KeyError, TypeError):
            raise ValueError(f"{match.group(1)} is not a tool call's schema") from None
        try:
            prepared = prepare_schema(schema, strict_formats=strict_formats)
        except ValueError as exc:
            raise ValueError(f"the parameters of tool {name!r}: {exc}") from None
        if prepared.root is not None:
            nodes[name] = prepared.root
        return f"{match.group(1)}: %json {json.dumps(prepared.grammar_schema, ensure_ascii=False)}"

    relaxed = _RULE.sub(relax, text)
    return relaxed, CallChecks(fmt, nodes) if nodes else None


class CallsChecker:
    """``ValueChecker``'s interface over an output holding tool calls (module docstring): offsets
    are of the whole output. Not thread-safe; one per request."""

    def __init__(self, checks: CallChecks) -> None:
        self._checks = checks
        self.reset()

    def reset(self) -> None:
        self._buf = bytearray()
        self._scan = 0  # where to look for the next call's start
        self._call_start = -1  # offset of the current call's '{', or -1 between calls
        self._call: ValueChecker | None = None  # the current call's checker, once its tool is known
        self._calls_done = 0
        self._text = False  # llama3_json: the output is text, not calls
        self._failure: CheckFailure | None = None

    def copy(self) -> CallsChecker:
        other = CallsChecker.__new__(CallsChecker)
        other.__dict__.update(self.__dict__)
        other._buf = bytearray(self._buf)
        other._call = self._call.copy() if self._call is not None else None
        return other

    @property
    def num_bytes(self) -> int:
        return len(self._buf)

    @property
    def open_values(self) -> list[tuple[int, CheckNode | None]]:
        if self._call is None:
            return []
        return [(self._call_start + start, node) for start, node in self._call.open_values]

    @property
    def next_value_node(self) -> CheckNode | None:
        return self._call.next_value_node if self._call is not None else None

    @property
    def hold_from(self) -> int | None:
        hold = self._call.hold_from if self._call is not None else None
        return self._call_start + hold if hold is not None else None

    def feed(self, data: bytes) -> CheckFailure | None:
        """Parse the bytes of one token; the first failure of a check, or None."""
        if self._failure is None:
            old = len(self._buf)
            self._buf += data
            self._failure = self._advance(old)
        return self._failure

    def finish(self) -> CheckFailure | None:
        """The output ended. A call cut off mid-way has nothing more to check."""
        return self._failure

    def _advance(self, fed: int) -> CheckFailure | None:
        """Parse the buffer from ``fed`` (bytes before it were parsed already)."""
        while True:
            if self._call_start < 0 and not self._find_call():
                return None
            if self._call is None:
                name = self._call_name()
                if name is None:
                    return None  # not complete yet, or not a call after all (then scanning moved on)
                self._call = ValueChecker(self._checks.nodes.get(name), trailing=True)
                fed = self._call_start
            failure = self._call.feed(bytes(self._buf[max(fed, self._call_start) :]))
            if failure is not None:
                if failure.message.startswith(NOT_JSON):  # text that looked like a call (grammars
                    self._skip_call()  # make real calls JSON): nothing to check
                    fed = self._scan
                    continue
                return CheckFailure(failure.message, self._call_start + failure.value_start)
            if self._call.value_end is None:
                return None
            fed = self._scan = self._call_start + self._call.value_end  # what follows: scanned
            self._call_start, self._call = -1, None
            self._calls_done += 1

    def _call_name(self) -> str | None:
        """The current call's tool name once its bytes hold it; None while they may still become
        ``{"name":"...`` (else the start is skipped: not a call)."""
        head = bytes(self._buf[self._call_start : self._call_start + len(_NAME_OPEN)])
        if not _NAME_OPEN.startswith(head):
            self._skip_call()
            return None
        match = _NAME.match(self._buf, self._call_start)
        if match is None:
            return None
        try:
            name = json.loads(b'"' + match.group(1) + b'"')
        except ValueError:
            name = None
        if not isinstance(name, str):
            self._skip_call()
            return None
        return name

    def _skip_call(self) -> None:
        self._scan, self._call_start, self._call = self._call_start + 1, -1, None
        if self._checks.fmt == "llama3_json":
            self._text = True

    def _find_call(self) -> bool:
        """Move to the next call's '{' if it is in the buffer (sets ``_call_start``)."""
        buf = self._buf
        if self._checks.fmt == "llama3_json":
            if self._text:
                return False
            # The grammar puts no whitespace before a call or around ';' (text that starts with a
            # space is text, as the parser reads it).
            at = self._scan
            if self._calls_done:  # a next call comes right after the separator
                if at >= len(buf):
                    return False
                if buf[at] != ord(";"):
                    self._text = True
                    return False
                at += 1
            if at >= len(buf):
                return False
            if buf[at] != ord("{"):  # text, not calls: nothing to check
                self._text = True
                return False
            self._call_start = at
            return True
        while True:
            opener = buf.find(_HERMES_OPENER, self._scan)
            if opener < 0:
                self._scan = max(self._scan, len(buf) - len(_HERMES_OPENER) + 1)
                return False
            at = _skip_space(buf, opener + len(_HERMES_OPENER))
            if at >= len(buf):
                self._scan = opener  # wait for the bytes after the opener
                return False
            if buf[at] == ord("{"):
                self._call_start = at
                return True
            self._scan = at  # the opener's text inside free text: not a call


Checker = ValueChecker | CallsChecker  # what checks a whole output (the same interface)


def _skip_space(buf: bytearray, at: int) -> int:
    while at < len(buf) and buf[at] in _WHITESPACE:
        at += 1
    return at
