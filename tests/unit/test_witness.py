"""Witnesses of JSON Schemas (``structured.witness``): values found by proposing and validating,
the strings generated for patterns (``structured.regex_strings``), and the closings that write
an open value again as one.

The schemas are feature probes in the style of JSONSchemaBench's Handwritten subset: each rules
out the values a closer writing character by character would try first."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest

from trillium.protocol import StructuredOutputs
from trillium.structured.closer import SearchBudget
from trillium.structured.regex_strings import pattern_strings
from trillium.structured.schema_relax import SchemaDocument
from trillium.structured.witness import Spent, WitnessFinder

PROBES = {
    # a multiple of 3 that is no multiple of 5, 7 or 8 (3, not the 0 that comes first)
    "numbers": {
        "type": "number",
        "allOf": [
            {"minimum": 1},
            {"anyOf": [{"multipleOf": 3}, {"multipleOf": 5}, {"multipleOf": 7}]},
            {"anyOf": [{"allOf": [{"not": {"multipleOf": 5}}, {"not": {"multipleOf": 7}}]}, {"multipleOf": 24}]},
            {"not": {"multipleOf": 8}},
        ],
    },
    # only an upper bound, far below 0
    "far_below_zero": {"type": "integer", "exclusiveMaximum": -100000, "not": {"multipleOf": 2}},
    # "a" needs "b" and "c" (a schema dependency), "c" needs two more keys
    "dependencies": {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "allOf": [
            {"dependencies": {"a": {"required": ["b", "c"]}, "b": ["d"], "c": {"required": ["c1", "c2"]}}},
            {"required": ["a"]},
        ],
    },
    # exactly one of two keys, and "x" forbids "error"
    "one_of_required": {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "oneOf": [
            {"anyOf": [{"required": ["x"], "not": {"required": ["error"]}}, {"required": ["error"]}]},
            {"dependencies": {"x": {"not": {"required": ["error"]}}}},
        ],
        "type": "object",
    },
    # four-character keys; one with an "a" must hold a string with an "A": a key without one
    "key_patterns": {
        "type": "object",
        "allOf": [
            {"not": {"patternProperties": {"a": {"not": {"type": "string", "pattern": "A"}}}}},
            {"propertyNames": {"pattern": "^....$"}},
            {"minProperties": 1},
        ],
    },
    # distinct items under contains, a pattern and a recursive $ref
    "items": {
        "$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}, "required": ["id"]}},
        "type": "array",
        "minItems": 3,
        "uniqueItems": True,
        "items": {"anyOf": [{"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}, {"$ref": "#/$defs/node"}]},
        "contains": {"type": "object"},
    },
    # if/then/else over a const enum intersection
    "conditional": {
        "type": "number",
        "if": {"maximum": 4},
        "then": {"minimum": 4},
        "else": {"minimum": 6},
        "allOf": [{"enum": [1, 2, 5, 7, 8, 9, 10]}, {"enum": [1, 2, 3, 4, 5, 6, 7, 8]}],
    },
}


def finder_for(schema, max_checks=5_000):
    doc = SchemaDocument(schema)
    budget = SearchBudget(max_checks, 30.0)
    return doc, WitnessFinder(doc.validator, doc.specification, doc.legacy_ref, lambda: budget.spent)


@pytest.mark.parametrize("name", sorted(PROBES))
def test_the_first_witness_of_each_probe_validates(name):
    schema = PROBES[name]
    doc, finder = finder_for(schema)
    witness = next(iter(finder.witnesses([(schema, doc.resolver)])))
    jsonschema.validate(witness, schema)
    if name == "numbers":
        assert witness == 3


def test_a_schema_no_value_satisfies_has_no_witness_and_a_budget_stops_the_search():
    impossible = {"type": "integer", "allOf": [{"not": {"multipleOf": 1}}]}
    doc, finder = finder_for(impossible)
    assert list(finder.witnesses([(impossible, doc.resolver)])) == []
    doc, finder = finder_for(PROBES["numbers"], max_checks=0)
    with pytest.raises(Spent):
        next(iter(finder.witnesses([(PROBES["numbers"], doc.resolver)])))


def test_every_witness_a_search_yields_is_valid():
    """Not only the first: the search yields many values, each validated."""
    schema = PROBES["items"]
    doc, finder = finder_for(schema)
    values = [v for _, v in zip(range(12), finder.witnesses([(schema, doc.resolver)]), strict=False)]
    assert len(values) >= 3
    for value in values:
        jsonschema.validate(value, schema)


def test_pattern_strings_match_their_patterns_on_fresh_random_patterns():
    rng = random.Random()
    pieces = ["[a-c]", "\\d", "x", "(ab|cd)", "[^q]", "\\w", "-", "[A-Z0-9]"]
    quantifiers = ["", "+", "*", "?", "{2}", "{1,3}"]
    for _ in range(200):
        pattern = "".join(rng.choice(pieces) + rng.choice(quantifiers) for _ in range(rng.randint(1, 5)))
        if rng.random() < 0.5:
            pattern = f"^{pattern}$"
        found = pattern_strings(pattern, rng.randint(0, 6))
        assert found, pattern
        for text in found:
            assert re.search(pattern, text), (pattern, text)


def test_a_closing_writes_the_open_value_again_as_a_witness(tok, compiler):
    """The scheduler's last resort for a closing the checks reject: back to an open value's
    start (here a number, ``8`` so far, under a key the object needs), the value written again as
    a witness of its subschemas, then the object closed as usual; the grammar accepts it and the
    whole output validates."""
    schema = {
        "type": "object",
        "properties": {"n": PROBES["numbers"], "tag": {"type": "string"}},
        "required": ["n", "tag"],
    }
    grammar = compiler.compile(StructuredOutputs(json=schema))
    assert grammar.checks is not None
    matcher = grammar.new_matcher()
    prefix = '{"n":8'
    for t in tok.encode(prefix):
        assert matcher.accept(t) and matcher.guard.feed(t) is None
    starts = [start for start, node in matcher.guard.checker.open_values if node is not None]
    assert starts  # the object and the number have checks
    node = dict(matcher.guard.checker.open_values)[prefix.index("8")]
    # Back to the number's start, as the scheduler does (output tokens cut, the head kept).
    output = tok.encode(prefix)
    cut = matcher.guard.token_at(prefix.index("8"))
    assert matcher.rollback(len(output) - cut)
    head = prefix.encode()[len(tok.decode(output[:cut]).encode()) : prefix.index("8")]
    closing = matcher.witness_closing(
        node,
        head,
        room=40,
        budget=SearchBudget(5_000, 30.0),
        accepts=lambda c: matcher.guard.failure(output[:cut] + c) is None,
    )
    assert closing is not None
    value = json.loads(tok.decode(output[:cut] + closing))
    jsonschema.validate(value, schema)
    assert value["n"] == 3
