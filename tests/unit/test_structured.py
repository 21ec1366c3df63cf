"""Structured output without the model: the compiler (cache, errors), the grammar actor (messages,
time limit), and the scheduler with a masking fake executor over the real tokenizer -- EOS only
where the grammar may end, max_tokens mid-structure, jump-forward, constrained and free requests
in one step."""

from __future__ import annotations

import json
import time

import msgspec
import pytest
import torch
import trio

from tests.unit.test_witness import PROBES as WITNESS_PROBES
from trillium import _core
from trillium.protocol import (
    AddRequest,
    CompileGrammar,
    FinishReason,
    SamplingParamError,
    SamplingParams,
    StepInput,
    StepOutput,
    StructuredOutputs,
    ThinkSection,
)
from trillium.runtime import Mailbox, open_inbox
from trillium.scheduler import Request, SchedulerConfig, SchedulerPolicy
from trillium.scheduler.actor import SchedulerActor, merge_deltas
from trillium.scheduler.kv_manager import KVBlockManager
from trillium.structured import (
    BitmaskFiller,
    GrammarCompiler,
    GrammarError,
    OutputController,
    StructuredCounters,
    build_ll_tokenizer,
)
from trillium.structured.actor import GrammarActor

BLOCK = 4
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


# ---- compiler ---------------------------------------------------------------------------------


def test_cache_is_keyed_by_content(compiler):
    a = compiler.compile(StructuredOutputs(json=PERSON))
    hits = compiler.num_cache_hits
    same = compiler.compile(StructuredOutputs(json=json.dumps(PERSON, indent=2)))  # text, other whitespace
    assert same is a and compiler.num_cache_hits == hits + 1
    reordered = dict(reversed(list(PERSON.items())))  # key order is generation order: a different grammar
    assert compiler.compile(StructuredOutputs(json=reordered)) is not a


def test_cache_is_kept_per_scope(compiler):
    """One tenant scope's compile is never another's cache hit (a hit's speed would tell)."""
    constraint = StructuredOutputs(json={**PERSON, "title": "scoped"})
    mine = compiler.compile(constraint, "tenant:acme")
    hits = compiler.num_cache_hits
    assert compiler.cached(constraint, "tenant:globex") is None and compiler.cached(constraint) is None
    theirs = compiler.compile(constraint, "tenant:globex")
    assert theirs is not mine and compiler.num_cache_hits == hits
    assert compiler.compile(constraint, "tenant:acme") is mine and compiler.num_cache_hits == hits + 1


def test_matchers_are_independent(compiler, tok):
    grammar = compiler.compile(StructuredOutputs(json=PERSON))
    m1, m2 = grammar.new_matcher(), grammar.new_matcher()
    assert all(m1.accept(t) for t in tok.encode('{"name":"Al","age":3}'))
    assert m1.is_terminated
    assert all(m2.accept(t) for t in tok.encode('{"name":"Bo"'))  # m2 still starts from scratch
    assert not m2.accept(tok.encode("}")[0]) and m2.error  # "age" is required


def test_cache_evicts_least_recently_used(tok):
    small = GrammarCompiler(build_ll_tokenizer(tok, tok.vocab_size), cache_size=2)
    first = small.compile(StructuredOutputs(regex="a+"))
    small.compile(StructuredOutputs(regex="b+"))
    small.compile(StructuredOutputs(regex="a+"))  # refreshes a+
    small.compile(StructuredOutputs(regex="c+"))  # evicts b+
    assert small.cached(StructuredOutputs(regex="a+")) is first
    assert small.cached(StructuredOutputs(regex="b+")) is None


@pytest.mark.parametrize(
    "constraint,message",
    [
        (StructuredOutputs(json={"type": "foo"}), "Invalid type"),
        (StructuredOutputs(json={"properties": {"a": {"$ref": "#/nope"}}}), "/nope"),
        (StructuredOutputs(json={"enum": [1, 2], "not": {"enum": [1, 2]}}), "no value"),  # unsatisfiable
        (StructuredOutputs(json="{not json"), "not valid JSON"),
        (StructuredOutputs(json=[1, 2]), "must be an object"),
        (StructuredOutputs(regex="a(b"), "unclosed group"),
        (StructuredOutputs(grammar="start: (("), "grammar"),
        (StructuredOutputs(choice=[]), "non-empty"),
        (StructuredOutputs(regex="a", choice=["a"]), "exactly one"),
    ],
)
def test_bad_constraints_raise_naming_the_problem(compiler, constraint, message):
    with pytest.raises(GrammarError, match=message):
        compiler.compile(constraint)


