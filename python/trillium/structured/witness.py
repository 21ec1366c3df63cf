"""Witnesses: small JSON values that satisfy a JSON Schema, found by proposing and checking.

A closing must satisfy the value checks too (``structured.closer``), and where the model's text
rules that out -- a number no digit can fix under ``not: {multipleOf: 8}`` inside an ``anyOf``, an
object whose keys an ``oneOf`` of ``dependencies`` already rejects -- the closer writes the open
value again from its start. Character by character it finds short values only where a check
fails on a single character; a value whose validity depends on its whole shape needs the whole
shape. :class:`WitnessFinder` proposes whole values instead, from the schema itself, and keeps
those ``jsonschema`` accepts::

    {"type": "number", "allOf": [{"minimum": 1}, {"anyOf": [{"multipleOf": 3}, {"multipleOf": 5}]},
                                 {"not": {"multipleOf": 5}}]}                        -> 3

Proposals come from the conjunction of the subschemas at a position (``allOf`` and ``$ref``
followed): ``const``/``enum`` values; then each ``anyOf``/``oneOf`` branch and ``if``+``then`` /
``else`` added to the conjunction in turn (a branch's hints -- its ``multipleOf``, its ``required``
-- shape the proposals); then values of each allowed type built from the hints (bounds and
multiples for numbers, a string the ``pattern`` matches, ``minItems`` items each a witness of the
item schema, the required keys -- with ``dependencies`` -- plus optional ones up to
``minProperties``, each value a witness of its own subschemas, found the same way, recursively).
Every proposal is validated against every subschema of its position, so members are witnesses
before their container is tried; ``not``, ``oneOf``'s exclusivity, ``uniqueItems`` and the like
are left to that validation.

This is a search, not a decision procedure: it finds the small witnesses of the probes that
rule out the obvious values, not a witness of every satisfiable schema. It is bounded by the
caller's budget (each validation counts as a check in ``value_checks.checks_run``), and by
:data:`MAX_DEPTH` levels of nesting.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator
from typing import Any

import referencing

from trillium.structured.regex_strings import composed_strings, pattern_strings
from trillium.structured.value_checks import (
    applicable_subschemas,
    count_check,
    flatten_conjuncts,
    item_subschemas,
    member_subschemas,
)

Resolver = Any  # a referencing Resolver
Part = tuple[Any, Resolver]  # one subschema of a conjunction, with the resolver it is read with

MAX_DEPTH = 24  # nesting levels of a proposed value
MAX_ITEMS = 8  # items beyond minItems never proposed past this
NUM_KEYS = 6  # optional keys tried one at a time
NUM_VALUES = 12  # candidates of one member tried while the others stay at their first
NUM_NUMBERS = 48  # numbers proposed per conjunction
NUM_HINTS = 12  # strings from anywhere in the schema tried where a string may go
_FORMATS = {
    "date": "2020-01-01",
    "date-time": "2020-01-01T00:00:00Z",
    "time": "00:00:00Z",
    "email": "a@b.co",
    "idn-email": "a@b.co",
    "hostname": "a.co",
    "idn-hostname": "a.co",
    "ipv4": "1.1.1.1",
    "ipv6": "::1",
    "uri": "http://a.co",
    "uri-reference": "a",
    "iri": "http://a.co",
    "iri-reference": "a",
    "uuid": "00000000-0000-0000-0000-000000000000",
    "duration": "P1D",
    "json-pointer": "",
    "relative-json-pointer": "0",
    "uri-template": "a",
    "regex": "a",
    "byte": "",
}
_TYPE_ORDER = ("object", "array", "string", "integer", "number", "boolean", "null")
# Where nothing hints at a type (no ``type``, no keyword of one): the cheapest values first.
_PLAIN_ORDER = ("string", "integer", "boolean", "null", "object", "array", "number")
_HINTS = {
    "object": ("properties", "required", "minProperties", "patternProperties", "additionalProperties", "dependencies"),
    "array": ("items", "prefixItems", "minItems", "contains", "uniqueItems"),
    "string": ("pattern", "minLength", "maxLength", "format"),
    "integer": ("minimum", "maximum", "multipleOf", "exclusiveMinimum", "exclusiveMaximum"),
    "number": ("minimum", "maximum", "multipleOf", "exclusiveMinimum", "exclusiveMaximum"),
}


class Spent(Exception):
    """The caller's budget ran out during a search."""


