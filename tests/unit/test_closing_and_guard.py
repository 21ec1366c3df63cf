"""The pieces under always-closed JSON and the value checks, without the model: the closer closes
a JSON output validly from every prefix (strings with escapes, patterns, recursive objects), the
KV manager's truncate never writes into a block the prefix cache shares, and the guard delivers
held-back output (with its logprobs) only once no check can take it back."""

from __future__ import annotations

import json

import jsonschema
import pytest

from trillium import _core
from trillium.protocol import SamplingParams, StructuredOutputs
from trillium.scheduler import Request
from trillium.scheduler.kv_manager import KVBlockManager
from trillium.structured.closer import SearchBudget
from trillium.structured.value_checks import checks_run

SCHEMAS = {
    "nested": (
        {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "note": {"type": "string"},
                "tags": {
                    "type": "array",
                    "minItems": 2,
                    "items": {
                        "type": "object",
                        "properties": {
                            "k": {"type": "string", "pattern": "^[a-z]+/[0-9]$"},
                            "v": {"type": "integer", "minimum": 10},
                            "opt": {"type": "object"},
                        },
                        "required": ["k", "v"],
                    },
                },
                "when": {"type": "string", "format": "date"},
            },
            "required": ["name", "tags", "when"],
        },
        {
            "name": 'Bob "the" builder',
            "note": "a}b]c",
            "tags": [{"k": "abc/1", "v": 12, "opt": {"x": [1, {"y": "}"}]}}, {"k": "x/2", "v": 10}],
            "when": "2020-01-01",
        },
    ),
    "recursive": (
        {"$defs": {"w": {"type": "object", "properties": {"a": {"$ref": "#/$defs/w"}}, "additionalProperties": False}}}
        | {"type": "object", "properties": {"w": {"$ref": "#/$defs/w"}}, "required": ["w"]},
        {"w": {"a": {"a": {"a": {}}}}},
    ),
}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_every_prefix_of_an_output_closes_into_valid_json(tok, compiler, name):
    schema, instance = SCHEMAS[name]
    grammar = compiler.compile(StructuredOutputs(json=schema))
    ids = tok.encode(json.dumps(instance, separators=(",", ":")))
    for n in range(len(ids) + 1):
        matcher = grammar.new_matcher()
        assert all(matcher.accept(t) for t in ids[:n])
        closing = matcher.closing()
        assert closing is not None, n
        jsonschema.validate(json.loads(tok.decode(ids[:n] + closing)), schema)
        if n == 0:
            assert len(closing) == grammar.min_output_tokens
    assert matcher.closing() == []  # complete already


def test_truncate_never_writes_into_a_block_the_prefix_cache_shares():
    block = 4
    allocator = _core.BlockAllocator(16)
    kv = KVBlockManager(allocator, block, _core.RadixTree(allocator, block))
    request = Request("r", list(range(10, 16)), SamplingParams(max_tokens=8), 8)
    kv.match_prefix(request)
    request.output_token_ids = [1, 2, 3]  # 9 tokens, K/V of the first 8 computed: 2 full blocks cached
    assert kv.grow(request, 9)
    request.num_computed_tokens = 8
    kv.commit(request)
    shared = list(request.block_ids[:2])
    assert request.num_inserted_blocks == 2
    del request.output_token_ids[-2:]  # a check took 2 tokens back: 7 tokens, the next K/V at 6
    kv.truncate(request)
    assert request.num_computed_tokens == 4 and request.num_inserted_blocks == 1
    assert request.block_ids == shared[:1]  # block 2 stays cached for its old tokens, not reused here
    assert kv.tree.match(0, [*range(10, 16), 1, 2]).num_tokens == 8
    assert kv.grow(request, 3) and request.block_ids[1] != shared[1]
    kv.release(request)
    kv.check_invariants()


def test_held_output_is_released_with_its_logprobs_once_its_checks_pass(tok, compiler):
    schema = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    matcher = compiler.compile(StructuredOutputs(json=schema)).new_matcher()
    guard = matcher.guard
    assert guard is not None
    output: list[int] = []
    delivered: list[int] = []
    logprobs: list = []
    pieces = ["[", "1", "2", ",", "3", "4", ",", "5", "]"]  # one token each
    for step, piece in enumerate(pieces):
        (t,) = tok.encode(piece)
        assert matcher.accept(t) and guard.feed(t) is None
        output.append(t)
        tokens, lp = guard.release(output, [(float(-step), [])], 1, finished=piece == "]")
        delivered += tokens
        logprobs += lp or []
        if piece in ("1", "2", "3", "4", "5"):  # an item being written: it may still turn out a duplicate
            assert not tokens
    assert delivered == output
    assert [entry[0] for entry in logprobs] == [float(-s) for s in range(len(pieces))]  # aligned with the tokens


def test_a_string_that_may_end_only_after_some_character_closes(tok, compiler):
    """A key under ``patternProperties: {"b$": {}}`` with no other keys allowed cannot end after
    ``xyz``: the closer looks for a character after which it may (``b``), which is far down its
    preference order."""
    schema = {"type": "object", "patternProperties": {"b$": {}}, "additionalProperties": False}
    matcher = compiler.compile(StructuredOutputs(json=schema)).new_matcher()
    prefix = '{"xyzxyz'
    for t in tok.encode(prefix):
        assert matcher.accept(t)
    closing = matcher.closing(room=20)
    assert closing is not None
    jsonschema.validate(json.loads(prefix + tok.decode(closing)), schema)


def test_a_checked_closing_search_stops_when_its_budget_is_spent(tok, compiler):
    """The scheduler's search for a closing that passes the value checks runs on the event loop:
    bounded in checks (counted with memoized ones) and in seconds (closer.SearchBudget)."""
    schema = {
        "type": "array",
        "items": {"type": "string"},
        "minItems": 3,
        "uniqueItems": True,  # checked as each item completes
        "contains": {"type": "string", "minLength": 2},  # checked (jsonschema) when the array does
    }
    grammar = compiler.compile(StructuredOutputs(json=schema))
    matcher = grammar.new_matcher()
    for t in tok.encode('["a","b",'):
        assert matcher.accept(t) and matcher.guard.feed(t) is None
    closing = matcher.closing(checked=True, budget=SearchBudget(10_000, 60.0))
    assert closing is not None  # not "a" or "b", which repeat an item
    jsonschema.validate(json.loads(tok.decode(tok.encode('["a","b",') + closing)), schema)
    assert matcher.closing(checked=True, budget=SearchBudget(0, 60.0)) is None
    assert matcher.closing(checked=True, budget=SearchBudget(10_000, 0.0)) is None
    before = checks_run()
    matcher.closing(checked=True, budget=SearchBudget(10_000, 60.0))
    assert checks_run() > before  # every check counts, memoized ones too (the same search again)