def test_gbnf_grammar_is_accepted(compiler, tok):
    matcher = compiler.compile(StructuredOutputs(grammar='root ::= "yes" | "no"')).new_matcher()
    assert all(matcher.accept(t) for t in tok.encode("no"))
    assert matcher.is_accepting


# ---- grammar actor ----------------------------------------------------------------------------


def test_a_step_mixing_drafting_and_plain_constrained_requests_fills_every_row(compiler, tok):
    # With speculation on, one constrained request may verify drafts while another has none this
    # step: llguidance's draft fill refuses an empty draft list, so the two kinds are filled apart.
    grammar = compiler.compile(StructuredOutputs(json=PERSON))
    drafting, plain = controller_of(grammar, tok), controller_of(grammar, tok)
    drafts = tok.encode('{"name"', add_special_tokens=False)
    filler = BitmaskFiller(8, tok.vocab_size, num_threads=1)
    try:
        step = filler.begin_step([(0, drafting, drafts), (1, plain, [])], 2)
        assert step is not None
        step.wait()
        rows = step.tensor.clone()
        assert rows.shape[0] == len(drafts) + 2
        alone = filler.begin_step([(0, plain, [])], 1)
        assert alone is not None
        alone.wait()
        assert torch.equal(rows[0], alone.tensor[0]) and torch.equal(rows[-1], alone.tensor[0])  # both at the start
        assert not torch.equal(rows[1], rows[0])  # after the first draft: another mask
    finally:
        filler.close()


async def test_actor_compiles_caches_and_times_out(compiler):
    send, recv = open_inbox(4)
    actor = GrammarActor(compiler, recv)
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)

        async def ask(constraint):
            reply_send, reply_recv = trio.open_memory_channel(1)
            await send.send(CompileGrammar(constraint=constraint, reply=reply_send))
            return await reply_recv.receive()

        ok = await ask(StructuredOutputs(regex=r"\d{3}"))
        assert ok.error is None and ok.grammar.kind == "regex"
        again = await ask(StructuredOutputs(regex=r"\d{3}"))
        assert again.grammar is ok.grammar
        bad = await ask(StructuredOutputs(json={"type": "foo"}))
        assert bad.grammar is None and "Invalid type" in bad.error
        actor.timeout_s = 0.0  # every compile that is not a cache hit is now over the limit
        slow = await ask(StructuredOutputs(regex=r"[a-z]{2,40}@example\.com"))
        assert slow.grammar is None and "longer than" in slow.error
        assert actor.stats.latest.grammar_compile_timeouts == 1
        assert (await ask(StructuredOutputs(regex=r"\d{3}"))).grammar is ok.grammar  # hits skip the limit
        nursery.cancel_scope.cancel()


# ---- scheduler + masks --------------------------------------------------------------------------


class MaskingExecutor:
    """Plays the runner's part around the bitmask: fake logits that rank tokens by a fixed
    preference (EOS first when ``prefer_eos``, then ascending ids), the step's masks applied
    through the real kernel, argmax. Records the mask row of every sampling request."""

    def __init__(self, vocab: int, eos: int, prefer_eos: bool = True, favour: tuple[int, ...] = ()) -> None:
        self.vocab = vocab
        self.eos = eos
        self.prefer_eos = prefer_eos
        self.favour = favour  # tokens ranked above the rest (below EOS), first most
        self.mask_rows: list[dict[str, int]] = []

    def execute(self, step_input: StepInput) -> StepOutput:
        rows = [i for i, r in enumerate(step_input.requests) if r.sample]
        logits = -torch.arange(self.vocab, dtype=torch.float32).repeat(len(rows), 1) / self.vocab  # [S, V]
        for rank, token in enumerate(self.favour):
            logits[:, token] = 5.0 - rank
        if self.prefer_eos:
            logits[:, self.eos] = 10.0
        seen = {}
        if step_input.bitmask is not None:
            step_input.bitmask.apply(logits, [(i, 1) for i in rows])
            seen = {step_input.requests[i].request_id: step_input.bitmask.rows[i] for i in rows}
        self.mask_rows.append(seen)
        out = [-1] * len(step_input.requests)
        for j, i in enumerate(rows):
            out[i] = int(logits[j].argmax())
        return StepOutput(out)


