"""Checks that generated JSON satisfies the parts of a JSON Schema its grammar cannot enforce.

:func:`~trillium.structured.schema_rewrite.prepare_schema` relaxes a schema until llguidance
compiles it and records which keywords were dropped ("marks"). This module enforces them on the
output: a :class:`CheckNode` stands for the ORIGINAL subschemas that apply at one position of the
instance, and a :class:`ValueChecker` parses the output as it is generated, follows the nodes down
the values, and runs a node's checks when its value completes::

    {"tags":["a","b","a"],"n":1}
             ^ hold_from while an item of a uniqueItems array is open (here the first)
                     ^ the third item completes: CheckFailure(..., value_start=17)

A node exists only where a check is needed at or below it, so values of ordinary subschemas cost
only the parse. A node validates its whole value with ``jsonschema`` ("whole" check) only when
one of its subschemas has a mark that no child node covers: a dropped keyword of its own, or one
inside an ``anyOf``/``oneOf``/``not``/``if`` branch (which branch applies is known only once the
value is complete). ``uniqueItems`` and ``maxProperties`` are checked early, as each item or key
completes; ``minProperties`` when the object closes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import referencing

Resolver = Any  # a referencing Resolver: the package does not export the class

MEMO_BYTES = 1 << 18  # what a node's memo of check results may hold: JSON text + entry overhead
_MEMO_ENTRY_BYTES = 100  # a dict slot, the bytes object's header, the message reference
_checks_run = 0  # checks_run()

# Marks a node enforces itself without validating the whole value.
_NATIVE_MARKS = frozenset({"uniqueItems", "minProperties", "maxProperties"})
# Subschemas whose constraints depend on more than the position (which branch, which keys):
# a node cannot hand them to a child, so a mark inside one makes the node check its whole value.
_OPAQUE_ONE = ("not", "if", "then", "else", "contains", "propertyNames", "unevaluatedItems", "unevaluatedProperties")
_OPAQUE_LISTS = ("anyOf", "oneOf")
_OPAQUE_MAPS = ("dependentSchemas", "dependencies")


def applicable_subschemas(schema: dict[str, Any]) -> Iterator[Any]:
    """Every subschema of ``schema`` that applies to its instance or a part of it (so not
    ``$defs``: those apply only through a ``$ref``, which callers resolve themselves)."""
    for word in ("properties", "patternProperties", "dependentSchemas", "dependencies"):
        value = schema.get(word)
        if isinstance(value, dict):
            yield from (sub for sub in value.values() if isinstance(sub, (dict, bool)))
    for word in ("allOf", "anyOf", "oneOf", "prefixItems", "items"):
        value = schema.get(word)
        if isinstance(value, list):
            yield from value
    for word in ("items", "additionalProperties", "additionalItems", *_OPAQUE_ONE):
        value = schema.get(word)
        if isinstance(value, (dict, bool)):
            yield value


def _opaque_subschemas(schema: dict[str, Any]) -> Iterator[Any]:
    for word in _OPAQUE_ONE:
        if word in schema:
            yield schema[word]
    for word in _OPAQUE_LISTS:
        value = schema.get(word)
        if isinstance(value, list):
            yield from value
    for word in _OPAQUE_MAPS:
        value = schema.get(word)
        if isinstance(value, dict):
            yield from value.values()


class CheckContext:
    """What every node of one prepared schema shares: the root validator (its draft and its
    ``$ref`` registry), the marks, and the nodes made so far. Built by ``prepare_schema``; the
    schema document must not be mutated afterwards (marks are keyed by ``id()`` of its dicts)."""

    def __init__(
        self,
        validator: Any,  # a jsonschema validator of the root schema
        specification: referencing.Specification[Any],
        marks: dict[int, frozenset[str]],
        tainted: set[int],
        exact: set[int],
    ) -> None:
        self.validator = validator
        self.specification = specification
        self.marks = marks  # id(dict) -> keywords of that dict enforced by checks
        self.tainted = tainted  # ids of dicts from which a mark is reachable
        self.exact = exact  # ids of dicts the grammar enforces entirely (narrowed enums)
        self.legacy_ref = "dependentRequired" not in validator.VALIDATORS  # to draft 7 $ref hides siblings
        self.prefix_items = "prefixItems" in validator.VALIDATORS
        self._nodes: dict[tuple[int, ...], CheckNode | None] = {}
        self._regexes: dict[str, re.Pattern[str]] = {}

    def regex(self, pattern: str) -> re.Pattern[str]:
        compiled = self._regexes.get(pattern)
        if compiled is None:
            compiled = self._regexes[pattern] = re.compile(pattern)
        return compiled

    def is_tainted(self, schema: Any) -> bool:
        return isinstance(schema, dict) and id(schema) in self.tainted

    def node_for(self, schemas: list[tuple[Any, Resolver]]) -> CheckNode | None:
        """The node for a position where all of ``schemas`` apply, or None if nothing at or below
        it needs a check."""
        key = tuple(id(schema) for schema, _ in schemas)
        if key in self._nodes:
            return self._nodes[key]
        parts: list[tuple[dict[str, Any], Resolver]] = []
        seen: set[int] = set()
        for schema, resolver in schemas:
            self._flatten(schema, resolver, parts, seen)
        node = CheckNode(self, schemas, parts) if any(id(p) in self.tainted for p, _ in parts) else None
        self._nodes[key] = node
        return node

    def _flatten(
        self, schema: Any, resolver: Resolver, parts: list[tuple[dict[str, Any], Resolver]], seen: set[int]
    ) -> None:
        """Appends the conjuncts of ``schema`` but those the grammar enforces entirely."""
        flatten_conjuncts(schema, resolver, self.specification, self.legacy_ref, parts, seen, self.exact)


def flatten_conjuncts(
    schema: Any,
    resolver: Resolver,
    specification: referencing.Specification[Any],
    legacy_ref: bool,
    parts: list[tuple[dict[str, Any], Resolver]],
    seen: set[int],
    skip: set[int] | frozenset[int] = frozenset(),
) -> bool:
    """Appends the conjuncts of ``schema`` (itself, its ``allOf`` branches, its ``$ref`` target)
    with the resolver each is read with, but those whose ``id`` is in ``skip`` (and what only
    they lead to); ``legacy_ref``: ``$ref`` replaces its siblings (up to draft 7). False if one
    of them is the ``false`` schema (no value is valid there)."""
    if schema is False:
        return False
    if not isinstance(schema, dict) or id(schema) in seen or id(schema) in skip:
        return True
    seen.add(id(schema))
    resolver = resolver.in_subresource(specification.create_resource(schema))
    ok = True
    ref = schema.get("$ref")
    if isinstance(ref, str):
        target = resolver.lookup(ref)
        ok = flatten_conjuncts(target.contents, target.resolver, specification, legacy_ref, parts, seen, skip)
        if legacy_ref:
            return ok
    parts.append((schema, resolver))
    for branch in schema.get("allOf", ()) if isinstance(schema.get("allOf"), list) else ():
        ok = flatten_conjuncts(branch, resolver, specification, legacy_ref, parts, seen, skip) and ok
    return ok


def member_subschemas(
    parts: list[tuple[dict[str, Any], Resolver]], key: str, search: Callable[[str, str], bool]
) -> list[tuple[Any, Resolver]]:
    """The subschemas of ``parts`` (conjuncts of an object's schema) that apply to the value of
    its member ``key``: ``properties``, every ``patternProperties`` pattern that ``search``
    finds in the key, else ``additionalProperties``."""
    out: list[tuple[Any, Resolver]] = []
    for part, resolver in parts:
        matched = False
        properties = part.get("properties")
        if isinstance(properties, dict) and key in properties:
            out.append((properties[key], resolver))
            matched = True
        patterns = part.get("patternProperties")
        if isinstance(patterns, dict):
            for pattern, schema in patterns.items():
                if search(pattern, key):
                    out.append((schema, resolver))
                    matched = True
        if not matched and "additionalProperties" in part:
            out.append((part["additionalProperties"], resolver))
    return out


def item_subschemas(
    parts: list[tuple[dict[str, Any], Resolver]], index: int, prefix_items: bool
) -> list[tuple[Any, Resolver]]:
    """The subschemas of ``parts`` (conjuncts of an array's schema) that apply to item
    ``index``; ``prefix_items``: the draft has ``prefixItems`` (2020-12)."""
    out: list[tuple[Any, Resolver]] = []
    for part, resolver in parts:
        items = part.get("items")
        prefix = part.get("prefixItems") if prefix_items else None
        if isinstance(items, list):  # the tuple form of drafts 4 to 2019-09
            if index < len(items):
                out.append((items[index], resolver))
            elif "additionalItems" in part:
                out.append((part["additionalItems"], resolver))
        elif isinstance(prefix, list) and index < len(prefix):
            out.append((prefix[index], resolver))
        elif items is not None:
            out.append((items, resolver))
    return out


class CheckNode:
    """The checks at one instance position: the original subschemas that apply there (validated
    together by :meth:`check`) and their conjuncts (``parts``) from which children are derived.
    Immutable but for the caches of children; build through :meth:`CheckContext.node_for`."""

    __slots__ = (
        "_ctx",
        "_schemas",
        "_parts",
        "_validators",
        "_keys",
        "_indexes",
        "_num_prefix",
        "whole",
        "unique_items",
        "min_properties",
        "max_properties",
        "holds",
        "_memo",
        "_memo_bytes",
    )

    def __init__(
        self, ctx: CheckContext, schemas: list[tuple[Any, Resolver]], parts: list[tuple[dict[str, Any], Resolver]]
    ) -> None:
        self._ctx = ctx
        self._schemas = schemas
        self._parts = parts
        self._validators: list[Any] | None = None
        self._keys: dict[str, CheckNode | None] = {}
        self._indexes: dict[int, CheckNode | None] = {}
        self._memo: dict[bytes, str | None] = {}  # check_text's results by JSON text
        self._memo_bytes = 0
        marks: set[str] = set()
        min_properties: list[int] = []
        max_properties: list[int] = []
        opaque_taint = False
        num_prefix = 0
        for part, _ in parts:
            own = ctx.marks.get(id(part), frozenset())
            marks |= own
            if "minProperties" in own:
                min_properties.append(int(part["minProperties"]))
            if "maxProperties" in own:
                max_properties.append(int(part["maxProperties"]))
            opaque_taint = opaque_taint or any(ctx.is_tainted(sub) for sub in _opaque_subschemas(part))
            for word in ("items", "prefixItems"):
                if isinstance(part.get(word), list):
                    num_prefix = max(num_prefix, len(part[word]))
        self._num_prefix = num_prefix
        self.whole = bool(marks - _NATIVE_MARKS) or opaque_taint  # validate the completed value
        self.unique_items = "uniqueItems" in marks  # items must differ: checked as each completes
        self.min_properties = max(min_properties) if min_properties else None  # checked on close
        self.max_properties = min(max_properties) if max_properties else None  # checked per key
        self.holds = self.whole or self.min_properties is not None  # may fail once it completes

    @property
    def schemas(self) -> list[tuple[Any, Resolver]]:
        """The subschemas that apply at this position (with the resolver each is read with)."""
        return self._schemas

    @property
    def context(self) -> CheckContext:
        return self._ctx

    def check(self, value: Any) -> str | None:
        """None if ``value`` is valid for the subschemas of this position, else why not."""
        if self._validators is None:
            base = self._ctx.validator
            self._validators = [base.evolve(schema=schema, _resolver=resolver) for schema, resolver in self._schemas]
        for validator in self._validators:
            try:
                error = next(iter(validator.iter_errors(value)), None)
            except Exception as exc:  # a schema jsonschema cannot evaluate: never let the value pass
                return f"the value could not be checked against the schema: {exc}"
            if error is not None:
                where = "".join(f"[{step!r}]" for step in error.absolute_path)
                return f"{error.message} (at value{where})" if where else error.message
        return None

    def check_text(self, text: bytes) -> str | None:
        """:meth:`check` of the value whose JSON text is ``text`` (:data:`NOT_JSON` if it does not
        parse). Memoized per node (up to :data:`MEMO_BYTES` of text): a closing search and the
        guard's replays validate the same values again and again, and a recursive schema's
        validation can take milliseconds. Counted in :func:`checks_run`, hits included."""
        global _checks_run
        _checks_run += 1
        message = self._memo.get(text, _UNSET)
        if message is not _UNSET:
            return message  # type: ignore[no-any-return]
        value = _load(text)
        message = self.check(value) if value is not _UNSET else NOT_JSON
        size = len(text) + _MEMO_ENTRY_BYTES
        if self._memo_bytes + size > MEMO_BYTES:
            self._memo.clear()
            self._memo_bytes = 0
        self._memo[text] = message
        self._memo_bytes += size
        return message

    def child_for_key(self, key: str) -> CheckNode | None:
        """The node for the value of member ``key`` of this (object) value, or None."""
        if key in self._keys:
            return self._keys[key]
        schemas = member_subschemas(self._parts, key, lambda pattern, k: bool(self._ctx.regex(pattern).search(k)))
        child = self._keys[key] = self._ctx.node_for(schemas)
        return child

    def child_for_index(self, index: int) -> CheckNode | None:
        """The node for item ``index`` of this (array) value, or None."""
        index = min(index, self._num_prefix)  # every item past the tuple prefixes is alike
        if index in self._indexes:
            return self._indexes[index]
        schemas = item_subschemas(self._parts, index, self._ctx.prefix_items)
        child = self._indexes[index] = self._ctx.node_for(schemas)
        return child


NOT_JSON = "the output is not JSON"


@dataclass(frozen=True, slots=True)
class CheckFailure:
    """The output violates the schema. ``value_start`` is the byte offset (in the whole output) of
    the first byte of the value that failed: for a duplicate item or an object member past
    ``maxProperties`` that is the item or the member's key, otherwise the value whose check failed.
    Output before it is a prefix that this check alone does not rule out. Messages of output that
    does not parse start with :data:`NOT_JSON` (a grammar never lets that happen)."""

    message: str
    value_start: int


class _Frame:
    """One open object or array."""

    __slots__ = ("is_object", "node", "start", "count", "member_start", "child", "seen")

    def __init__(self, is_object: bool, node: CheckNode | None, start: int) -> None:
        self.is_object = is_object
        self.node = node
        self.start = start  # offset of its '{' or '['
        self.count = 0  # items completed, or keys completed
        self.member_start = -1  # offset of the current item, or of the current key
        self.child: CheckNode | None = None  # node of the member value being parsed
        self.seen: set[Any] = set()  # canonical items (uniqueItems), or an object's keys

    def copy(self) -> _Frame:
        other = _Frame(self.is_object, self.node, self.start)
        other.count, other.member_start, other.child, other.seen = (
            self.count,
            self.member_start,
            self.child,
            set(self.seen),
        )
        return other


# Parser states: what the next byte may be.
_VALUE, _VALUE_OR_CLOSE, _KEY, _KEY_OR_CLOSE, _COLON, _AFTER, _STRING, _NUMBER, _LITERAL, _END = range(10)
_SCALAR_STATES = (_STRING, _NUMBER, _LITERAL)
_WHITESPACE = frozenset(b" \t\r\n")
_NUMBER_START = frozenset(b"-0123456789")
_STRING_STOP = re.compile(rb'["\\]')
_NUMBER_STOP = re.compile(rb"[^0-9eE+\-.]")
_LITERAL_LEN = {ord("t"): 4, ord("f"): 5, ord("n"): 4}
_UNSET: Any = object()


class ValueChecker:
    """Parses one request's output (compact JSON, token by token) and runs the checks of
    ``root`` (None: parse only) as values complete. Not thread-safe; one per request. After a
    failure the state is undefined (feed keeps returning the failure) until :meth:`reset`; to roll
    back, ``reset()`` and feed the kept bytes again. ``trailing``: bytes after the complete value
    (``value_end``) are left unparsed -- a tool call's object is followed by the call's closing
    text -- instead of failing as not JSON."""

    def __init__(self, root: CheckNode | None, *, trailing: bool = False) -> None:
        self._root = root
        self._trailing = trailing
        self.reset()

    def reset(self) -> None:
        self._buf = bytearray()
        self._pos = 0  # next byte to parse; may pass the end by one after a split escape
        self._stack: list[_Frame] = []
        self._state = _VALUE
        self._scalar_start = 0
        self._scalar_node: CheckNode | None = None
        self._is_key = False
        self._literal_left = 0
        self._failure: CheckFailure | None = None
        self.value_end: int | None = None  # offset past the top-level value, once it is complete

    def copy(self) -> ValueChecker:
        """An independent checker in the same state (the nodes are shared: they are immutable)."""
        other = ValueChecker.__new__(ValueChecker)
        other.__dict__.update(self.__dict__)
        other._buf = bytearray(self._buf)
        other._stack = [frame.copy() for frame in self._stack]
        return other

    @property
    def num_bytes(self) -> int:
        """Bytes fed since the last reset."""
        return len(self._buf)

    @property
    def open_values(self) -> list[tuple[int, CheckNode | None]]:
        """(byte offset where it begins, node) of each value still open, outermost first; a key
        being written counts (its node is None: it is no value)."""
        values = [(frame.start, frame.node) for frame in self._stack]
        if self._state in _SCALAR_STATES:
            values.append((self._scalar_start, None if self._is_key else self._scalar_node))
        return values

    @property
    def next_value_node(self) -> CheckNode | None:
        """Where a value is to start next (the output's start, after a ``:``, ``,`` or ``[``):
        the node of that value; None elsewhere, or where no check applies."""
        if self._failure is not None or self._state not in (_VALUE, _VALUE_OR_CLOSE):
            return None
        if not self._stack and self._buf.strip() != b"":
            return None  # the top-level value came already
        return self._node_of_next()

    def _node_of_next(self) -> CheckNode | None:
        """The node of the value that starts next: the root's, an object member's (its key was
        just parsed), or the next item's."""
        if not self._stack:
            return self._root
        frame = self._stack[-1]
        if frame.is_object:
            return frame.child
        return frame.node.child_for_index(frame.count) if frame.node is not None else None

    @property
    def hold_from(self) -> int | None:
        """Offset of the start of the outermost open value that a check may still reject, or None.
        Output before it is final as far as the checks go; output from it on may be rolled back."""
        last = len(self._stack) - 1
        in_scalar = self._state in _SCALAR_STATES
        for depth, frame in enumerate(self._stack):
            node = frame.node
            if node is None:
                continue
            if node.holds:
                return frame.start
            member_open = depth < last or (in_scalar and not self._is_key)
            if node.unique_items and not frame.is_object and member_open:
                return frame.member_start
        if in_scalar and self._is_key:
            return self._stack[-1].member_start  # a key may repeat an earlier one (_end_string)
        if in_scalar and self._scalar_node is not None and self._scalar_node.holds:
            return self._scalar_start
        return None

    def feed(self, data: bytes) -> CheckFailure | None:
        """Parse the bytes of one token; the first failure of a check, or None."""
        if self._failure is not None:
            return self._failure
        self._buf += data
        self._failure = self._parse()
        return self._failure

    def finish(self) -> CheckFailure | None:
        """The output ended: complete a pending top-level number. Returns a failure of its checks,
        or None (also when the output stopped inside a value: nothing more can be checked)."""
        if self._failure is None and self._state == _NUMBER and not self._stack:
            self._failure = self._complete(self._scalar_start, len(self._buf), self._scalar_node)
        return self._failure

    def _parse(self) -> CheckFailure | None:
        buf = self._buf
        end = len(buf)
        pos = self._pos
        while pos < end:
            state = self._state
            if state == _END and self._trailing:
                break
            if state == _STRING:
                stop = _STRING_STOP.search(buf, pos)
                if stop is None:
                    pos = end
                    break
                pos = stop.start()
                if buf[pos] == 0x5C:  # backslash: skip the escaped byte, even in the next token
                    pos += 2
                    continue
                pos += 1
                failure = self._end_string(pos)
            elif state == _NUMBER:
                stop = _NUMBER_STOP.search(buf, pos)
                if stop is None:
                    pos = end
                    break
                pos = stop.start()  # the byte after the number is parsed again in _AFTER
                failure = self._complete(self._scalar_start, pos, self._scalar_node)
            elif state == _LITERAL:
                step = min(self._literal_left, end - pos)
                self._literal_left -= step
                pos += step
                failure = (
                    self._complete(self._scalar_start, pos, self._scalar_node) if self._literal_left == 0 else None
                )
            else:
                failure = self._structural(buf[pos], pos)
                pos += 1
            if failure is not None:
                return failure
        self._pos = pos
        return None

    def _structural(self, byte: int, pos: int) -> CheckFailure | None:
        state = self._state
        if byte in _WHITESPACE:
            return None
        if state in (_VALUE, _VALUE_OR_CLOSE):
            if byte == 0x5D and state == _VALUE_OR_CLOSE:  # ']' of an empty array
                return self._close(pos, is_object=False)
            return self._start_value(byte, pos)
        if state in (_KEY, _KEY_OR_CLOSE):
            if byte == 0x22:  # '"'
                self._stack[-1].member_start = pos
                self._scalar_start = pos
                self._is_key = True
                self._state = _STRING
                return None
            if byte == 0x7D and state == _KEY_OR_CLOSE:  # '}' of an empty object
                return self._close(pos, is_object=True)
        elif state == _COLON and byte == 0x3A:
            self._state = _VALUE
            return None
        elif state == _AFTER:
            frame = self._stack[-1]
            if byte == 0x2C:  # ','
                node = frame.node
                limit = node.max_properties if frame.is_object and node is not None else None
                if limit is not None and frame.count >= limit:  # a separator asks for one member more
                    return CheckFailure(f"the object has more than {limit} properties", pos)
                self._state = _KEY if frame.is_object else _VALUE
                return None
            if byte == (0x7D if frame.is_object else 0x5D):
                return self._close(pos, frame.is_object)
        return CheckFailure(f"{NOT_JSON}: unexpected {chr(byte)!r} at byte {pos}", pos)

    def _start_value(self, byte: int, pos: int) -> CheckFailure | None:
        node = self._node_of_next()
        if self._stack and not self._stack[-1].is_object:
            self._stack[-1].member_start = pos
        if byte in (0x7B, 0x5B):  # '{' '['
            self._stack.append(_Frame(byte == 0x7B, node, pos))
            self._state = _KEY_OR_CLOSE if byte == 0x7B else _VALUE_OR_CLOSE
            return None
        self._scalar_start = pos
        self._scalar_node = node
        self._is_key = False
        if byte == 0x22:
            self._state = _STRING
        elif byte in _NUMBER_START:
            self._state = _NUMBER
        elif byte in _LITERAL_LEN:
            self._state = _LITERAL
            self._literal_left = _LITERAL_LEN[byte] - 1
        else:
            return CheckFailure(f"{NOT_JSON}: unexpected {chr(byte)!r} at byte {pos}", pos)
        return None

    def _end_string(self, end: int) -> CheckFailure | None:
        if not self._is_key:
            return self._complete(self._scalar_start, end, self._scalar_node)
        frame = self._stack[-1]
        frame.count += 1
        self._state = _COLON
        self._is_key = False
        # A repeated key: the parsed object keeps one of them, so the properties counted here
        # (min/maxProperties, dependencies, ...) and the ones a client sees would differ.
        raw = bytes(self._buf[frame.member_start : end])
        name = raw[1:-1].decode("utf-8", "replace") if b"\\" not in raw else self._load(frame.member_start, end)
        if name in frame.seen:
            return CheckFailure(f"duplicate key {raw.decode('utf-8', 'replace')} in an object", frame.member_start)
        frame.seen.add(name)
        node = frame.node
        if node is None:
            frame.child = None
            return None
        if node.max_properties is not None and frame.count > node.max_properties:
            return CheckFailure(f"the object has more than {node.max_properties} properties", frame.member_start)
        key = self._load(frame.member_start, end)
        if not isinstance(key, str):
            return CheckFailure(NOT_JSON, frame.member_start)
        frame.child = node.child_for_key(key)
        return None

    def _load(self, start: int, end: int) -> Any:
        return _load(self._buf[start:end])

    def _close(self, pos: int, is_object: bool) -> CheckFailure | None:
        frame = self._stack.pop()
        node = frame.node
        if node is not None and node.min_properties is not None and frame.count < node.min_properties:
            return CheckFailure(f"the object has fewer than {node.min_properties} properties", frame.start)
        return self._complete(frame.start, pos + 1, node)

    def _complete(self, start: int, end: int, node: CheckNode | None) -> CheckFailure | None:
        """The value at ``buf[start:end]`` is complete: run its checks and its parent's."""
        if node is not None and node.whole:
            message = node.check_text(bytes(self._buf[start:end]))
            if message is not None:
                return CheckFailure(message, start)
        if not self._stack:
            self._state = _END
            self.value_end = end
            return None
        self._state = _AFTER
        parent = self._stack[-1]
        if parent.is_object:
            return None
        parent.count += 1
        if parent.node is not None and parent.node.unique_items:
            value = self._load(start, end)
            if value is _UNSET:
                return CheckFailure(NOT_JSON, start)
            canonical = json_key(value)
            if canonical in parent.seen:
                return CheckFailure("the array's items must be unique: this item repeats an earlier one", start)
            parent.seen.add(canonical)
        return None


def _load(text: bytes | bytearray) -> Any:
    """The value of JSON ``text``, or _UNSET if it is not JSON (a lone "-", which the grammar may
    let end a number, or bytes that are not UTF-8)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested past Python's stack
        return _UNSET


def checks_run() -> int:
    """Whole-value checks run in this process so far (memoized ones included): work budgets
    compare it before and after, so that what a budget allows does not depend on the memo."""
    return _checks_run


def count_check() -> None:
    """Counts one check run elsewhere (a witness search's validation) in :func:`checks_run`."""
    global _checks_run
    _checks_run += 1


def json_key(value: Any) -> Any:
    """A hashable form under which JSON-equal values are equal: 1 and 1.0 alike, true and 1 not."""
    if isinstance(value, bool) or value is None:
        return ("literal", value)
    if isinstance(value, (int, float)):
        return ("number", value)  # Python compares and hashes 1 and 1.0 alike
    if isinstance(value, str):
        return ("string", value)
    if isinstance(value, list):
        return ("array", tuple(json_key(item) for item in value))
    return ("object", frozenset((key, json_key(item)) for key, item in value.items()))
