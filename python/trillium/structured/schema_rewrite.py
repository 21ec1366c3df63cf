"""JSON Schema -> a schema llguidance compiles + the checks that enforce what it had to drop.

llguidance refuses some keywords ("Unimplemented keys"), and some combinations of others. Rather
than refuse the request, :func:`prepare_schema` returns a :class:`PreparedSchema` with

* ``grammar_schema``: the schema rewritten until llguidance compiles it. Exact rewrites first
  (same instances accepted): ``enum``/``const`` narrowed to the values valid for their whole
  subschema, ``not`` pushed through to a complement llguidance understands, ``if``/``then``/
  ``else`` and ``dependentRequired``/``dependentSchemas``/``dependencies`` spelled with
  ``anyOf``. What remains is dropped, which only ever widens the schema, so
  **every instance valid for the schema is accepted by the grammar**;
* ``root``: the :class:`~trillium.structured.value_checks.CheckNode` tree over the ORIGINAL schema
  that checks what was dropped as values are generated (None when the grammar enforces it all), so
  **an output the grammar accepts and the checks pass is valid for the whole schema** (as
  ``jsonschema`` reads it, with the formats of ``structured.formats`` asserted);
* ``ignored_formats``: the formats the schema names that the server does not know: they are
  annotations (JSON Schema since 2019-09), accepted and ignored, or refused with
  ``strict_formats``. The known ones are compiled into the grammar (``structured.formats``).

The draft is the one ``$schema`` names; without one, Draft 2020-12 plus the draft-7 forms still
common in the wild (``dependencies``, ``items`` as a list with ``additionalItems``). What
llguidance still refuses after the static rewrites is found by compiling against a 257-token
byte vocabulary (tens of microseconds) and learning from its error, a few rounds at most.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import llguidance
import referencing.exceptions

from trillium.protocol.structured import JSON_OPTIONS
from trillium.structured.formats import FORMAT_CHECKER
from trillium.structured.schema_relax import DefaultValidator, Relaxer, RelaxOptions, SchemaDocument
from trillium.structured.value_checks import CheckContext, CheckNode

# What docs cite. Keywords llguidance compiles into the grammar (besides annotations); a
# subschema of them that uses a keyword below is still rewritten or checked.
GRAMMAR_KEYWORDS = frozenset(
    {"type", "enum", "const", "properties", "required", "additionalProperties", "patternProperties", "items"}
    | {"prefixItems", "additionalItems", "minItems", "maxItems", "minLength", "maxLength", "pattern", "format"}
    | {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "allOf", "anyOf", "oneOf"}
    | {"$ref", "$defs", "definitions", "minProperties", "maxProperties"}
)
# Keywords llguidance cannot compile (always, or in the case named): how they are kept.
CHECK_KEYWORDS: dict[str, str] = {
    "not": "rewritten to its complement (type, bounds, required, properties, contains, not/anyOf/allOf of those); otherwise checked",
    "if": "with then/else: anyOf[if+then, complement(if)+else] when the complement is exact; otherwise checked",
    "dependentRequired": "rewritten: anyOf[{properties:{a:false}}, {required:[a, ...]}] per key",
    "dependentSchemas": "rewritten like dependentRequired, with the subschema; checked if that is",
    "dependencies": "both forms, like dependentRequired/dependentSchemas (no $schema, or drafts 4-7)",
    "contains": "checked when the array completes (with minContains/maxContains)",
    "uniqueItems": "checked as each item completes (JSON equality: 1 == 1.0, true != 1)",
    "minProperties": (
        "checked when the object closes, if the object has optional properties or admits keys beyond"
        " its properties (the grammar would count a repeated key; a check refuses it)"
    ),
    "maxProperties": "checked at the separator asking for one member more (and each key), with optional properties",
    "propertyNames": "checked when the object completes",
    "unevaluatedProperties": "checked when the object completes",
    "unevaluatedItems": "checked when the array completes",
    "$dynamicRef": "checked when the value completes",
    "$recursiveRef": "checked when the value completes",
    "pattern": "regexes llguidance cannot compile or intersect (look-around, back-references): checked",
    "patternProperties": "overlapping patterns llguidance cannot intersect: checked with additionalProperties",
    "allOf": "recursive intersections deeper than llguidance's limit: checked",
    "oneOf": "compiled as anyOf; that only one branch matches is checked unless the branches are disjoint",
    "enum": "with other keywords: narrowed to the values valid for the whole subschema (exact)",
    "$ref": (
        "constraints beside a recursive $ref (llguidance cannot intersect them): a definition of their own"
        " (schema_split); checked where the document pins its subschemas ($id, anchors)"
    ),
}
# What cannot be enforced even by checks: the schema is refused with an error naming it.
REFUSED_KEYWORDS: dict[str, str] = {
    "$ref": "to a document other than the schema itself (nothing is fetched), where a check needs it",
    "pattern": "a regex Python's re module rejects (e.g. \\p{L}), in a schema that needs checks",
}

_MAX_ROUNDS = 24  # compile-and-learn rounds; each names at least one more thing to drop


class SchemaUnsatisfiable(ValueError):
    """No instance satisfies the schema."""


class UnenforceableSchema(ValueError):
    """The schema uses something neither the grammar nor the checks can enforce (named)."""


@dataclass(frozen=True)
class PreparedSchema:
    grammar_schema: dict[str, Any] | bool  # what llguidance compiles: accepts a superset
    root: CheckNode | None  # checks of the rest; None when the grammar enforces everything
    checked_keywords: list[str]  # sorted names of the keywords the checks enforce
    ignored_formats: list[str] = field(default_factory=list)  # sorted unknown formats (annotations)


def prepare_schema(
    schema: dict[str, Any] | bool, *, exact_one_of: bool = True, strict_formats: bool = False
) -> PreparedSchema:
    """Rewrite ``schema`` for llguidance and build its checks (module docstring).

    ``exact_one_of``: check that exactly one ``oneOf`` branch matches where the branches are not
    provably disjoint by type, enum or a required property's const (the grammar compiles
    ``oneOf`` as ``anyOf``); False keeps llguidance's approximation. ``strict_formats``: refuse
    a format the server does not know (UnknownFormat) instead of ignoring it. Raises
    SchemaUnsatisfiable, UnenforceableSchema, UnknownFormat, or ValueError for a schema that is
    not an object or boolean. When
    llguidance rejects the schema for a reason no rewrite addresses, the returned grammar schema
    still fails to compile, with llguidance's own message. ``schema`` must not be mutated while
    the result is in use (checks find its subschemas by identity).

    Blocking: it compiles probe grammars (median 0.3 ms, tens of ms for large schemas); call it
    where the grammar is compiled. The result is immutable but for caches that only ever gain
    equal entries, so one PreparedSchema may serve concurrent requests.
    """
    if schema is True:
        schema = {}
    if schema is False:
        raise SchemaUnsatisfiable("the schema is false: no value is valid")
    if not isinstance(schema, dict):
        raise ValueError(f"a JSON schema must be an object or a boolean, got {type(schema).__name__}")
    try:
        doc = SchemaDocument(schema)
    except (TypeError, AttributeError, ValueError, referencing.exceptions.Unresolvable):
        return PreparedSchema(schema, None, [])  # a malformed $schema or $id: llguidance has the say
    options = RelaxOptions(strict_formats=strict_formats)
    for _ in range(_MAX_ROUNDS):
        relaxer = Relaxer(doc, options, exact_one_of)
        grammar = relaxer.with_ref_targets(relaxer.relax(schema, doc.resolver))
        if grammar is False:
            raise SchemaUnsatisfiable("no value is valid for the schema")
        error = llguidance_error(grammar)
        if error is not None and "nsatisfiable" in error:
            raise SchemaUnsatisfiable(f"no value is valid for the schema ({error.strip()})")
        if error is None or not _learn(options, error, doc, relaxer):
            break
    marks, tainted, unresolved = relaxer.settle()
    root = None
    if id(schema) in tainted:
        if unresolved:
            raise UnenforceableSchema(f"$ref {unresolved[0]!r} cannot be resolved, and the schema needs checks")
        for pattern in doc.patterns(relaxer.reached.values()):  # jsonschema's checks use Python's re
            try:
                re.compile(pattern)
            except re.error as exc:
                raise UnenforceableSchema(f"pattern {pattern!r} cannot be checked: {exc}") from None
        ctx = CheckContext(doc.validator, doc.specification, marks, tainted, relaxer.exact)
        root = ctx.node_for([(schema, doc.resolver)])
    checked = sorted({word for key, words in marks.items() if key in relaxer.reached for word in words})
    return PreparedSchema(grammar, root, checked if root is not None else [], sorted(relaxer.ignored_formats))


def schema_validator(schema: dict[str, Any] | bool) -> Any:
    """The ``jsonschema`` validator the checks read ``schema`` with: the draft its ``$schema``
    names, else Draft 2020-12 plus ``dependencies`` and ``items`` as a list; the known formats
    asserted."""
    return jsonschema.validators.validator_for(schema, default=DefaultValidator)(schema, format_checker=FORMAT_CHECKER)


def llguidance_error(grammar_schema: dict[str, Any] | bool) -> str | None:
    """llguidance's error compiling ``grammar_schema`` (with our JSON options), or None."""
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(grammar_schema), defaults=JSON_OPTIONS)
    except ValueError as exc:
        return str(exc)
    return llguidance.LLMatcher.validate_grammar(grammar, _probe_tokenizer()) or None