async def run_requests(tok, requests, *, prefer_eos=True, jump_forward=True, favour=()):
    """requests: [(request id, SamplingParams, compiled grammar or None)] -> ({id: (ids, reason)}, actor)."""
    send, recv = open_inbox(16)
    executor = MaskingExecutor(tok.vocab_size, min(tok.eos_token_ids), prefer_eos, tuple(favour))
    config = SchedulerConfig(block_size=BLOCK, eos_token_ids=frozenset(tok.eos_token_ids), jump_forward=jump_forward)
    actor = SchedulerActor(
        config,
        KVBlockManager(_core.BlockAllocator(256), BLOCK),
        executor,
        recv,
        BitmaskFiller(8, tok.vocab_size, num_threads=1),
    )
    results = {}
    closed = actor.closed_early = {}  # request id -> its last delta's closed_early
    unsatisfied = actor.unsatisfied_check = {}  # request id -> its last delta's unsatisfied_check
    errors = actor.errors = {}  # request id -> its last delta's error
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        boxes = {}
        for rid, sampling, grammar in requests:
            boxes[rid] = Mailbox(merge_deltas)
            send.send_nowait(
                AddRequest(
                    request_id=rid,
                    prompt_token_ids=tok.encode("Answer:"),
                    sampling=sampling,
                    reply=boxes[rid],
                    grammar=grammar,
                )
            )
        for rid, box in boxes.items():
            ids, reason = [], None
            while reason is None:
                delta = await box.get()
                ids += delta.token_ids
                reason = delta.finish_reason
            results[rid] = (ids, reason)
            closed[rid] = delta.closed_early
            unsatisfied[rid] = delta.unsatisfied_check
            errors[rid] = delta.error
        nursery.cancel_scope.cancel()
    return results, actor, executor


async def test_eos_only_where_the_grammar_may_end(tok, compiler):
    grammar = compiler.compile(StructuredOutputs(regex="ab+c?"))
    sampling = SamplingParams(max_tokens=20, structured=StructuredOutputs(regex="ab+c?"))
    results, _, _ = await run_requests(tok, [("r", sampling, grammar)])
    ids, reason = results["r"]
    text = tok.decode(ids)
    assert reason == FinishReason.STOP
    assert text.startswith("ab") and text.rstrip("c").lstrip("a").strip("b") == ""  # EOS wanted, but only after "ab"


async def test_max_tokens_mid_structure_is_length_when_closing_is_off(tok, compiler):
    grammar = compiler.compile(StructuredOutputs(json=PERSON))
    sampling = SamplingParams(max_tokens=3, structured=StructuredOutputs(json=PERSON), close_structured_output=False)
    results, actor, _ = await run_requests(tok, [("r", sampling, grammar)], jump_forward=False)
    ids, reason = results["r"]
    assert reason == FinishReason.LENGTH and len(ids) == 3 and not actor.closed_early["r"]
    with pytest.raises(json.JSONDecodeError):
        json.loads(tok.decode(ids))


DEEP = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "items": {
            "type": "array",
            "minItems": 2,
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string", "pattern": "^[a-z]+[0-9]$"}, "qty": {"type": "integer"}},
                "required": ["sku", "qty"],
            },
        },
        "ship": {"type": "object", "properties": {"city": {"type": "string", "minLength": 3}}, "required": ["city"]},
    },
    "required": ["title", "items", "ship"],
}


def test_an_allowance_below_the_shortest_output_is_refused_naming_max_tokens(compiler):
    grammar = compiler.compile(StructuredOutputs(json=DEEP))
    shortest = grammar.min_output_tokens
    assert shortest > 10  # '{"title":"","items":[{"sku":"aaaa0","qty":0},...],"ship":{"city":"aaa"}}'
    with pytest.raises(SamplingParamError) as exc:
        grammar.check_allowance(SamplingParams(max_tokens=shortest - 1, structured=StructuredOutputs(json=DEEP)))
    assert exc.value.param == "max_tokens"
    grammar.check_allowance(SamplingParams(max_tokens=shortest, structured=StructuredOutputs(json=DEEP)))
    grammar.check_allowance(  # opted out: cut wherever max_tokens falls
        SamplingParams(max_tokens=1, structured=StructuredOutputs(json=DEEP), close_structured_output=False)
    )


@pytest.mark.parametrize("extra", [0, 1, 3, 8, 17, 30])
@pytest.mark.parametrize("jump_forward", [True, False])
async def test_a_small_allowance_still_returns_valid_closed_json(tok, compiler, extra, jump_forward):
    """A model that never wants to end (EOS last, low token ids first) under a deep schema: the
    output is closed by the grammar's shortest completion within max_tokens, and validates."""
    jsonschema = pytest.importorskip("jsonschema")
    grammar = compiler.compile(StructuredOutputs(json=DEEP))
    max_tokens = grammar.min_output_tokens + extra
    sampling = SamplingParams(max_tokens=max_tokens, structured=StructuredOutputs(json=DEEP))
    results, actor, _ = await run_requests(tok, [("r", sampling, grammar)], prefer_eos=False, jump_forward=jump_forward)
    ids, reason = results["r"]
    jsonschema.validate(json.loads(tok.decode(ids)), DEEP)
    assert len(ids) <= max_tokens
    assert reason == FinishReason.LENGTH and actor.closed_early["r"]
    assert actor.stats.latest.num_closed_outputs == 1  # /stats counts it


