"""JSON Schema ``format`` and ``$ref`` beside other keywords, as ``prepare_schema`` compiles them.

Known formats are enforced by the grammar (an output that breaks one cannot be generated: random
outputs of the grammar are checked against parsers that know nothing of our regexes); unknown
ones are accepted and ignored, or refused in strict mode. A ``$ref`` to a recursive definition
with sibling keywords compiles, and both the reference and the siblings hold. No model: the
grammar runs over a byte vocabulary (tests/unit/test_schema_checks.py)."""

from __future__ import annotations

import base64
import binascii
import datetime
import ipaddress
import json
import random
import re
import uuid
from collections.abc import Callable
from typing import Any

import idna
import jsonschema
import pytest

from tests.unit.test_schema_checks import compact, compile_error, grammar_accepts, is_valid, random_output, run_checker
from trillium.protocol import StructuredOutputs
from trillium.structured import GrammarCompiler, GrammarError, build_ll_tokenizer
from trillium.structured.formats import (
    FORMAT_CHECKER,
    KNOWN_FORMATS,
    STRING_FORMATS,
    UnknownFormat,
    ignored_formats_warning,
)
from trillium.structured.schema_rewrite import PreparedSchema, prepare_schema


@pytest.fixture(scope="module")
def ll_tokenizer(tok):
    return build_ll_tokenizer(tok, tok.vocab_size)


def accepted(prepared: PreparedSchema, instance: Any) -> bool:
    """The grammar generates ``instance`` and its checks pass."""
    text = compact(instance)
    return grammar_accepts(prepared.grammar_schema, text) and run_checker(prepared, text, random.Random(0)) is None


# ---- known formats --------------------------------------------------------------------------

# format -> (valid strings, strings that break it). The valid ones are in the regex's subset.
SAMPLES: dict[str, tuple[list[str], list[str]]] = {
    "date-time": (
        ["2024-02-29T12:30:00Z", "2023-12-31T23:59:59.5+01:00"],
        ["2023-02-29T12:00:00Z", "2024-01-01 12:00:00Z", "2024-01-01T24:00:00Z", "2024-01-01T12:00:00"],
    ),
    "date": (["2024-02-29", "2000-02-29", "1999-12-31"], ["2023-02-29", "1900-02-29", "2024-13-01", "2024-1-1"]),
    "time": (["23:59:59Z", "08:30:00.25-05:00"], ["24:00:00Z", "12:00:00", "12:60:00Z"]),
    "duration": (["P1D", "PT1H30M", "P1Y2M3DT4H5M6S", "P2W"], ["P", "PT", "1D", "P1H", "P1DT"]),
    "email": (["a@b.co", "first.last@example.com"], ["a.@b.co", "@b.co", "a@", "a b@c.d", "a..b@c.d"]),
    "idn-email": (["a@b.co"], ["no-at-sign", "a@-b.co"]),
    "hostname": (
        ["example.com", "a", "my-host.example"],
        ["-a.com", "a-.com", "a..b", "a_b.com", "ab--c.com", "a" * 64],
    ),
    "idn-hostname": (["example.com", "xn-a.b"], ["-a.com", "a_b", "ab--c.com"]),
    "ipv4": (["192.168.0.1", "0.0.0.0"], ["256.1.1.1", "01.2.3.4", "1.2.3"]),
    "ipv6": (["::1", "2001:db8::8a2e:370:7334", "1:2:3:4:5:6:7:8", "::"], ["1:2:3:4:5:6:7:8:9", "::1::", "12345::"]),
    "uri": (
        ["https://example.com/a?b=c#d", "urn:isbn:0451450523", "mailto:a@b.co"],
        ["//example.com", "example.com", "http://a b", "1http://x"],
    ),
    "uri-reference": (["../a/b?c", "#frag", "", "https://example.com"], ["a b", ":a", "http://a b"]),
    "iri": (["https://例え.jp/パス"], ["例え", "http://a b"]),
    "iri-reference": (["パス/a", "https://例え.jp"], ["a b", ":a"]),
    "uuid": (
        ["123e4567-e89b-12d3-a456-426614174000"],
        ["123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400g"],
    ),
    "uri-template": (
        ["http://example.com/{user}/items{?page,size}", "/search{?q*}", "plain"],
        ["{", "http://x/{a b}", "{=a}", "a}"],
    ),
    "json-pointer": (["", "/a/b~0c/~1", "/"], ["a", "/~2", "/a~"]),
    "relative-json-pointer": (["0", "1/a", "2#"], ["", "-1", "01/a", "/a"]),
    "regex": (["^[a-z]+$", "(a|b)*c{2,3}", "\\d+\\.\\d*"], ["(", "a)", "[a", "*a", "a**"]),
    "byte": (["", "aGVsbG8=", "YQ==", "YWJj"], ["abc", "a===", "YQ=", "a b="]),
}