def _learn(options: RelaxOptions, error: str, doc: SchemaDocument, relaxer: Relaxer) -> bool:
    """Widen the options for llguidance's ``error`` (met compiling ``relaxer``'s grammar); False
    if nothing new can be dropped."""
    if error.startswith("Unimplemented keys:"):
        new = set(re.findall(r'"([^"]+)"', error)) - options.unsupported
        options.unsupported |= new
        return bool(new)
    if "min/maxProperties" in error and options.min_max_properties < 2:
        options.min_max_properties += 1
        return True
    if "intersection stack" in error:  # first drop our own allOfs, then trim the schema's
        if options.rewrites:
            options.rewrites = False
            return True
        if not options.trim_all_of:
            options.trim_all_of = True
            return True
        return False
    if error.startswith("circular references with sibling keys"):
        target = "#" + error.rpartition("#")[2].strip()
        target = relaxer.splitter.origin.get(target, target)  # a split's definition: its site's $ref
        if target not in options.split_refs and doc.movable:  # exact: the siblings stay in the grammar
            options.split_refs.add(target)
            return True
        if options.rewrites:  # our allOfs beside recursive properties
            options.rewrites = False
            return True
        if target not in options.bare_refs:
            options.bare_refs.add(target)
            return True
        if not options.all_bare_refs:
            options.all_bare_refs = True
            return True
        changed = not options.checked_pattern_properties  # the intersection is deeper
        options.checked_pattern_properties = True
        return changed
    # Regex errors quote the regex as /.../, or on the line after "regex parse error:".
    named = {
        p for p in doc.patterns() if f"\n    {p}\n" in error or any(f"/{q}/" in error for q in _unanchored(p))
    } - options.bad_regexes
    options.bad_regexes |= named
    return bool(named)


def _unanchored(pattern: str) -> set[str]:
    """How llguidance may quote ``pattern`` in an error (search regexes lose ^ and $)."""
    head = pattern[1:] if pattern.startswith("^") else pattern
    tail = pattern[:-1] if pattern.endswith("$") and not pattern.endswith("\\$") else pattern
    both = head[:-1] if head.endswith("$") and not head.endswith("\\$") else head
    return {pattern, head, tail, both}


class _ByteVocabulary:
    """One token per byte and an EOS: enough for llguidance to report what it cannot compile
    (without a tokenizer it skips those checks)."""

    eos_token_id = 256
    bos_token_id = None
    tokens = [bytes([i]) for i in range(256)] + [b"<eos>"]
    special_token_ids = (256,)

    def __call__(self, text: str | bytes) -> list[int]:
        return list(text if isinstance(text, bytes) else text.encode())


_PROBE: list[llguidance.LLTokenizer] = []  # built once, on first use (a race builds two: harmless)


def _probe_tokenizer() -> llguidance.LLTokenizer:
    if not _PROBE:
        _PROBE.append(llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteVocabulary()), slices=[]))
    return _PROBE[0]