async def test_jump_forward_appends_forced_tokens_and_counts_them(tok, compiler):
    grammar = compiler.compile(StructuredOutputs(json=PERSON))
    sampling = SamplingParams(max_tokens=40, structured=StructuredOutputs(json=PERSON))
    results, actor, executor = await run_requests(tok, [("r", sampling, grammar)])
    ids, reason = results["r"]
    value = json.loads(tok.decode(ids))
    assert reason == FinishReason.STOP and set(value) == {"name", "age"}
    stats = actor.stats.latest
    assert stats.num_forced_tokens > 0
    sampled_steps = sum(1 for rows in executor.mask_rows if "r" in rows)
    assert sampled_steps + stats.num_forced_tokens == len(ids)  # forced tokens were never sampled


async def test_constrained_and_free_requests_share_a_step(tok, compiler):
    choice = StructuredOutputs(choice=["positive", "negative"])
    grammar = compiler.compile(choice)
    results, _, executor = await run_requests(
        tok,
        [
            ("c0", SamplingParams(max_tokens=10, structured=choice), grammar),
            ("free", SamplingParams(max_tokens=5, ignore_eos=True), None),
            ("c1", SamplingParams(max_tokens=10, structured=choice), grammar),
        ],
    )
    assert tok.decode(results["c0"][0]) in ("positive", "negative")
    assert tok.decode(results["c1"][0]) in ("positive", "negative")
    assert results["free"][1] == FinishReason.LENGTH and len(results["free"][0]) == 5
    mixed = [rows for rows in executor.mask_rows if {"c0", "free"} <= set(rows)]
    assert mixed, "the three requests never sampled in one step"
    assert all(rows["free"] == -1 and rows["c0"] >= 0 for rows in mixed)  # free rows are never masked


UNIQUE = {"type": "array", "items": {"type": "integer"}, "minItems": 4, "maxItems": 6, "uniqueItems": True}
NEEDS_MORE = {
    "type": "object",
    "properties": {
        "a": {"type": "integer"},
        "b": {"type": "string", "maxLength": 3},
        "c": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True, "minItems": 2},
        "d": {"type": "boolean"},
    },
    "required": ["c"],
    "additionalProperties": False,
    "dependentRequired": {"a": ["b"]},
    "minProperties": 3,
}


@pytest.mark.parametrize("schema", [UNIQUE, NEEDS_MORE], ids=["uniqueItems", "dependentRequired+minProperties"])
async def test_keywords_beyond_the_grammar_are_enforced_by_checks(tok, compiler, schema):
    """A model that repeats itself (lowest token ids first): duplicates and forbidden values are
    rolled back and banned until the output validates against the whole schema."""
    jsonschema = pytest.importorskip("jsonschema")
    grammar = compiler.compile(StructuredOutputs(json=schema))
    assert grammar.checks is not None
    sampling = SamplingParams(max_tokens=60, structured=StructuredOutputs(json=schema))
    results, actor, _ = await run_requests(tok, [("r", sampling, grammar)])
    ids, reason = results["r"]
    jsonschema.validate(json.loads(tok.decode(ids)), schema)
    assert reason in (FinishReason.STOP, FinishReason.LENGTH)
    assert actor.stats.latest.num_rejected_tokens > 0  # the checks had to act (/stats)


async def test_what_the_checks_of_one_request_take_back_is_bounded(tok, compiler, monkeypatch):
    """Each token a failed check takes back was a step's work, and a value may be retried many
    times: past TAKE_BACK_PER_TOKEN tokens per token of max_tokens (at least TAKE_BACK_MIN) the
    request ends with an error saying so. (A 200-character string under recursive "not"s ran
    for minutes.)"""
    from trillium.structured import controller

    monkeypatch.setattr(controller, "TAKE_BACK_MIN", 3)
    monkeypatch.setattr(controller, "TAKE_BACK_PER_TOKEN", 0)
    grammar = compiler.compile(StructuredOutputs(json=UNIQUE))
    sampling = SamplingParams(max_tokens=60, structured=StructuredOutputs(json=UNIQUE))
    results, actor, _ = await run_requests(tok, [("r", sampling, grammar)])
    _, reason = results["r"]
    assert reason == FinishReason.ERROR
    assert "tokens taken back in all" in actor.errors["r"], actor.errors["r"]
    # The bound is looked at before each take-back, which may take back several tokens; this
    # request takes back 29 with no bound.
    assert 3 <= actor.stats.latest.num_rejected_tokens < 10