def test_every_string_format_has_samples():
    assert set(SAMPLES) == set(STRING_FORMATS)
    assert set(STRING_FORMATS) | {"int32", "int64", "float", "double"} == KNOWN_FORMATS


@pytest.mark.parametrize("name", list(SAMPLES))
def test_known_string_format_is_enforced(name, ll_tokenizer):
    schema = {"type": "string", "format": name}
    prepared = prepare_schema(schema)
    assert prepared.ignored_formats == [] and prepared.root is None  # the grammar alone enforces it
    assert compile_error(prepared.grammar_schema, ll_tokenizer) is None
    valid, invalid = SAMPLES[name]
    for text in valid:
        assert FORMAT_CHECKER.conforms(text, name), text
        assert jsonschema.Draft202012Validator.FORMAT_CHECKER.conforms(text, name), text  # where it checks
        assert accepted(prepared, text), text
    for text in invalid:
        assert not FORMAT_CHECKER.conforms(text, name), text
        assert not accepted(prepared, text), text


def _hostname(text: str) -> None:
    labels = text.split(".")
    assert len(text) <= 253 and all(re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?", x) for x in labels)
    assert all(x[2:4] != "--" for x in labels)


def _json_pointer(text: str) -> None:
    assert text == "" or text.startswith("/")
    assert re.fullmatch(r"(~[01]|[^~])*", text)


# Parsers that know nothing of the regexes: each raises (or fails an assert) on a broken value.
ORACLES: dict[str, Callable[[str], Any]] = {
    "date-time": lambda t: datetime.datetime.fromisoformat(t).tzinfo is not None or 1 / 0,
    "date": datetime.date.fromisoformat,
    "time": lambda t: datetime.time.fromisoformat(t).tzinfo is not None or 1 / 0,
    "hostname": _hostname,
    "idn-hostname": lambda t: idna.encode(t) and _hostname(t),
    "ipv4": ipaddress.IPv4Address,
    "ipv6": ipaddress.IPv6Address,
    "uuid": uuid.UUID,
    "json-pointer": _json_pointer,
    "relative-json-pointer": lambda t: _json_pointer(re.sub(r"^(0|[1-9][0-9]*)", "", t).removesuffix("#")),
    "regex": re.compile,
    "byte": lambda t: base64.b64decode(t, validate=True),
    "email": lambda t: len(t) <= 254 and len(t.rpartition("@")[0]) <= 64 and _hostname(t.rpartition("@")[2]),
}


@pytest.mark.parametrize("name", list(STRING_FORMATS))
def test_random_outputs_never_break_the_format(name):
    """Random walks through the grammar (biased to short, ASCII-heavy strings): every output is a
    valid value, for an independent parser where one exists and for jsonschema's own checker."""
    prepared = prepare_schema({"type": "string", "format": name})
    rng = random.Random(name)
    standard = jsonschema.Draft202012Validator.FORMAT_CHECKER
    seen = 0
    for _ in range(40):
        text = random_output(prepared.grammar_schema, rng, max_len=80)
        if text is None:
            continue
        value = json.loads(text)
        seen += 1
        assert FORMAT_CHECKER.conforms(value, name) and standard.conforms(value, name), value
        if name in ORACLES:
            try:
                ORACLES[name](value)
            except (ValueError, AssertionError, ZeroDivisionError, binascii.Error, idna.IDNAError) as exc:
                raise AssertionError(f"{name}: {value!r} breaks the format ({exc})") from None
    assert seen >= 10


@pytest.mark.parametrize(
    "schema,valid,invalid",
    [
        ({"type": "integer", "format": "int32"}, [2**31 - 1, -(2**31), 0], [2**31, -(2**31) - 1]),
        ({"type": "number", "format": "int32"}, [1.5, 2**31 - 1], [3_000_000_000]),
        ({"type": "integer", "format": "int64"}, [2**62, -(2**62), 9223372036854774784], [2**63, -(2**63) - 1]),
        ({"type": "number", "format": "double"}, [1.5, -1e3, 12345678901234567890], []),
        ({"type": "number", "format": "float"}, [0.25], []),
        ({"format": "int32", "type": ["integer", "string"]}, ["x", 7], [2**40]),
    ],
)
def test_numeric_formats_bound_numbers(schema, valid, invalid):
    prepared = prepare_schema(schema)
    assert prepared.ignored_formats == []
    for value in valid:
        assert accepted(prepared, value), value
    for value in invalid:
        assert not FORMAT_CHECKER.conforms(value, schema["format"]) and not accepted(prepared, value), value


def test_a_format_beside_a_pattern_keeps_both():
    prepared = prepare_schema({"type": "string", "format": "date", "pattern": "^2024"})
    assert accepted(prepared, "2024-05-01")
    assert not accepted(prepared, "2023-05-01") and not accepted(prepared, "2024-5-1")


def test_checks_read_formats_as_the_grammar_does():
    """Where a check validates a whole value (a oneOf's exclusivity, a not), formats count."""
    one_of = {"oneOf": [{"type": "string", "format": "date"}, {"type": "string", "format": "email"}]}
    prepared = prepare_schema(one_of)
    assert prepared.root is not None  # the branches are both strings: exclusivity is checked
    assert accepted(prepared, "2024-01-01") and accepted(prepared, "a@b.co")
    not_date = {"type": "string", "not": {"format": "date"}}
    prepared = prepare_schema(not_date)
    assert accepted(prepared, "tomorrow") and not accepted(prepared, "2024-01-01")
    assert is_valid(not_date, "tomorrow") and not is_valid(not_date, "2024-01-01")


# ---- unknown formats --------------------------------------------------------------------------


def test_unknown_format_is_ignored_and_reported():
    schema = {
        "type": "object",
        "properties": {"p": {"type": "string", "format": "path"}, "q": {"format": "gradle-enterprise:ldap-filter"}},
    }
    prepared = prepare_schema(schema)
    assert prepared.ignored_formats == ["gradle-enterprise:ldap-filter", "path"]
    assert prepared.root is None  # nothing to check: the format constrains nothing
    assert accepted(prepared, {"p": "any text at all", "q": 3})
    assert is_valid(schema, {"p": "any text at all", "q": 3})


def test_unknown_format_compiles_with_a_warning(compiler):
    grammar = compiler.compile(StructuredOutputs(json={"type": "string", "format": "semver"}))
    assert grammar.ignored_formats == ("semver",)
    assert grammar.warning is not None and '"semver"' in grammar.warning
    known = compiler.compile(StructuredOutputs(json={"type": "string", "format": "uuid"}))
    assert known.ignored_formats == () and known.warning is None


def test_strict_mode_refuses_unknown_formats(tok):
    with pytest.raises(UnknownFormat, match="'path'"):
        prepare_schema({"type": "string", "format": "path"}, strict_formats=True)
    assert prepare_schema({"type": "string", "format": "date"}, strict_formats=True).ignored_formats == []
    strict = GrammarCompiler(build_ll_tokenizer(tok, tok.vocab_size), strict_formats=True)
    with pytest.raises(GrammarError, match="no-such-format"):
        strict.compile(StructuredOutputs(json={"type": "string", "format": "no-such-format"}))
    assert strict.compile(StructuredOutputs(json={"type": "string", "format": "ipv4"})).warning is None


def test_warning_is_ascii_and_bounded():
    names = [f"fmt-{i}" for i in range(12)] + ["ünïcode\n"]
    text = ignored_formats_warning(names)
    assert text.isascii() and "\n" not in text and text.endswith("and 5 more")
    assert ignored_formats_warning(["ünïcode"]).isascii()


# ---- $ref beside other keywords ---------------------------------------------------------------

NODE_WITH_SIBLINGS = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "v": {"type": "integer"},
                # the siblings apply in addition to the recursive definition (2019-09 and later)
                "kids": {"type": "array", "items": {"$ref": "#/$defs/node", "properties": {"v": {"maximum": 5}}}},
            },
            "required": ["v"],
            "additionalProperties": False,
        }
    },
    "$ref": "#/$defs/node",
}