class WitnessFinder:
    """Finds witnesses of subschemas of one schema document. Not thread-safe; one per search.

    ``validator``: a ``jsonschema`` validator of the root schema (its draft and ``$ref``
    registry); ``specification``: the ``referencing`` specification its resources are read
    with; ``legacy_ref``: ``$ref`` hides its siblings (drafts up to 7); ``spent``: called before
    each validation, True once the caller's budget is gone (the search then raises
    :class:`Spent`)."""

    def __init__(
        self,
        validator: Any,
        specification: referencing.Specification[Any],
        legacy_ref: bool,
        spent: Callable[[], bool],
    ) -> None:
        self._validator = validator
        self._specification = specification
        self._legacy_ref = legacy_ref
        self._prefix_items = "prefixItems" in validator.VALIDATORS  # the draft has it (2020-12)
        self._spent = spent
        self._validators: dict[int, Any] = {}
        self._found: dict[tuple[tuple[int, ...], int], _Lazy] = {}
        self._string_hints: list[str] = []
        self._number_hints: list[float] = []

    def witnesses(self, schemas: list[Part]) -> Iterator[Any]:
        """Values valid for every one of ``schemas`` (a conjunction), smallest proposals first;
        raises :class:`Spent` when the budget runs out."""
        parts = self._flatten_all(schemas)
        if parts is None:
            return
        hints: list[str] = []
        for schema, _ in parts:
            _string_hints(schema, hints, 0)
        self._string_hints = list(dict.fromkeys(hints))[:NUM_HINTS]
        numbers: list[float] = []
        for schema, _ in parts:
            _number_hints(schema, numbers, 0)
        self._number_hints = list(dict.fromkeys(numbers))[:NUM_HINTS]
        lazy = self._lazy(parts, 0)
        i = 0
        while (value := lazy.get(i)) is not _END:
            yield value
            i += 1

    # -- conjunctions ---------------------------------------------------------------------------

    def _flatten_all(self, schemas: list[Part]) -> list[Part] | None:
        """The conjuncts of ``schemas`` (``allOf`` and ``$ref`` followed); None if one is
        ``false``."""
        parts: list[Part] = []
        seen: set[int] = set()
        ok = True
        for schema, resolver in schemas:
            ok = flatten_conjuncts(schema, resolver, self._specification, self._legacy_ref, parts, seen) and ok
        return parts if ok else None

    def _lazy(self, parts: list[Part], depth: int) -> _Lazy:
        key = (tuple(id(p) for p, _ in parts), depth)
        found = self._found.get(key)
        if found is None:
            found = self._found[key] = _Lazy(self._checked(parts, depth))
        return found

    def _member(self, schemas: list[Part], depth: int) -> _Lazy | None:
        """Witnesses of a member (a property value, an item) at ``depth``; None if none can
        exist (a ``false`` subschema) or the nesting is too deep."""
        if depth > MAX_DEPTH:
            return None
        parts = self._flatten_all(schemas)
        return None if parts is None else self._lazy(parts, depth)

    def _checked(self, parts: list[Part], depth: int) -> Iterator[Any]:
        seen: set[str] = set()
        for value in self._proposals(parts, depth, frozenset()):
            if self._spent():  # also between validations: proposals may repeat for many branches
                raise Spent
            text = json.dumps(value, sort_keys=True)
            if text in seen:
                continue
            seen.add(text)
            if self._valid(parts, value):
                yield value

    def _valid(self, parts: list[Part], value: Any) -> bool:
        for schema, resolver in parts:
            if self._spent():
                raise Spent
            count_check()
            validator = self._validators.get(id(schema))
            if validator is None:
                validator = self._validators[id(schema)] = self._validator.evolve(schema=schema, _resolver=resolver)
            try:
                if next(iter(validator.iter_errors(value)), None) is not None:
                    return False
            except Exception:  # a schema jsonschema cannot evaluate: never a witness
                return False
        return True

    # -- proposals ------------------------------------------------------------------------------

    def _proposals(self, parts: list[Part], depth: int, expanded: frozenset[int]) -> Iterator[Any]:
        for schema, _ in parts:
            if "const" in schema:
                yield schema["const"]
                return
            if isinstance(schema.get("enum"), list):
                yield from schema["enum"]
                return
        # One branching keyword at a time: each alternative joins the conjunction.
        for schema, resolver in parts:
            if id(schema) in expanded:
                continue
            alternatives: list[list[Any]] = []
            for word in ("anyOf", "oneOf"):
                if isinstance(schema.get(word), list):
                    alternatives += [[branch] for branch in schema[word]]
            if "if" in schema and ("then" in schema or "else" in schema):
                alternatives += [[schema["if"], schema.get("then", True)], [schema.get("else", True)]]
            if not alternatives:
                continue
            for branch in alternatives:
                more = self._flatten_all([(b, resolver) for b in branch])
                if more is not None:
                    yield from self._proposals(parts + more, depth, expanded | {id(schema)})
            break
        yield from self._by_type(parts, depth)

    def _by_type(self, parts: list[Part], depth: int) -> Iterator[Any]:
        types = set(_TYPE_ORDER)
        for schema, _ in parts:
            declared = schema.get("type")
            if isinstance(declared, str):
                declared = [declared]
            if isinstance(declared, list):
                named = set(declared) | ({"integer"} if "number" in declared else set())
                types &= named
        hinted = [t for t in _TYPE_ORDER if t in types and any(w in s for s, _ in parts for w in _HINTS.get(t, ()))]
        rest = _TYPE_ORDER if any("type" in s for s, _ in parts) else _PLAIN_ORDER
        order = hinted + [t for t in rest if t in types and t not in hinted]
        if "number" in order and "integer" in order:
            order.remove("number")  # integers first; non-integral numbers from the number proposals
            order.insert(order.index("integer") + 1, "number")
        # Round robin over the types (hinted ones first): a value of no declared type whose
        # checks want a number is found among the first few proposals, not after every string.
        generators = [self._of_type(kind, parts, depth) for kind in order]
        while generators:
            for gen in list(generators):
                value = next(gen, _END)
                if value is _END:
                    generators.remove(gen)
                else:
                    yield value

    def _of_type(self, kind: str, parts: list[Part], depth: int) -> Iterator[Any]:
        if kind == "null":
            yield None
        elif kind == "boolean":
            yield False
            yield True
        elif kind in ("integer", "number"):
            yield from self._numbers(parts, integral=kind == "integer")
        elif kind == "string":
            yield from self._strings(parts)
        elif kind == "array":
            yield from self._arrays(parts, depth)
        else:
            yield from self._objects(parts, depth)

    def _numbers(self, parts: list[Part], integral: bool) -> Iterator[Any]:
        low, high = -math.inf, math.inf
        steps: list[float] = []
        for schema, _ in parts:
            for word, bound in (
                ("minimum", "low"),
                ("exclusiveMinimum", "low"),
                ("maximum", "high"),
                ("exclusiveMaximum", "high"),
            ):
                value = schema.get(word)
                if isinstance(value, bool):  # draft 4: a flag on minimum/maximum
                    continue
                if isinstance(value, (int, float)):
                    exclusive = word.startswith("exclusive") or schema.get("exclusive" + word.title()) is True
                    edge = value + (1 if bound == "low" else -1) * (1 if exclusive else 0)
                    if bound == "low":
                        low = max(low, edge)
                    else:
                        high = min(high, edge)
            step = schema.get("multipleOf")
            if isinstance(step, (int, float)) and not isinstance(step, bool) and step > 0:
                steps.append(step)
        if steps and all(float(s).is_integer() for s in steps):
            step = math.lcm(*(int(s) for s in steps))
        elif steps:
            step = steps[0]
        else:
            step = 1
        if low == -math.inf and high < 0:  # only an upper bound below 0: downwards from it
            start, direction = math.floor(high / step) * step, -1
        else:
            start, direction = (0 if low == -math.inf else math.ceil(low / step) * step), 1
        for k in range(NUM_NUMBERS):
            # start, start + step, ... and, without a lower bound, the negatives too
            if low == -math.inf and high >= 0 and k:
                n = start + (k // 2 + 1) * step * (1 if k % 2 else -1)
            else:
                n = start + direction * k * step
            if n > high or n < low:
                if low != -math.inf:
                    break
                continue
            value = int(n) if float(n).is_integer() and abs(n) < 2**53 else n
            if integral and not isinstance(value, int):
                continue
            yield value
        for value in self._number_hints:  # the document's own numbers (a bound inside a branch)
            if low <= value <= high and (not integral or float(value).is_integer()):
                yield int(value) if float(value).is_integer() else value
        if not integral:
            for value in (0.5, -0.5, 1.5):
                if low <= value <= high:
                    yield value

    def _strings(self, parts: list[Part]) -> Iterator[str]:
        min_length = max([int(s["minLength"]) for s, _ in parts if isinstance(s.get("minLength"), int)] or [0])
        for schema, _ in parts:
            fmt = schema.get("format")
            if isinstance(fmt, str) and fmt in _FORMATS:
                yield _FORMATS[fmt]
        patterns = [s["pattern"] for s, _ in parts if isinstance(s.get("pattern"), str)]
        if len(patterns) > 1:  # several at once (an anyOf branch's "^a" with another's "x$")
            yield from composed_strings(patterns, min_length)
        for pattern in patterns:
            yield from pattern_strings(pattern, min_length)
        yield "a" * min_length
        yield from self._string_hints  # the document's own strings (a pattern inside a "not")
        for ch in "bcdefg":
            yield ch * max(min_length, 1)

    def _arrays(self, parts: list[Part], depth: int) -> Iterator[list[Any]]:
        min_items = max([int(s["minItems"]) for s, _ in parts if isinstance(s.get("minItems"), int)] or [0])
        max_items = min([int(s["maxItems"]) for s, _ in parts if isinstance(s.get("maxItems"), int)] or [MAX_ITEMS])
        contains = [(s["contains"], r) for s, r in parts if "contains" in s]
        if min_items == 0 and not contains:
            yield []
        for n in range(max(min_items, 1), min(max_items, min_items + 3) + 1):
            members = [self._member(self._item_schemas(parts, i), depth + 1) for i in range(n)]
            if any(m is None for m in members):
                return
            lazies = [m for m in members if m is not None]
            first = [lazy.get(0) for lazy in lazies]
            if any(v is _END for v in first):
                return
            if contains:
                for value in self._contains_witnesses(parts, contains, depth):
                    rest = _distinct(lazies[1:], [value])
                    if rest is not None:
                        yield [value, *rest]
                    yield [value, *first[1:]]
            yield first
            distinct = _distinct(lazies, [])
            if distinct is not None:
                yield distinct
            for i in range(1, NUM_VALUES):  # the first item varied
                value = lazies[0].get(i)
                if value is _END:
                    break
                yield [value, *first[1:]]

    def _contains_witnesses(self, parts: list[Part], contains: list[Part], depth: int) -> Iterator[Any]:
        lazy = self._member(contains + self._item_schemas(parts, 0), depth + 1)
        for i in range(NUM_VALUES):
            value = lazy.get(i) if lazy is not None else _END
            if value is _END:
                return
            yield value

    def _item_schemas(self, parts: list[Part], index: int) -> list[Part]:
        return item_subschemas(parts, index, self._prefix_items)

    def _objects(self, parts: list[Part], depth: int) -> Iterator[dict[str, Any]]:
        min_props = max([int(s["minProperties"]) for s, _ in parts if isinstance(s.get("minProperties"), int)] or [0])
        required, parts = self._required(parts, [])
        order: list[str] = []  # keys in the order properties declare them (the grammar's order)
        for schema, _ in parts:
            props = schema.get("properties")
            for key in props if isinstance(props, dict) else ():
                if key not in order:
                    order.append(key)
        optional = [k for k in [*order, *self._invented_keys(parts)] if k not in required]
        optional = list(dict.fromkeys(optional))
        # Key sets: the required keys filled up to minProperties in order, then each optional key
        # in turn with the required ones (filled from the keys after it), then each added to the
        # first set.
        sets = [self._filled(required, optional, min_props)]
        for i, key in enumerate(optional[:NUM_KEYS]):
            sets.append(self._filled([*required, key], optional[i + 1 :], min_props))
        for key in optional[:NUM_KEYS]:
            if key not in sets[0]:
                sets.append([*sets[0], key])
        for i, key in enumerate(optional[:NUM_KEYS]):  # two optional keys together
            sets += [self._filled([*required, key, other], [], 0) for other in optional[i + 1 : NUM_KEYS]]
        tried: set[tuple[str, ...]] = set()
        for keys in sets:
            keys, with_deps = self._required(parts, keys)
            if tuple(keys) in tried:
                continue
            tried.add(tuple(keys))
            yield from self._objects_with(with_deps, keys, order, depth)

    @staticmethod
    def _filled(keys: list[str], more: list[str], count: int) -> list[str]:
        out = list(dict.fromkeys(keys))
        for key in more:
            if len(out) >= count:
                break
            if key not in out:
                out.append(key)
        return out

    def _required(self, parts: list[Part], keys: list[str]) -> tuple[list[str], list[Part]]:
        """``keys`` plus the keys the conjunction requires, closed under ``dependentRequired``,
        ``dependencies`` (both forms) and ``dependentSchemas`` (whose subschemas then join the
        conjunction)."""
        out = list(dict.fromkeys(keys))
        parts = list(parts)
        joined: set[int] = set()
        changed = True
        while changed:
            changed = False
            for schema, resolver in list(parts):
                needed = schema.get("required")
                for key in needed if isinstance(needed, list) else ():
                    if isinstance(key, str) and key not in out:
                        out.append(key)
                        changed = True
                for word in ("dependentRequired", "dependencies", "dependentSchemas"):
                    deps = schema.get(word)
                    for key, dep in deps.items() if isinstance(deps, dict) else ():
                        if key not in out:
                            continue
                        if isinstance(dep, list):
                            for extra in dep:
                                if isinstance(extra, str) and extra not in out:
                                    out.append(extra)
                                    changed = True
                        elif isinstance(dep, dict) and id(dep) not in joined:
                            joined.add(id(dep))
                            more = self._flatten_all([(dep, resolver)])
                            if more is not None:
                                parts += more
                                changed = True
        return out, parts

    def _objects_with(
        self, parts: list[Part], keys: list[str], order: list[str], depth: int
    ) -> Iterator[dict[str, Any]]:
        keys = sorted(keys, key=lambda k: order.index(k) if k in order else len(order))
        members: list[_Lazy] = []
        for key in keys:
            member = self._member(member_subschemas(parts, key, _search), depth + 1)
            if member is None:
                return
            members.append(member)
        first = [m.get(0) for m in members]
        if any(v is _END for v in first):
            return
        yield dict(zip(keys, first, strict=True))
        for j, member in enumerate(members):  # one member varied at a time
            for i in range(1, NUM_VALUES):
                value = member.get(i)
                if value is _END:
                    break
                yield dict(zip(keys, [*first[:j], value, *first[j + 1 :]], strict=True))

    @staticmethod
    def _invented_keys(parts: list[Part]) -> list[str]:
        """Keys no ``properties`` of the conjunction names, from anywhere in its subschemas
        (``not`` and ``anyOf`` branches included, ``$ref`` targets not): ``required`` and
        ``properties`` keys, ``dependencies`` keys, ``patternProperties`` and ``propertyNames``
        patterns, ``const`` and ``enum`` strings under ``propertyNames``; then short letters."""
        hinted: list[str] = []
        patterns: list[str] = []
        for schema, _ in parts:
            _key_hints(schema, hinted, 0, False, patterns)
        # First, keys that match several of the patterns at once (``patternProperties`` under
        # ``allOf``), some long enough to miss a short-key pattern whose value is ``false``.
        keys: list[str] = []
        patterns = list(dict.fromkeys(patterns))[:NUM_KEYS]
        for i, first in enumerate(patterns):
            for second in patterns[i + 1 :]:
                for length in (0, 4):
                    keys += list(composed_strings([first, second], length))
        return list(dict.fromkeys([*keys, *hinted, *"abcdefgh"]))


def _string_hints(schema: Any, out: list[str], depth: int) -> None:
    """Strings from anywhere in ``schema`` (its ``$ref`` targets not): ``const`` and ``enum``
    strings, one string per ``pattern``."""
    if depth > 8 or not isinstance(schema, dict):
        return
    if isinstance(schema.get("const"), str):
        out.append(schema["const"])
    if isinstance(schema.get("enum"), list):
        out += [v for v in schema["enum"] if isinstance(v, str)]
    if isinstance(schema.get("pattern"), str):
        out += pattern_strings(schema["pattern"], 0)[:1]
    for sub in applicable_subschemas(schema):
        _string_hints(sub, out, depth + 1)


def _number_hints(schema: Any, out: list[float], depth: int) -> None:
    """Numbers from anywhere in ``schema`` (its ``$ref`` targets not): bounds (and one past the
    exclusive ones), ``multipleOf`` steps, numeric ``const`` and ``enum`` values."""
    if depth > 8 or not isinstance(schema, dict):
        return
    for word, shift in (("minimum", 0), ("maximum", 0), ("exclusiveMinimum", 1), ("exclusiveMaximum", -1)):
        value = schema.get(word)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append(value + shift)
    step = schema.get("multipleOf")
    if isinstance(step, (int, float)) and not isinstance(step, bool):
        out.append(step)
    values = [schema["const"]] if "const" in schema else schema.get("enum", [])
    out += (
        [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if isinstance(values, list)
        else []
    )
    for sub in applicable_subschemas(schema):
        _number_hints(sub, out, depth + 1)


def _key_hints(schema: Any, keys: list[str], depth: int, names: bool, out_patterns: list[str]) -> None:
    """Appends the keys ``schema`` suggests to ``keys`` and the key patterns it names to
    ``out_patterns``; ``names``: ``schema`` is (under) a ``propertyNames``."""
    if depth > 6 or not isinstance(schema, dict):
        return
    if names:  # a propertyNames subschema: its strings are keys
        if isinstance(schema.get("const"), str):
            keys.append(schema["const"])
        keys += (
            [k for k in schema.get("enum", ()) if isinstance(k, str)] if isinstance(schema.get("enum"), list) else []
        )
        if isinstance(schema.get("pattern"), str):
            keys += pattern_strings(schema["pattern"], 0)[:3]
            out_patterns.append(schema["pattern"])
    for key in schema.get("required", ()) if isinstance(schema.get("required"), list) else ():
        if isinstance(key, str):
            keys.append(key)
    for word in ("properties", "dependencies", "dependentRequired", "dependentSchemas"):
        value = schema.get(word)
        if isinstance(value, dict):
            keys += [k for k in value if isinstance(k, str)]
    by_pattern = schema.get("patternProperties")
    for pattern in by_pattern if isinstance(by_pattern, dict) else ():
        keys += pattern_strings(pattern, 0)[:3]
        out_patterns.append(pattern)
    for word in ("not", "if", "then", "else", "propertyNames"):
        _key_hints(schema.get(word), keys, depth + 1, names or word == "propertyNames", out_patterns)
    for word in ("anyOf", "oneOf", "allOf"):
        for branch in schema.get(word, ()) if isinstance(schema.get(word), list) else ():
            _key_hints(branch, keys, depth + 1, names, out_patterns)


def _distinct(lazies: list[_Lazy], taken: list[Any]) -> list[Any] | None:
    """One value from each of ``lazies`` (its first that differs from the values before it and
    from ``taken``), or None if one runs out within :data:`NUM_VALUES`."""
    seen = {json.dumps(v, sort_keys=True) for v in taken}
    out = []
    for lazy in lazies:
        for i in range(NUM_VALUES):
            value = lazy.get(i)
            if value is _END:
                return None
            key = json.dumps(value, sort_keys=True)
            if key not in seen:
                seen.add(key)
                out.append(value)
                break
        else:
            return None
    return out


def _search(pattern: str, key: str) -> bool:
    try:
        return re.search(pattern, key) is not None
    except re.error:
        return False


class _End:
    pass


_END: Any = _End()


class _Lazy:
    """A generator's values, kept as they come, read by index (several readers, no re-run)."""

    __slots__ = ("_it", "_values")

    def __init__(self, it: Iterator[Any]) -> None:
        self._it: Iterator[Any] | None = it
        self._values: list[Any] = []

    def get(self, i: int) -> Any:
        while len(self._values) <= i and self._it is not None:
            it, self._it = self._it, None  # no re-entry while it runs (a recursive schema)
            try:
                self._values.append(next(it))
            except StopIteration:
                return _END
            self._it = it
        return self._values[i] if i < len(self._values) else _END