# test_witness's number probe as an integer: a multiple of 3 that is no multiple of 5, 7 or 8,
# so 1 and 2 fail and 3 is the witness.
WITNESS_ONLY = {**WITNESS_PROBES["numbers"], "type": "integer"}


@pytest.mark.parametrize("case", ["closing", "retry bound", "retry bound, no witnesses"])
async def test_a_value_is_written_again_as_a_witness_of_its_schema(tok, compiler, monkeypatch, case):
    """A model that writes the smallest tokens first, under ``{"n": <WITNESS_ONLY>}``.

    - Left alone it writes ``1000...`` (digits before ``}``) until max_tokens: the closing goes
      back to the number's start and writes a witness of its subschemas (3).
    - Made to end the number at once (``}`` favoured), ``1}`` fails its checks; once a value failed
      more often than the retry bound allows (here: once), the engine writes it again as a
      witness, and the model goes on from there. Without witnesses (``MAX_WITNESS_VALUES`` 0) the
      request ends with the retry bound's error, as before."""
    jsonschema = pytest.importorskip("jsonschema")
    from trillium.structured import controller

    monkeypatch.setattr(controller, "MAX_VALUE_RETRIES", 0)  # the first failure is one too many
    if case.endswith("no witnesses"):
        monkeypatch.setattr(controller, "MAX_WITNESS_VALUES", 0)
    schema = {"type": "object", "properties": {"n": WITNESS_ONLY}, "required": ["n"], "additionalProperties": False}
    grammar = compiler.compile(StructuredOutputs(json=schema))
    assert grammar.checks is not None
    sampling = SamplingParams(max_tokens=40, structured=StructuredOutputs(json=schema))
    favour = [] if case == "closing" else tok.encode("}")
    results, actor, _ = await run_requests(tok, [("r", sampling, grammar)], favour=favour)
    ids, reason = results["r"]
    latest = actor.stats.latest
    if case == "closing":
        assert reason == FinishReason.LENGTH and actor.closed_early["r"] and actor.unsatisfied_check["r"] is None
        assert json.loads(tok.decode(ids)) == {"n": 3} and latest.num_witness_closings == 1  # /stats counts it
    elif case == "retry bound":
        value = json.loads(tok.decode(ids))
        jsonschema.validate(value, schema)
        assert reason == FinishReason.STOP and value == {"n": 3}, tok.decode(ids)
        assert latest.num_witness_values == 1 and latest.num_rejected_tokens > 0
    else:
        assert reason == FinishReason.ERROR and "no output satisfying the schema" in actor.errors["r"]


@pytest.mark.parametrize("search", ["bounded", "spent"])
async def test_a_closed_output_that_fails_a_check_says_which(tok, compiler, monkeypatch, search):
    """A model that never wants to end, writing unique items until max_tokens: the closing must
    complete the array without repeating an item. The closer's checked search finds one; when its
    budget is spent at once, the plain closing (which repeats an item) is used -- and the choice
    says so (``unsatisfied_check``), never passing for valid."""
    jsonschema = pytest.importorskip("jsonschema")
    from trillium.structured import controller

    if search == "spent":
        monkeypatch.setattr(controller, "CLOSE_CHECK_BUDGET", 0)
    schema = {"type": "array", "items": {"type": "integer"}, "minItems": 6, "uniqueItems": True}
    grammar = compiler.compile(StructuredOutputs(json=schema))
    sampling = SamplingParams(max_tokens=grammar.min_output_tokens + 3, structured=StructuredOutputs(json=schema))
    results, actor, _ = await run_requests(tok, [("r", sampling, grammar)], prefer_eos=False)
    ids, reason = results["r"]
    value = json.loads(tok.decode(ids))  # parses either way
    assert reason == FinishReason.LENGTH and actor.closed_early["r"], tok.decode(ids)
    if search == "bounded":
        jsonschema.validate(value, schema)
        assert actor.unsatisfied_check["r"] is None
    else:
        assert len(set(value)) < len(value), value  # the plain closing repeated an item
        assert "unique" in actor.unsatisfied_check["r"].lower(), actor.unsatisfied_check["r"]


