"""Strings that regular expressions match, generated from Python's own parse of the pattern.

JSON Schema witnesses (``structured.witness``) need strings for ``pattern``, ``patternProperties``
and ``propertyNames`` keywords: :func:`pattern_strings` walks the parse tree of ``re`` (literals,
classes, branches, repeats, group references) and builds a few strings from it, each checked
with ``re.search`` (lookarounds and anchors are left to that check). :func:`composed_strings`
puts several patterns' strings together for a value that must match them all.
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Iterator
from typing import Any

# The standard library's regex parser and its opcodes (``re._parser``, ``re._constants`` since
# CPython 3.11; no type stubs).
sre_parse: Any = importlib.import_module("re._parser")
sre_c: Any = importlib.import_module("re._constants")

NUM_STRINGS = 8  # strings generated per pattern

_CATEGORY_CHARS = {
    sre_c.CATEGORY_DIGIT: "0123456789",
    sre_c.CATEGORY_WORD: "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_",
    sre_c.CATEGORY_SPACE: " ",
    sre_c.CATEGORY_NOT_DIGIT: "abcdefgh",
    sre_c.CATEGORY_NOT_WORD: " -.",
    sre_c.CATEGORY_NOT_SPACE: "abcdefgh",
}
_PRINTABLE = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_-. "


@functools.lru_cache(maxsize=4096)
def pattern_strings(pattern: str, min_length: int) -> list[str]:
    """A few strings that ``pattern`` (searched, as JSON Schema does) matches: the shortest the
    parse suggests, then others (other branches, other characters, longer repeats), each padded
    to ``min_length`` where a repeat allows. Checked with ``re``; [] if none could be made."""
    try:
        parsed = sre_parse.parse(pattern)
        compiled = re.compile(pattern)
    except (re.error, RecursionError, OverflowError):
        return []
    out: list[str] = []
    for variant in range(NUM_STRINGS):
        for extra in (0, max(0, min_length)):
            try:
                text = _generate(parsed, variant, extra, {})
            except (_NoString, RecursionError):
                continue
            if compiled.search(text) and text not in out:
                out.append(text)
    return out


def composed_strings(patterns: list[str], min_length: int) -> Iterator[str]:
    """Strings for several patterns at once: what the ``^``-anchored ones match first, then the
    unanchored ones, then the ``$``-anchored ones, padded in the middle to ``min_length`` with
    characters the parts themselves use."""
    heads: list[str] = []
    middles: list[str] = []
    tails: list[str] = []
    for pattern in patterns:
        found = pattern_strings(pattern, 0)
        if not found:
            return
        starts, ends = pattern.startswith("^"), pattern.endswith("$") and not pattern.endswith("\\$")
        if starts and ends:
            return  # a whole-string pattern: composing cannot help
        (heads if starts else tails if ends else middles).append(found[0])
    head, middle, tail = "".join(heads), "".join(middles), "".join(tails)
    short = max(0, min_length - len(head) - len(middle) - len(tail))
    fillers = dict.fromkeys(c for c in (middle[-1:], head[-1:], tail[:1], "0", "a", "1", "z") if c)
    for filler in fillers:
        yield head + middle + filler * short + tail


class _NoString(Exception):
    pass


def _generate(tokens: Any, variant: int, extra: int, groups: dict[int, str]) -> str:
    out: list[str] = []
    for op, arg in tokens:
        if op is sre_c.LITERAL:
            out.append(chr(arg))
        elif op is sre_c.NOT_LITERAL:
            out.append(next(c for c in _PRINTABLE if ord(c) != arg))
        elif op is sre_c.ANY:
            out.append(_PRINTABLE[variant % len(_PRINTABLE)])
        elif op is sre_c.IN:
            out.append(_pick_in(arg, variant))
        elif op is sre_c.BRANCH:
            branches = arg[1]
            out.append(_generate(branches[variant % len(branches)], variant // len(branches), extra, groups))
        elif op is sre_c.SUBPATTERN:
            group, sub = arg[0], arg[-1]
            text = _generate(sub, variant, extra, groups)
            if group is not None:
                groups[group] = text
            out.append(text)
        elif op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT, getattr(sre_c, "POSSESSIVE_REPEAT", None)):
            low, high, sub = arg
            count = low + (variant % 3 if high > low else 0) + (extra if high == sre_c.MAXREPEAT else 0)
            count = min(count, high if high != sre_c.MAXREPEAT else count)
            out += [_generate(sub, variant, 0, groups) for _ in range(count)]
        elif op is sre_c.GROUPREF:
            out.append(groups.get(arg, ""))
        elif op in (sre_c.AT, sre_c.ASSERT, sre_c.ASSERT_NOT):
            continue  # anchors; lookarounds are left to the check with re
        else:
            raise _NoString
    return "".join(out)


def _pick_in(items: Any, variant: int) -> str:
    allowed: list[str] = []
    negate = False
    for op, arg in items:
        if op is sre_c.NEGATE:
            negate = True
        elif op is sre_c.LITERAL:
            allowed.append(chr(arg))
        elif op is sre_c.RANGE:
            low, high = arg
            allowed += [chr(c) for c in range(low, min(high, low + 25) + 1)]
        elif op is sre_c.CATEGORY:
            allowed += list(_CATEGORY_CHARS.get(arg, ""))
    if negate:
        allowed = [c for c in _PRINTABLE if c not in allowed]
    if not allowed:
        raise _NoString
    return allowed[variant % len(allowed)]
