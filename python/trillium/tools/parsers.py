"""Model text -> OpenAI tool calls, incrementally (streaming and whole responses share the code).

A parser is fed a choice's text as it is generated and returns events: :class:`ContentDelta`
(text that is message content) and :class:`ToolCallReady` (a whole call, once its closing
delimiter arrived). A call is handed out only complete and parsed, so a client never sees a
broken entry in ``tool_calls``; and call markup is never content: a call cut short
(``max_tokens``) is dropped at :meth:`ToolCallParser.finish`, as is a block that is no call of
an offered tool (the request's grammar lets none through). Text that may begin a call opener is
held back until it is known not to, like a stop string.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from trillium.tools.formats import ToolFormat
from trillium.tools.spec import ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class ToolCallReady:
    index: int  # position among this choice's calls
    call: ToolCall


Event = ContentDelta | ToolCallReady


class ToolCallParser:
    """Base: the calls found so far, and the checks a parsed call object must pass."""

    def __init__(self, names: frozenset[str], args_keys: tuple[str, ...]) -> None:
        self.names = names  # the functions the request offered
        self.args_keys = args_keys
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> list[Event]:
        raise NotImplementedError

    def finish(self, *, cut: bool = False) -> list[Event]:
        """What is still held back, at the end of the output: content, never a call's markup.
        ``cut``: the output was cut short (``max_tokens``), so that held-back text that begins a
        call opener is an opener cut short, not text."""
        raise NotImplementedError

    def _call(self, obj: Any) -> ToolCallReady | None:
        """The event for a parsed call object, or None if it is not a call of an offered tool."""
        if not isinstance(obj, dict) or obj.get("name") not in self.names:
            return None
        args = next((obj[k] for k in self.args_keys if k in obj), None)
        if not isinstance(args, dict) or set(obj) - {"name", *self.args_keys}:
            return None
        call = ToolCall(name=obj["name"], arguments=json.dumps(args, ensure_ascii=False))
        self.calls.append(call)
        return ToolCallReady(len(self.calls) - 1, call)


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that is a proper beginning of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class HermesParser(ToolCallParser):
    """``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` blocks amid text."""

    def __init__(self, names: frozenset[str]) -> None:
        super().__init__(names, ("arguments",))
        self._buf = ""
        self._in_call = False
        self._decoder = json.JSONDecoder()

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        events: list[Event] = []
        while True:
            if self._in_call:
                found = self._call_end()
                if found is None:
                    return events
                _, end, obj = found
                self._buf = self._buf[end:].lstrip()
                self._in_call = False
                ready = self._call(obj) if obj is not None else None
                if ready is not None:  # (a block that is no call is dropped: its markup is not content)
                    events.append(ready)
                continue
            start = self._buf.find(OPEN)
            if start >= 0:
                before = self._buf[:start].rstrip()
                if before:
                    events.append(ContentDelta(before))
                self._buf = self._buf[start + len(OPEN) :]
                self._in_call = True
                continue
            # Hold back what may begin an opener, and the whitespace before it (dropped before a call).
            keep = _partial_suffix(self._buf, OPEN)
            head = self._buf[: len(self._buf) - keep]
            cut = len(head.rstrip())
            if cut:
                events.append(ContentDelta(self._buf[:cut]))
                self._buf = self._buf[cut:]
            return events

    def _call_end(self) -> tuple[int, int, Any] | None:
        """Where the call in the buffer ends: (end of its body, end of its closing tag, the parsed
        object or None if it is no valid call text), or None while it may still go on. The object
        is parsed before the closing tag is looked for, so a closing tag inside one of its strings
        does not end the call. An unfinished object waits (for the rest, or for :meth:`finish`)."""
        if CLOSE not in self._buf:
            return None  # every ending needs the tag: no parse per token of a long call until it comes
        start = len(self._buf) - len(self._buf.lstrip())
        after = None
        if self._buf[start : start + 1] == "{":
            try:
                obj, after = self._decoder.raw_decode(self._buf, start)
            except json.JSONDecodeError:
                return None  # unfinished (a grammar never lets it be invalid; finish() drops it)
            stripped = self._buf[after:].lstrip()
            if stripped.startswith(CLOSE):
                end = len(self._buf) - len(stripped)
                return end, end + len(CLOSE), obj
            if CLOSE.startswith(stripped):
                return None  # the closing tag is still arriving
        close = self._buf.find(CLOSE, after or 0)  # no valid call: content up to the closing tag
        return (close, close + len(CLOSE), None) if close >= 0 else None

    def finish(self, *, cut: bool = False) -> list[Event]:
        rest, in_call = self._buf, self._in_call
        self._buf, self._in_call = "", False
        if in_call:
            return []  # a call that never closed: cut short, its text is not content
        if cut and (keep := _partial_suffix(rest, OPEN)):
            rest = rest[: len(rest) - keep].rstrip()  # an opener cut short, and the whitespace before it
        if not rest or (self.calls and not rest.strip()):
            return []
        return [ContentDelta(rest)]


class Llama3JsonParser(ToolCallParser):
    """A reply that starts with ``{`` (optionally after ``<|python_tag|>``) is ``;``-separated call
    objects; any other reply is content."""

    def __init__(self, names: frozenset[str]) -> None:
        super().__init__(names, ("parameters", "arguments"))
        self._buf = ""
        self._mode: str | None = None  # None until the first visible character: "text" or "json"
        self._decoder = json.JSONDecoder()

    def feed(self, text: str) -> list[Event]:
        if self._mode == "text":
            return [ContentDelta(text)] if text else []
        self._buf += text
        if self._mode == "json" and "}" not in text:  # no object can have closed: skip the parse
            if self.calls:
                self._buf = self._between_calls(self._buf)
            return []
        if self._mode is None:
            # Calls start the reply: "{" right away, or after <|python_tag|> (the grammar's text
            # may not start with "{"; text that starts otherwise is content, never a call).
            head = self._buf
            if head.startswith(PYTHON_TAG):
                head = head[len(PYTHON_TAG) :].lstrip()
            if not head or PYTHON_TAG.startswith(head):
                return []
            if not head.startswith("{"):
                self._mode, self._buf = "text", ""
                return [ContentDelta(head)]
            self._mode, self._buf = "json", head
        events: list[Event] = []
        while True:
            if self.calls:
                self._buf = self._between_calls(self._buf)
            if not self._buf.startswith("{"):
                return events
            try:
                obj, end = self._decoder.raw_decode(self._buf)
            except json.JSONDecodeError:
                return events  # incomplete (or invalid: finish() returns it as content)
            ready = self._call(obj)
            if ready is None:
                return events
            events.append(ready)
            self._buf = self._buf[end:]

    @staticmethod
    def _between_calls(text: str) -> str:
        """``text`` without the "; " that separates calls."""
        return text.lstrip().removeprefix(";").lstrip()

    def finish(self, *, cut: bool = False) -> list[Event]:
        rest, self._buf = self._buf, ""
        # Held back outside text mode: a call cut short, or the start of one (<|python_tag|>,
        # whitespace): never content. (Text mode holds nothing back.)
        if self._mode == "text" and rest:
            return [ContentDelta(rest)]
        return []


def make_parser(fmt: ToolFormat, names: frozenset[str]) -> ToolCallParser:
    """A fresh parser for one choice of a request offering the tools ``names``."""
    if fmt.name == "llama3_json":
        return Llama3JsonParser(names)
    return HermesParser(names)