async def test_a_dead_end_the_grammar_let_in_is_closed_from_further_back(tok, compiler):
    """llguidance admits a key that no character can finish: under ``patternProperties: {"bb":
    false}`` the key ``"bbb...`` already matches a pattern whose value is ``false``. A model that
    keeps writing it reaches max_tokens with no closing from there. Its object's check holds the
    output back (never delivered), so the closing starts further back: the JSON parses, has no
    such key, and validates unless the response names the check it fails."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = {"type": "object", "patternProperties": {"bb": False}, "not": {"propertyNames": {"not": {"const": "0"}}}}
    grammar = compiler.compile(StructuredOutputs(json=schema))
    assert grammar.checks is not None  # the "not" is checked, so the object is held back
    (b,) = tok.encode("b")
    # More than CLOSE_MARGIN: far from the end the closing is looked for every few steps only.
    sampling = SamplingParams(max_tokens=100, structured=StructuredOutputs(json=schema))
    results, actor, _ = await run_requests(tok, [("r", sampling, grammar)], prefer_eos=False, favour=[b])
    ids, reason = results["r"]
    value = json.loads(tok.decode(ids))
    assert reason == FinishReason.LENGTH and actor.closed_early["r"], tok.decode(ids)
    assert isinstance(value, dict) and not any("bb" in key for key in value), value
    if actor.unsatisfied_check["r"] is None:
        jsonschema.validate(value, schema)


async def test_a_checked_top_level_number_is_checked_when_eos_ends_it(tok, compiler):
    """The end of the output (EOS, or the grammar complete) completes a top-level number: its
    checks run then (EOS itself is no JSON); "0" is even, so it is taken back and banned."""
    schema = {"type": "integer", "minimum": 0, "maximum": 99, "not": {"multipleOf": 2}}
    grammar = compiler.compile(StructuredOutputs(json=schema))
    assert grammar.checks is not None
    results, actor, _ = await run_requests(
        tok, [("r", SamplingParams(max_tokens=8, structured=StructuredOutputs(json=schema)), grammar)]
    )
    ids, reason = results["r"]
    assert reason == FinishReason.STOP
    value = json.loads(tok.decode([t for t in ids if t not in tok.eos_token_ids]))
    assert value % 2 == 1 and actor.stats.latest.num_rejected_tokens > 0


async def test_max_properties_over_optional_keys_ends_the_object_at_the_limit(tok, compiler):
    """A model that would add every optional property: the separator asking for one property
    more than maxProperties fails its check, and the object closes instead."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = {
        "type": "object",
        "properties": {k: {"type": "integer", "minimum": 0, "maximum": 9} for k in "abcdef"},
        "minProperties": 2,
        "maxProperties": 3,
        "additionalProperties": False,
    }
    grammar = compiler.compile(StructuredOutputs(json=schema))
    sampling = SamplingParams(max_tokens=60, structured=StructuredOutputs(json=schema))
    results, _, _ = await run_requests(tok, [("r", sampling, grammar)], prefer_eos=False)
    ids, reason = results["r"]
    value = json.loads(tok.decode(ids))
    jsonschema.validate(value, schema)
    assert reason == FinishReason.STOP and len(value) == 3


def test_a_draft_past_the_parsers_limit_leaves_the_request_able_to_go_on(tok, monkeypatch):
    """Drafts are filled on a copy of the request's matcher: a draft whose consumption trips a
    parser limit (llguidance errors are sticky) no longer breaks the matcher the request keeps,
    the rows after the failing draft are that position's mask rather than garbage, and a token
    refused at the limit is reported as the limit, not as a grammar violation."""
    import json
    import random

    import llguidance

    from trillium.structured import compiler as compiler_module

    monkeypatch.setattr(compiler_module, "PARSER_LIMITS", llguidance.LLParserLimits(max_items_in_row=10))
    grammar = GrammarCompiler(build_ll_tokenizer(tok, tok.vocab_size)).compile(
        StructuredOutputs(json={"type": "object", "properties": {"data": {}}, "required": ["data"]})
    )
    rng = random.Random(5)

    def value(depth):
        r = rng.random()
        if depth > 12 or r < 0.2:
            return rng.choice([1, 2.5, "str", True, None])
        if r < 0.6:
            return [value(depth + 1) for _ in range(rng.randint(1, 3))]
        return {rng.choice("abcdefgh"): value(depth + 1) for _ in range(rng.randint(1, 3))}

    ids = tok.encode(json.dumps({"data": value(0)}, separators=(",", ":")), add_special_tokens=False)
    controller = controller_of(grammar, tok)
    matcher = controller.matcher
    filler = BitmaskFiller(8, tok.vocab_size, num_threads=1)
    tripped = 0
    try:
        for pos, token in enumerate(ids):
            drafts = ids[pos : pos + 5]  # the continuation, as the scheduler validates drafts
            filler.buffer.fill_(0x15555555)  # a row the fill leaves alone shows as this
            step = filler.begin_step([(0, controller, drafts)], 1)
            assert step is not None
            step.wait()
            assert not matcher.ll_matcher.is_error()  # the drafts went through a copy
            # Row j is the mask after drafts 0..j-1 up to the draft p that cannot be consumed;
            # every row after p is row p (never a stale row of an earlier step's buffer).
            probe, expect = matcher.ll_matcher.deep_copy(), []
            for j in range(len(drafts) + 1):
                words = torch.frombuffer(bytearray(probe.compute_bitmask()), dtype=torch.int32)
                expect.append(words[: step.tensor.shape[1]])
                if j == len(drafts) or not probe.consume_token(drafts[j]):
                    break
            tripped += len(expect) <= len(drafts)
            for j in range(len(drafts) + 1):
                assert torch.equal(step.tensor[j], expect[min(j, len(expect) - 1)]), (pos, j, len(expect))
            if not matcher.accept(token):
                assert "the output grew past what the grammar's parser follows" in matcher.rejection(token)
                break
        assert tripped > 0, "the limit never tripped inside a draft fill: the test proves nothing"
    finally:
        filler.close()