# (schema, valid instances, instances that break a sibling, instances that break the reference)
REF_CASES: dict[str, tuple[Any, list[Any], list[Any], list[Any]]] = {
    "recursive $ref with siblings": (
        NODE_WITH_SIBLINGS,
        [{"v": 9, "kids": [{"v": 5, "kids": [{"v": -1}]}]}, {"v": 1}],
        [{"v": 1, "kids": [{"v": 6}]}, {"v": 1, "kids": [{"v": 1, "kids": [{"v": 7}]}]}],
        [{"v": 1, "kids": [{"w": 1}]}, {"v": 1, "kids": [{}]}],
    ),
    "self-reference with siblings": (
        {
            "type": "object",
            "properties": {"name": {"type": "string"}, "next": {"$ref": "#", "required": ["name"]}},
            "additionalProperties": False,
        },
        [{"next": {"name": "b", "next": {"name": "c"}}}, {}],
        [{"next": {}}, {"next": {"name": "b", "next": {}}}],
        [{"next": {"name": 1}}],
    ),
    "allOf of a recursive $ref and another": (
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "definitions": {
                "leaf": {"type": "object", "properties": {"tag": {"type": "string"}}},
                "tree": {
                    "type": "object",
                    "properties": {"sub": {"allOf": [{"$ref": "#/definitions/tree"}, {"$ref": "#/definitions/leaf"}]}},
                },
            },
            "$ref": "#/definitions/tree",
        },
        [{"sub": {"sub": {}, "tag": "a"}}, {}],
        [{"sub": {"tag": 1}}, {"sub": {"sub": {"tag": 2}}}],
        [{"sub": {"sub": 3}}],
    ),
}


