"""The rewriting pass of :func:`~trillium.structured.schema_rewrite.prepare_schema`.

:class:`Relaxer` walks an ORIGINAL schema once and returns its grammar form, which accepts at
least what the original accepts: a keyword llguidance cannot compile is rewritten into ones it can
(exactly where possible: complements of ``not``, ``if``/``then``/``else`` and the dependency
keywords as ``anyOf``, ``enum`` narrowed to its valid values), or else dropped and *marked*
(``marks``: id of the original dict -> the keywords the checks must enforce there). A known
``format`` becomes the ``pattern`` or bounds of ``structured.formats``, an unknown one is noted
and dropped; a ``$ref`` llguidance cannot intersect with its siblings gets a definition of its
own (``structured.schema_split``) or, failing that, its siblings are checked.
:class:`SchemaDocument` reads the schema as its draft (validator, ``$ref`` resolution).
"""

from __future__ import annotations

import functools
import math
import re
import urllib.parse
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import referencing
import referencing.exceptions
import referencing.jsonschema

from trillium.structured.formats import FORMAT_CHECKER, KNOWN_FORMATS, UnknownFormat, format_constraint
from trillium.structured.schema_split import IDENTITY_WORDS, RefSplitter, constrains, intersected_ref, movable
from trillium.structured.value_checks import Resolver, applicable_subschemas, json_key

# Keywords llguidance refuses outright (plus those it names in "Unimplemented keys" errors).
UNSUPPORTED = frozenset(
    {"not", "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies", "contains"}
    | {"minContains", "maxContains", "uniqueItems", "propertyNames", "unevaluatedProperties", "unevaluatedItems"}
    | {"$dynamicRef", "$recursiveRef"}
)
_IDENTITY = IDENTITY_WORDS
_TYPES = ("null", "boolean", "object", "array", "number", "string")
_MAX_DEPTH = 16  # $ref hops followed while negating or looking for an enum
_NEGATION_BUDGET = 4096  # subschemas negated in one pass; past it a complement is not attempted