# llguidance's relaxed grammar of this schema (JSONSchemaBench Handwritten dep5) admits `{"d":...},`
# and then no key at all: a dead end, where its mask allows only EOS.
DEAD_END = {
    "type": "object",
    "patternProperties": {"^[a-d]$": True},
    "additionalProperties": False,
    "allOf": [
        {
            "dependencies": {
                "a": {"anyOf": [{"required": ["b"]}, {"required": ["c"]}]},
                "b": {"not": {"required": ["a"]}},
                "c": {"not": {"required": ["a"]}},
            }
        },
        {"required": ["d"]},
    ],
    "minProperties": 3,
}


def controller_of(grammar, tok, max_tokens=8, *, guard=True, jump_forward=True):
    """A request's structured-output controller, as the scheduler actor makes one; ``guard=False``:
    the same grammar, as a schema without value checks compiles it."""
    matcher = grammar.new_matcher()
    if not guard:
        matcher.guard = None
    return OutputController(
        matcher,
        limit=max_tokens,
        sampling=SamplingParams(max_tokens=max_tokens),
        eos_token_ids=frozenset(tok.eos_token_ids),
        jump_forward=jump_forward,
        counters=StructuredCounters(),
    )


def test_only_a_value_checked_request_waits_for_its_verdict(tok, compiler):
    """The scheduler defers a step's verdict (to the search thread) exactly when it may search
    closings: a request whose schema has checks beyond the grammar is pending after the step and
    sits out the next one; a grammar without checks, or no grammar, is decided at once."""
    policy = SchedulerPolicy(
        SchedulerConfig(block_size=BLOCK, eos_token_ids=frozenset(tok.eos_token_ids)),
        KVBlockManager(_core.BlockAllocator(64), BLOCK),
    )

    def request(rid, schema):
        r = Request(rid, tok.encode("x"), SamplingParams(max_tokens=8), 8)
        if schema is not None:
            r.structured = controller_of(compiler.compile(StructuredOutputs(json=schema)), tok)
        policy.add(r)
        return r

    checked, plain = request("checked", DEAD_END), request("plain", {"type": "object"})
    request("free", None)
    assert checked.structured.searches and not plain.structured.searches
    plan = policy.schedule()
    deferred = []
    first = tok.encode("{", add_special_tokens=False)[0]
    updates = policy.update(plan, StepOutput([first] * 3), deferred)
    assert [u.request.request_id for u in updates] == ["plain", "free"] and [d.request for d in deferred] == [checked]
    assert checked.pending and [r.request_id for r, _ in policy.schedule().scheduled] == ["plain", "free"]
    update = policy.settle_deferred(deferred[0], deferred[0].decide(time.perf_counter() + 1))
    assert update is not None and checked.output_token_ids == [first] and not checked.pending