@pytest.mark.parametrize("name", list(REF_CASES))
def test_recursive_ref_with_siblings_is_served_exactly(name, ll_tokenizer):
    schema, valid, breaks_sibling, breaks_ref = REF_CASES[name]
    prepared = prepare_schema(schema)
    assert compile_error(prepared.grammar_schema, ll_tokenizer) is None
    assert prepared.root is None, prepared.checked_keywords  # the grammar enforces both, no checks
    for instance in valid:
        assert is_valid(schema, instance) and accepted(prepared, instance), instance
    for instance in breaks_sibling + breaks_ref:
        assert not is_valid(schema, instance) and not accepted(prepared, instance), instance


def test_random_outputs_of_a_recursive_ref_with_siblings_are_valid():
    prepared = prepare_schema(NODE_WITH_SIBLINGS)
    rng = random.Random(7)
    seen = 0
    for _ in range(60):
        text = random_output(prepared.grammar_schema, rng)
        if text is not None:
            seen += 1
            assert is_valid(NODE_WITH_SIBLINGS, json.loads(text)), text
    assert seen >= 10


def test_siblings_are_checked_where_the_definition_cannot_be_copied(ll_tokenizer):
    """An ``$id`` below the root pins subschemas to their place: the siblings are checked instead."""
    schema = json.loads(json.dumps(NODE_WITH_SIBLINGS))
    schema["$defs"]["unused"] = {"$id": "https://example.com/unused.json", "type": "string"}
    prepared = prepare_schema(schema)
    assert compile_error(prepared.grammar_schema, ll_tokenizer) is None
    assert prepared.checked_keywords == ["properties"]
    assert accepted(prepared, {"v": 1, "kids": [{"v": 5}]})
    assert not accepted(prepared, {"v": 1, "kids": [{"v": 6}]})