def _legacy_dependencies(validator: Any, dependencies: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for name, dependency in dependencies.items():
        if name not in instance:
            continue
        if isinstance(dependency, list):
            for other in dependency:
                if other not in instance:
                    yield jsonschema.ValidationError(f"{other!r} is a dependency of {name!r}")
        else:
            yield from validator.descend(instance, dependency, schema_path=name)


_ITEMS_2020 = jsonschema.Draft202012Validator.VALIDATORS["items"]


def _tuple_items(validator: Any, items: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not isinstance(items, list):
        yield from _ITEMS_2020(validator, items, instance, schema)
    elif validator.is_type(instance, "array"):
        for index, (item, subschema) in enumerate(zip(instance, items)):
            yield from validator.descend(item, subschema, path=index, schema_path=index)


def _additional_items(validator: Any, additional: Any, instance: Any, schema: Any) -> Iterator[Any]:
    items = schema.get("items")
    if not isinstance(items, list) or not validator.is_type(instance, "array"):
        return
    for index in range(len(items), len(instance)):
        yield from validator.descend(instance[index], additional, path=index)


# No $schema: Draft 2020-12, plus the draft-7 spellings schemas without $schema still use.
DefaultValidator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    {"dependencies": _legacy_dependencies, "items": _tuple_items, "additionalItems": _additional_items},
)


class SchemaDocument:
    """The root schema read as its draft: validator, ``$ref`` resolver, keyword set."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = schema
        cls = jsonschema.validators.validator_for(schema, default=DefaultValidator)
        self.validator = cls(schema, format_checker=FORMAT_CHECKER)  # the formats the grammar enforces
        self.resolver: Resolver = self.validator._resolver  # the root as the base resource
        self.specification = referencing.jsonschema.specification_with(
            cls.ID_OF(cls.META_SCHEMA) or "urn:unknown-dialect", default=referencing.Specification.OPAQUE
        )
        self.keywords = frozenset(cls.VALIDATORS)
        self.legacy_ref = "dependentRequired" not in self.keywords  # up to draft 7: $ref hides siblings
        self.draft4_bounds = "exclusiveMinimum" not in self.keywords  # boolean exclusiveMinimum

    @functools.cached_property
    def movable(self) -> bool:
        """Subschemas may be copied elsewhere in the document (``schema_split.movable``)."""
        return movable(self.schema)

    def scope(self, schema: dict[str, Any], resolver: Resolver) -> Resolver:
        return resolver.in_subresource(self.specification.create_resource(schema))

    def lookup(self, ref: str, resolver: Resolver) -> tuple[Any, Resolver] | None:
        try:
            resolved = resolver.lookup(ref)
        except referencing.exceptions.Unresolvable:
            return None
        return resolved.contents, resolved.resolver

    def patterns(self, schemas: Iterable[Any] | None = None) -> Iterator[str]:
        """The regexes (``pattern``, ``patternProperties`` keys) of ``schemas``, or of every dict
        in the document (data included: this is for matching llguidance's messages)."""
        stack: list[Any] = [self.schema] if schemas is None else list(schemas)
        while stack:
            node = stack.pop()
            if isinstance(node, dict):
                if isinstance(node.get("pattern"), str):
                    yield node["pattern"]
                if isinstance(node.get("patternProperties"), dict):
                    yield from node["patternProperties"]
                if schemas is None:
                    stack.extend(node.values())
            elif isinstance(node, list) and schemas is None:
                stack.extend(node)


@dataclass
class RelaxOptions:
    """What to drop beyond the static list (prepare_schema widens it from llguidance's errors)."""

    rewrites: bool = True  # compound rewrites (not, if, dependent*); off if they overwhelm llguidance
    unsupported: set[str] = field(default_factory=lambda: set(UNSUPPORTED))
    min_max_properties: int = 0  # 1: drop those beside optional properties, 2: all of them
    trim_all_of: bool = False
    bad_regexes: set[str] = field(default_factory=set)  # `pattern` values, patternProperties keys
    split_refs: set[str] = field(default_factory=set)  # $refs whose sites get a definition (schema_split)
    bare_refs: set[str] = field(default_factory=set)  # $refs whose constraining siblings to drop
    all_bare_refs: bool = False
    # patternProperties beside properties (llguidance intersects a property's schema with each
    # pattern's it matches, references included): checked, with additionalProperties
    checked_pattern_properties: bool = False
    strict_formats: bool = False  # an unknown ``format`` is an error (UnknownFormat), not ignored


def _pointer_path(pointer: str) -> list[str]:
    return [urllib.parse.unquote(part).replace("~1", "/").replace("~0", "~") for part in pointer[2:].split("/")]


def _place(document: Any, path: list[str], value: Any) -> Any:
    """``document`` with ``value`` at ``path``, copying the containers on the way (they may be
    the caller's); ``document`` itself if the path does not exist or already holds ``value``."""
    if not path:
        return value
    key: Any = path[0]
    if isinstance(document, list) and key.isdigit() and int(key) < len(document):
        key = int(key)
    elif not (isinstance(document, dict) and key in document):
        return document
    inner = _place(document[key], path[1:], value)
    if inner is document[key]:
        return document
    copy = list(document) if isinstance(document, list) else dict(document)
    copy[key] = inner
    return copy


def _conj(*schemas: Any) -> Any:
    """allOf of grammar schemas, simplified (True and {} drop out, False absorbs)."""
    kept = [s for s in schemas if s is not True and s != {}]
    if any(s is False for s in kept):
        return False
    return kept[0] if len(kept) == 1 else {"allOf": kept} if kept else {}


def _disj(schemas: list[Any]) -> Any:
    """anyOf of grammar schemas, simplified."""
    kept = [s for s in schemas if s is not False]
    if any(s is True or s == {} for s in kept):
        return {}
    return kept[0] if len(kept) == 1 else {"anyOf": kept} if kept else False


_COUNT_BOUNDS = {  # bound -> (type, opposite bound, +1 if the opposite is a lower bound else -1)
    "minLength": ("string", "maxLength", -1),
    "maxLength": ("string", "minLength", 1),
    "minItems": ("array", "maxItems", -1),
    "maxItems": ("array", "minItems", 1),
    "minProperties": ("object", "maxProperties", -1),
    "maxProperties": ("object", "minProperties", 1),
}
_Negation = tuple[Any, bool, list[tuple[Any, Resolver]]]  # (wider-or-equal complement, exact, deps)


class Relaxer:
    """One pass over the schema: the grammar schema it returns, and ``marks`` (id of an original
    dict -> its keywords the grammar does not enforce). A rewrite that embeds relaxed subschemas
    is exact only if none of them is relaxed; those "deps" are settled once all marks are known."""

    def __init__(self, doc: SchemaDocument, options: RelaxOptions, exact_one_of: bool) -> None:
        self.doc = doc
        self.options = options
        self.exact_one_of = exact_one_of
        self.marks: dict[int, set[str]] = {}
        self.exact: set[int] = set()  # dicts replaced by their narrowed enum
        self.reached: dict[int, dict[str, Any]] = {}  # subschemas reachable from the root (by settle)
        self._deferred: list[tuple[dict[str, Any], str, list[tuple[Any, Resolver]]]] = []
        self._memo: dict[int, Any] = {}
        self._pointers: set[str] = set()  # "#/..." $refs met
        self._negation_budget = _NEGATION_BUDGET  # bounds schemas whose branches multiply
        self.ignored_formats: set[str] = set()  # unknown formats met (annotations only)
        defs = doc.schema.get("$defs")
        self.splitter = RefSplitter(
            options.split_refs if options.split_refs and doc.movable else set(),
            doc.keywords,
            doc.lookup,
            set(defs) if isinstance(defs, dict) else set(),
        )

    def relax(self, schema: Any, resolver: Resolver) -> Any:
        """The grammar form of ``schema``: accepts at least what it accepts. Raises UnknownFormat
        for a format it does not know with ``strict_formats``."""
        if not isinstance(schema, dict):
            return schema
        if id(schema) not in self._memo:
            self._note_format(schema)
            resolver = self.doc.scope(schema, resolver)
            narrowed = self._narrow_enum(schema, resolver)
            self._memo[id(schema)] = self._relax_dict(schema, resolver) if narrowed is None else narrowed
        return self._memo[id(schema)]

    def settle(self) -> tuple[dict[int, frozenset[str]], set[int], list[str]]:
        """(marks, ids of dicts that reach a mark, unresolvable $refs), deferred marks added."""
        edges: dict[int, list[int]] = {}
        unresolved: list[str] = []
        stack = [(self.doc.schema, self.doc.resolver)] + [dep for _, _, deps in self._deferred for dep in deps]
        while stack:
            node, resolver = stack.pop()
            if not isinstance(node, dict) or id(node) in edges:
                continue
            targets = edges[id(node)] = []
            self.reached[id(node)] = node
            if id(node) in self.exact:
                continue
            resolver = self.doc.scope(node, resolver)
            ref = node.get("$ref")
            found = self.doc.lookup(ref, resolver) if isinstance(ref, str) else None
            if isinstance(ref, str) and found is None:
                unresolved.append(ref)
            subs = [found] if found is not None else []
            if not (self.doc.legacy_ref and isinstance(ref, str)):
                subs += [(sub, resolver) for sub in applicable_subschemas(node)]
            targets += [id(sub) for sub, _ in subs if isinstance(sub, dict)]
            stack += subs
        reverse: dict[int, list[int]] = {}
        for source, targets in edges.items():
            for target in targets:
                reverse.setdefault(target, []).append(source)
        while True:
            tainted = {key for key in self.marks if key in edges}
            frontier = list(tainted)
            while frontier:
                for source in reverse.get(frontier.pop(), ()):
                    if source not in tainted:
                        tainted.add(source)
                        frontier.append(source)
            late = [
                (schema, word)
                for schema, word, deps in self._deferred
                if word not in self.marks.get(id(schema), ()) and any(id(dep) in tainted for dep, _ in deps)
            ]
            if not late:
                return {key: frozenset(words) for key, words in self.marks.items()}, tainted, unresolved
            for schema, word in late:
                self._mark(schema, word)

    def with_ref_targets(self, grammar: Any) -> Any:
        """``grammar`` with the relaxed form of each target of a ``$ref`` pointer placed where
        the pointer leads, when that is not a subschema :meth:`relax` walked (``"#/foo/bar"``),
        and the definitions of the split sites (``schema_split``) in its root's ``$defs``."""
        done: set[str] = set()
        while True:
            pending = sorted(self._pointers - done)
            for pointer in pending:
                done.add(pointer)
                found = self.doc.lookup(pointer, self.doc.resolver)
                if found is not None and isinstance(found[0], dict):
                    grammar = _place(grammar, _pointer_path(pointer), self.relax(*found))
            made = self.splitter.definitions(self.relax)
            if made and isinstance(grammar, dict):
                defs = grammar.get("$defs")
                grammar = {**grammar, "$defs": {**(defs if isinstance(defs, dict) else {}), **made}}
            if not pending and not made:
                return grammar

    def _note_format(self, schema: dict[str, Any]) -> None:
        name = schema.get("format")
        if not isinstance(name, str) or "format" not in self.doc.keywords or format_constraint(name) is not None:
            return
        if self.options.strict_formats:
            raise UnknownFormat(
                f"format {name!r} is not one this server enforces (it refuses unknown formats; "
                f"known: {', '.join(sorted(KNOWN_FORMATS))})"
            )
        self.ignored_formats.add(name)

    def _mark(self, schema: dict[str, Any], word: str) -> None:
        self.marks.setdefault(id(schema), set()).add(word)

    def _settle(self, schema: dict[str, Any], word: str, exact: bool, deps: list[tuple[Any, Resolver]]) -> None:
        if not exact:
            self._mark(schema, word)
        elif deps:
            self._deferred.append((schema, word, deps))

    def _relax_dict(self, schema: dict[str, Any], resolver: Resolver) -> Any:
        options = self.options
        out: dict[str, Any] = {}
        conjuncts: list[Any] = []  # from rewrites; they join allOf
        formats: dict[str, Any] = {}  # the keywords enforcing a known format
        # A $ref llguidance cannot intersect (a recursive definition's, learned): the grammar
        # keeps the keyword holding it, and the checks the keywords beside it.
        bare = intersected_ref(schema, self.doc.keywords, lambda ref: options.all_bare_refs or ref in options.bare_refs)
        for word, value in schema.items():
            if bare is not None and constrains(word, value, self.doc.keywords) and word != bare[0]:
                self._mark(schema, word)
                continue
            if bare is not None and word == "allOf" and bare[0] == word:  # its other branches intersect it
                if len(value) > 1:
                    self._mark(schema, word)
                out[word] = [self.relax(bare[1], resolver)]
                continue
            if word == "format" and word in self.doc.keywords:
                formats = format_constraint(value) or {}
                continue
            if word in ("then", "else", "minContains", "maxContains") and word in options.unsupported:
                continue  # rewritten or checked with their if / contains
            if word in options.unsupported:
                conjuncts.append(self._rewrite(schema, word, value, resolver))
                continue
            if (
                (word in ("minProperties", "maxProperties") and self._drops_min_max_properties(schema))
                or (word == "minProperties" and _admits_other_keys(schema))
                or (word == "pattern" and value in options.bad_regexes)
                or (word in ("patternProperties", "additionalProperties") and self._has_bad_pattern_properties(schema))
            ):
                self._mark(schema, word)
                continue
            if (
                word == "oneOf"
                and self.exact_one_of
                and isinstance(value, list)
                and not self._disjoint(value, resolver)
            ):
                self._mark(schema, word)
            if word == "allOf" and options.trim_all_of and isinstance(value, list):
                value = self._trim_all_of(schema, value)
            if word == "$ref" and isinstance(value, str) and value.startswith("#/"):
                self._pointers.add(value)
            out[word] = self._relax_value(word, value, resolver)
        extra = [c for c in conjuncts if c is not True and c != {}]
        if any(c is False for c in extra):
            return False
        for word, value in formats.items():  # beside the schema's own keywords, or as a conjunct
            if word in schema:
                extra.append({word: value})
            else:
                out[word] = value
        if extra:
            out["allOf"] = [*out.get("allOf", []), *extra]
        site = None if bare is not None else self.splitter.site(schema, resolver)
        if site is not None:  # a $ref llguidance cannot intersect with the rest: a definition of its own
            branch = None if site[1] is None else self.relax(site[1], resolver)
            return self.splitter.placeholder(out, site, branch, resolver)
        return out

    def _relax_value(self, word: str, value: Any, resolver: Resolver) -> Any:
        if word in ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas"):
            return {k: self.relax(v, resolver) for k, v in value.items()} if isinstance(value, dict) else value
        if isinstance(value, list) and word in ("allOf", "anyOf", "oneOf", "prefixItems", "items"):
            return [self.relax(v, resolver) for v in value]
        if word in ("items", "additionalProperties", "additionalItems", "contains", "propertyNames"):
            return self.relax(value, resolver)
        return value

    def _rewrite(self, schema: dict[str, Any], word: str, value: Any, resolver: Resolver) -> Any:
        """The grammar conjunct standing for keyword ``word`` llguidance refuses ({} if none)."""
        if word not in self.doc.keywords:
            return {}  # not a keyword of this draft: no constraint
        if self.options.rewrites and word == "not":
            negation, exact, deps = self._negate(value, resolver, 0)
            self._settle(schema, word, exact, deps)
            return negation
        if self.options.rewrites and word == "if":
            return self._if_then_else(schema, resolver)
        if (
            self.options.rewrites
            and word in ("dependentRequired", "dependentSchemas", "dependencies")
            and isinstance(value, dict)
        ):
            return self._dependencies(schema, word, value, resolver)
        no_op = (
            (word == "uniqueItems" and value is False)
            or (word in ("propertyNames", "unevaluatedItems", "unevaluatedProperties") and value in (True, {}))
            or (word == "contains" and schema.get("minContains") == 0 and "minContains" in self.doc.keywords)
            or (word == "if" and "then" not in schema and "else" not in schema)
        )
        if not no_op:
            self._mark(schema, word)
        return {}

    def _if_then_else(self, schema: dict[str, Any], resolver: Resolver) -> Any:
        condition, then, otherwise = schema["if"], schema.get("then", True), schema.get("else", True)
        if then in (True, {}) and otherwise in (True, {}):
            return {}
        negation, exact, deps = self._negate(condition, resolver, 0)
        deps += [(condition, resolver), (then, resolver), (otherwise, resolver)]
        self._settle(schema, "if", exact, deps)
        return _disj(
            [
                _conj(self.relax(condition, resolver), self.relax(then, resolver)),
                _conj(negation, self.relax(otherwise, resolver)),
            ]
        )

    def _dependencies(self, schema: dict[str, Any], word: str, value: dict[str, Any], resolver: Resolver) -> Any:
        """Each dependency as anyOf[name absent, name present and what it requires]."""
        conjuncts: list[Any] = []
        deps: list[tuple[Any, Resolver]] = []
        for name, dependency in value.items():
            if isinstance(dependency, list):
                required: Any = {"required": [name, *dependency]} if dependency else {}
            else:
                deps.append((dependency, resolver))
                required = _conj({"required": [name]}, self.relax(dependency, resolver))
            if required != {}:
                conjuncts.append(_disj([{"properties": {name: False}}, required]))
        self._settle(schema, word, True, deps)
        return _conj(*conjuncts)

    def _negate(self, schema: Any, resolver: Resolver, depth: int) -> _Negation:
        """A grammar schema accepting at least every value ``schema`` rejects, whether that is
        exactly the complement, and the subschemas embedded relaxed (exact only if they are)."""
        if schema is True:
            return False, True, []
        if schema is False:
            return {}, True, []
        self._negation_budget -= 1
        if not isinstance(schema, dict) or depth > _MAX_DEPTH or self._negation_budget < 0:
            return {}, False, []
        resolver = self.doc.scope(schema, resolver)
        items = list(schema.items())
        if self.doc.legacy_ref and "$ref" in schema:
            items = [("$ref", schema["$ref"])]
        disjuncts: list[Any] = []
        exact = True
        deps: list[tuple[Any, Resolver]] = []
        for word, value in items:  # not (a and b and ...) = (not a) or (not b) or ...
            if word not in self.doc.keywords or (word == "format" and not format_constraint(value)):
                continue  # annotations constrain nothing
            negation = self._negate_word(schema, word, value, resolver, depth)
            if negation is None:
                return {}, False, []
            disjuncts += negation[0]
            exact = exact and negation[1]
            deps += negation[2]
        return _disj(disjuncts), exact, deps

    def _negate_word(
        self, schema: dict[str, Any], word: str, value: Any, resolver: Resolver, depth: int
    ) -> tuple[list[Any], bool, list[tuple[Any, Resolver]]] | None:
        """The disjuncts of the complement of one keyword; None if it has no grammar form."""
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if word == "type":
            names = [value] if isinstance(value, str) else value
            if not isinstance(names, list) or any(name not in (*_TYPES, "integer") for name in names):
                return None
            rest = [name for name in _TYPES if name not in names]
            # "not integer" includes non-integral numbers, which only "number" (wider) spells
            return ([{"type": rest}] if rest else []), "integer" not in names or "number" in names, []
        if word in _COUNT_BOUNDS and number:
            if word in ("minProperties", "maxProperties") and self.options.min_max_properties:
                return None
            kind, opposite, sign = _COUNT_BOUNDS[word]
            bound = math.floor(value) + 1 if sign > 0 else math.ceil(value) - 1
            return ([{"type": kind, opposite: bound}] if bound >= 0 else []), True, []
        if word in ("minimum", "maximum") and number:
            low = word == "minimum"
            legacy_exclusive = (
                self.doc.draft4_bounds and schema.get("exclusiveMinimum" if low else "exclusiveMaximum") is True
            )
            opposite = (
                ("maximum" if low else "minimum")
                if legacy_exclusive
                else ("exclusiveMaximum" if low else "exclusiveMinimum")
            )
            return [{"type": "number", opposite: value}], True, []
        if word in ("exclusiveMinimum", "exclusiveMaximum") and number:
            return [{"type": "number", "maximum" if word == "exclusiveMinimum" else "minimum": value}], True, []
        if word == "required" and isinstance(value, list):
            return [{"type": "object", "properties": {name: False}} for name in value], True, []
        if word in ("dependentRequired", "dependencies") and isinstance(value, dict):
            if not all(isinstance(names, list) for names in value.values()):
                return None
            return (
                [
                    {"type": "object", "required": [name], "properties": {other: False}}
                    for name, others in value.items()
                    for other in others
                ],
                True,
                [],
            )
        if word == "uniqueItems":
            return ([], True, []) if value is False else None
        if value in (True, {}) and word in ("propertyNames", "items", "additionalItems", "additionalProperties"):
            return [], True, []
        if word == "propertyNames" and value is False and not self.options.min_max_properties:
            return [{"type": "object", "minProperties": 1}], True, []
        if word == "items" and value is False:  # some item past the prefix exists
            prefix = schema.get("prefixItems", []) if "prefixItems" in self.doc.keywords else []
            return [{"type": "array", "minItems": len(prefix) + 1 if isinstance(prefix, list) else 1}], True, []
        if word in ("minContains", "maxContains", "then", "else") or (
            word == "if" and not {"then", "else"} & set(schema)
        ):
            return [], True, []  # alone they constrain nothing; with contains / if see there
        if word == "contains" and not {"minContains", "maxContains"} & set(schema):
            negation, exact, deps = self._negate(value, resolver, depth + 1)
            return [{"type": "array", "items": negation}], exact, deps
        if word == "properties" and isinstance(value, dict):
            disjuncts, exact, deps = [], True, []
            for name, subschema in value.items():
                negation, sub_exact, sub_deps = self._negate(subschema, resolver, depth + 1)
                if negation is not False:
                    disjuncts.append({"type": "object", "required": [name], "properties": {name: negation}})
                exact, deps = exact and sub_exact, deps + sub_deps
            return disjuncts, exact, deps
        if word in ("allOf", "anyOf") and isinstance(value, list):
            negations = [self._negate(branch, resolver, depth + 1) for branch in value]
            exact = all(n[1] for n in negations)
            deps = [dep for n in negations for dep in n[2]]
            if word == "allOf":
                return [n[0] for n in negations], exact, deps
            return [_conj(*(n[0] for n in negations))], exact, deps
        if word == "not":
            return [self.relax(value, resolver)], True, [(value, resolver)]
        if word == "$ref" and isinstance(value, str):
            found = self.doc.lookup(value, resolver)
            if found is None:
                return None
            negation, exact, deps = self._negate(found[0], found[1], depth + 1)
            return [negation], exact, deps
        return None

    def _drops_min_max_properties(self, schema: dict[str, Any]) -> bool:
        """llguidance takes min/maxProperties in some cases only, roughly when every listed
        property is required; which fail it tells, not which schema: drop those beside optional
        properties first, then all."""
        level = self.options.min_max_properties
        properties = schema.get("properties")
        required = schema.get("required")
        required = required if isinstance(required, list) else []
        return level >= 2 or (level == 1 and isinstance(properties, dict) and not set(properties) <= set(required))

    def _has_bad_pattern_properties(self, schema: dict[str, Any]) -> bool:
        patterns = schema.get("patternProperties")
        if self.options.checked_pattern_properties and isinstance(patterns, dict) and patterns:
            return isinstance(schema.get("properties"), dict) and bool(schema["properties"])
        return isinstance(patterns, dict) and not self.options.bad_regexes.isdisjoint(patterns)

    def _trim_all_of(self, schema: dict[str, Any], branches: list[Any]) -> list[Any]:
        """Keep one $ref branch: intersecting several recursive definitions overflows llguidance."""
        refs = [i for i, branch in enumerate(branches) if isinstance(branch, dict) and "$ref" in branch]
        if len(refs) < 2:
            return branches
        self._mark(schema, "allOf")
        return [branch for i, branch in enumerate(branches) if i not in refs[1:]]

    def _narrow_enum(self, schema: dict[str, Any], resolver: Resolver) -> Any:
        """``schema`` as the enum of its values valid for all of it, if it has an enum or const
        (itself, or through allOf/$ref) and more; None otherwise."""
        found = self._enum_values(schema, resolver)
        if found is None:
            return None
        values, own = found
        if own and not (set(schema) & self.doc.keywords) - {"enum", "const"}:
            return None
        try:
            validator = self.doc.validator.evolve(schema=schema, _resolver=resolver)
            kept = [value for value in values if validator.is_valid(value)]
        except (
            jsonschema.exceptions.SchemaError,
            referencing.exceptions.Unresolvable,
            re.error,
            TypeError,
            ValueError,
        ):
            return None  # keep the keywords: llguidance or the checks will meet the problem
        self.exact.add(id(schema))
        out = {word: self._relax_value(word, schema[word], resolver) for word in _IDENTITY if word in schema}
        if not kept and not out:
            return False
        out["enum"] = kept
        return out

    def _enum_values(
        self, schema: Any, resolver: Resolver, seen: set[int] | None = None
    ) -> tuple[list[Any], bool] | None:
        """(the values of the first enum/const among the conjuncts of ``schema``, whether it is
        ``schema``'s own), or None."""
        seen = set() if seen is None else seen
        if not isinstance(schema, dict) or id(schema) in seen:
            return None
        seen.add(id(schema))
        ref = schema.get("$ref")
        conjuncts: list[tuple[Any, Resolver]] = []
        found = self.doc.lookup(ref, self.doc.scope(schema, resolver)) if isinstance(ref, str) else None
        if not (self.doc.legacy_ref and isinstance(ref, str)):
            if "const" in schema and "const" in self.doc.keywords:
                return [schema["const"]], True
            if isinstance(schema.get("enum"), list):
                return list(schema["enum"]), True
            branches = schema.get("allOf")
            conjuncts += [(branch, resolver) for branch in branches] if isinstance(branches, list) else []
        conjuncts += [found] if found is not None else []
        for conjunct, conjunct_resolver in conjuncts:
            values = self._enum_values(conjunct, conjunct_resolver, seen)
            if values is not None:
                return values[0], False
        return None

    def _disjoint(self, branches: list[Any], resolver: Resolver) -> bool:
        """Whether no value can match two of ``branches`` (by type, by enum, or by the values
        of a required property): then anyOf is exactly oneOf."""
        summaries = [self._summary(branch, resolver) for branch in branches]
        return all(_apart(a, b) for i, a in enumerate(summaries) for b in summaries[i + 1 :])

    def _summary(self, schema: Any, resolver: Resolver) -> _Summary:
        for _ in range(_MAX_DEPTH):  # follow a chain of $refs
            if not (isinstance(schema, dict) and isinstance(schema.get("$ref"), str)):
                break
            found = self.doc.lookup(schema["$ref"], self.doc.scope(schema, resolver))
            if found is None or (not self.doc.legacy_ref and len(schema) > 1):
                break
            schema, resolver = found
        if schema is False:
            return frozenset(), None, {}
        if not isinstance(schema, dict):
            return None, None, {}
        values = _values_of(schema)
        kind = schema.get("type")
        types = frozenset([kind] if isinstance(kind, str) else kind) if isinstance(kind, (str, list)) else None
        if types is None and values is not None:
            types = frozenset(_json_type(value) for value in values)
        tags: dict[str, list[Any]] = {}
        properties = schema.get("properties")
        required = schema.get("required")
        if isinstance(properties, dict) and isinstance(required, list):
            for name in required:
                tag = _values_of(properties.get(name))
                if tag is not None:
                    tags[name] = tag
        return types, values, tags


_Summary = tuple[frozenset[str] | None, list[Any] | None, dict[str, list[Any]]]  # types, values, tags


def _values_of(schema: Any) -> list[Any] | None:
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return [schema["const"]]
    return list(schema["enum"]) if isinstance(schema.get("enum"), list) else None


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "integer" if float(value).is_integer() else "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object" if isinstance(value, dict) else "null"


def _apart(a: _Summary, b: _Summary) -> bool:
    types_a, values_a, tags_a = a
    types_b, values_b, tags_b = b
    if types_a is not None and types_b is not None:
        widened_a = types_a | ({"integer"} if "number" in types_a else set())
        widened_b = types_b | ({"integer"} if "number" in types_b else set())
        if widened_a.isdisjoint(widened_b):
            return True
    if values_a is not None and values_b is not None and _values_apart(values_a, values_b):
        return True
    return any(name in tags_b and _values_apart(values, tags_b[name]) for name, values in tags_a.items())


def _values_apart(a: list[Any], b: list[Any]) -> bool:
    return {json_key(value) for value in a}.isdisjoint(json_key(value) for value in b)


def _admits_other_keys(schema: dict[str, Any]) -> bool:
    """Keys beyond ``properties`` may appear. llguidance's grammar lets such a key repeat, and
    counts each repetition toward ``minProperties``, where a parser keeps one: there the count
    is checked instead (value_checks, which also refuses a repeated key)."""
    return "patternProperties" in schema or schema.get("additionalProperties", True) is not False