@pytest.mark.parametrize("checks", [False, True], ids=["grammar only", "with checks"])
def test_a_grammar_dead_end_never_ends_as_a_complete_output(tok, compiler, checks):
    """Where the grammar can go no further and the output is not complete, EOS (the only token
    llguidance then allows) must not end the request as if it were: with value checks the token
    that led there is taken back and banned there, without them the request fails saying why --
    never finish_reason stop on JSON that does not parse."""
    grammar = compiler.compile(StructuredOutputs(json=DEAD_END))
    assert grammar.checks is not None  # minProperties beside patternProperties is counted by a check
    eos = min(tok.eos_token_ids)
    # No jump-forward, and room far from the closing's: only the kept tokens are appended.
    controller = controller_of(grammar, tok, 1000, guard=checks, jump_forward=False)
    matcher, output = controller.matcher, []

    def step(token):
        """One step that kept ``token``: (what the client gets, finish reason, error)."""
        verdict = controller.step(output, [token], None, lambda t, n: None, deadline=time.perf_counter() + 1)
        return verdict.new_token_ids, verdict.finish_reason, verdict.error

    *head, last = tok.encode('{"d":{"x":1},')
    for t in head:
        assert step(t)[1:] == (None, None)
    assert step(last)[1:] == (None, None)  # llguidance finds the dead end later:
    assert matcher.bitmask() == (1 << eos).to_bytes(len(matcher.bitmask()), "little")  # EOS only
    _, reason, error = step(eos)
    if checks:
        assert (reason, error) == (None, None) and output == head  # taken back to before ","
        assert last in matcher.guard.bans[len(head)]
        assert matcher.bitmask() != (1 << eos).to_bytes(len(matcher.bitmask()), "little")
    else:
        assert reason == FinishReason.ERROR and "no continuation" in error


# ---- the answer after a think section -----------------------------------------------------------


def think_tags(tok):
    """Two single-token words standing in for a thinking model's <think> and </think> (the test
    model has no such tokens): ids the answer's grammar never allows."""
    return ThinkSection(open_id=tok.encode(" apple")[-1], close_id=tok.encode(" banana")[-1])


@pytest.mark.parametrize("case", ["opened", "opened by the model", "answered at once"])
async def test_the_grammar_applies_after_the_think_section(tok, compiler, case):
    """A thinking model's structured output: the think section is free (its rows unmasked), the
    grammar applies from after its closing tag. EOS inside the thinking closes it (the closing
    tag in EOS's place) -- the answer still comes. Where the prompt did not open the section,
    the model's first token may open it (the mask allows the opening tag beside the grammar's
    first tokens) or start the answer at once."""
    jsonschema = pytest.importorskip("jsonschema")
    tags = think_tags(tok)
    think = msgspec.structs.replace(tags, opened=case == "opened")
    grammar = compiler.compile(StructuredOutputs(json=PERSON))
    sampling = SamplingParams(max_tokens=120, structured=StructuredOutputs(json=PERSON), structured_after_think=think)
    # The model's preference: the opening tag, or the answer's first token over it.
    favour = (tags.open_id,) if case == "opened by the model" else tuple(tok.encode('{"', add_special_tokens=False)[:1])
    results, actor, executor = await run_requests(tok, [("r", sampling, grammar)], favour=favour)
    ids, reason = results["r"]
    head = {"opened": [tags.close_id], "opened by the model": [tags.open_id, tags.close_id], "answered at once": []}
    assert ids[: len(head[case])] == head[case] and reason == FinishReason.STOP
    jsonschema.validate(json.loads(tok.decode(ids[len(head[case]) :])), PERSON)
    rows = [step["r"] for step in executor.mask_rows if "r" in step]
    if case == "opened":
        assert "r" not in executor.mask_rows[0]  # the thinking step: no mask at all
    else:
        assert rows[0] >= 0  # the first token: masked (the grammar's first tokens, and the opening tag)
    assert actor.stats.latest.num_forced_tokens >= (case != "answered at once")  # the closing tag, forced


async def test_thinking_stops_where_the_answer_still_fits(tok, compiler):
    """A model that would think for ever: once the allowance left is what the answer needs (its
    shortest complete form and a margin), the closing tag is forced and the answer, closed
    before max_tokens, still validates."""
    jsonschema = pytest.importorskip("jsonschema")
    from trillium.structured import controller

    think = msgspec.structs.replace(think_tags(tok), opened=True)
    grammar = compiler.compile(StructuredOutputs(json=PERSON))
    max_tokens = grammar.min_output_tokens + controller.CLOSE_MARGIN + 40
    sampling = SamplingParams(
        max_tokens=max_tokens, structured=StructuredOutputs(json=PERSON), structured_after_think=think
    )
    thinker = tok.encode(" hmm")[-1]
    results, _, _ = await run_requests(tok, [("r", sampling, grammar)], prefer_eos=False, favour=(thinker,))
    ids, reason = results["r"]
    close = ids.index(think.close_id)
    assert set(ids[:close]) == {thinker} and close >= 30  # it thought until the answer's reserve
    jsonschema.validate(json.loads(tok.decode(ids[close + 1 :])), PERSON)
    assert len(ids) <= max_tokens and reason in (FinishReason.STOP, FinishReason.LENGTH)
