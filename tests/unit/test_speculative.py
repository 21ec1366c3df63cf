"""Speculative decoding in the scheduling policy (fake executor, real C++ block allocator and
prefix cache), the n-gram proposer, and the configuration."""

from __future__ import annotations

import random

import pytest

from tests.fakes import FakeExecutor
from tests.unit.test_scheduler_policy import (
    BLOCK,
    collect_updates,
    expected_output,
    expected_prompt_logprobs,
    idle,
    make,
    req,
    run_until_done,
)
from trillium.config import EngineConfig, SpeculativeConfig
from trillium.protocol import FinishReason, SamplingParams
from trillium.scheduler import Request
from trillium.speculative import DraftDepth, NgramProposer, ngram
from trillium.speculative.depth import PROBE_EVERY


class ScriptedProposer:
    """Proposes the next ``k`` true tokens (FakeExecutor's), with the draft at index ``wrong_at``
    (if any) replaced by a wrong one; records the feedback it gets."""

    def __init__(self, k: int, wrong_at: int | None = None) -> None:
        self.k, self.wrong_at = k, wrong_at
        self.feedback_calls: list[tuple[int, int]] = []
        self.forgotten: list[str] = []

    def propose(self, request, max_drafts):
        n = request.num_tokens
        drafts = [FakeExecutor.token_at(n + j) for j in range(min(self.k, max_drafts))]
        if self.wrong_at is not None and self.wrong_at < len(drafts):
            drafts[self.wrong_at] = 1  # never a true token (those are >= 10)
        return drafts

    def feedback(self, request_id, num_drafts, num_accepted):
        self.feedback_calls.append((num_drafts, num_accepted))

    def forget(self, request_id):
        self.forgotten.append(request_id)


def greq(rid, prompt_len, max_tokens=8, **sampling):
    """A greedy request (the kind that speculates)."""
    return req(rid, prompt_len, max_tokens, **{"temperature": 0.0, **sampling})


def speculating(k=4, wrong_at=None, **kw):
    policy, allocator, executor = make(speculative=SpeculativeConfig(num_speculative_tokens=k), **kw)
    policy.proposer = ScriptedProposer(k, wrong_at)
    return policy, allocator, executor


@pytest.mark.parametrize("wrong_at", [None, 0, 2])
@pytest.mark.parametrize("prefix_cache", [False, True])
def test_verified_tokens_only_same_output_fewer_steps_no_leak(wrong_at, prefix_cache):
    policy, _allocator, executor = speculating(wrong_at=wrong_at, prefix_cache=prefix_cache)
    policy.add(greq("a", 9, max_tokens=23))
    outputs, reasons = run_until_done(policy, executor)
    assert outputs["a"] == expected_output(9, 23) and reasons["a"] == FinishReason.LENGTH
    decode_steps = len(executor.steps) - 1
    accepted_per_step = {None: 4, 0: 0, 2: 2}[wrong_at]
    assert decode_steps == -(-22 // (accepted_per_step + 1))  # the prefill step gives the first token
    stats = policy.spec_stats
    assert stats.num_accepted_tokens == 23 - 1 - decode_steps
    assert idle(policy)
    policy.kv.check_invariants()
    assert policy.proposer.forgotten == ["a"]


def test_a_request_with_prompt_logprobs_speculates_from_its_last_prompt_token():
    """A budget of 8 leaves the 9-token prompt's last token for a step of its own, which drafts
    (num_computed == num_tokens - 1): the prompt logprobs come whole with its first tokens."""
    policy, _allocator, executor = speculating(max_tokens_per_step=8)
    a = greq("a", 9, max_tokens=12, prompt_logprobs=3)
    policy.add(a)
    updates = collect_updates(policy, executor)["a"]
    last_prompt = executor.steps[1].requests[0]
    assert (last_prompt.start_pos, last_prompt.num_draft_tokens) == (8, 4)
    assert last_prompt.prompt_logprob_token_ids is None  # its row predicts the output
    assert updates[0].new_token_ids == expected_output(9, 5)  # four drafts and the model's token
    assert updates[0].prompt_logprobs == expected_prompt_logprobs(a.prompt_token_ids)
    assert all(u.prompt_logprobs is None for u in updates[1:])
    assert [t for u in updates for t in u.new_token_ids] == expected_output(9, 12)
    assert idle(policy)


def test_rejected_positions_are_rolled_back_and_their_blocks_freed():
    policy, allocator, executor = speculating(k=6, wrong_at=0)
    policy.add(greq("a", 8, max_tokens=20))  # 8 prompt tokens: 2 blocks of 4
    plan = policy.schedule()
    policy.update(plan, executor.execute(plan.step_input))  # prefill; first token
    plan = policy.schedule()
    ((request, num_new),) = plan.scheduled
    assert num_new == 1 + 6 and len(request.block_ids) == -(-(9 + 6) // BLOCK)
    policy.update(plan, executor.execute(plan.step_input))  # nothing accepted: 1 new token
    assert request.num_computed_tokens == 9 and request.num_tokens == 10
    assert len(request.block_ids) == -(-10 // BLOCK)  # the drafts' extra blocks went back
    policy.kv.check_invariants()
    assert allocator.num_free_blocks == allocator.num_total_blocks - len(request.block_ids)


def test_eos_inside_an_accepted_run_ends_the_request_there():
    policy, _allocator, executor = speculating(k=5)
    executor.eos_at = {"a": 12}  # the token at index 12 of prompt + output is EOS (token 0)
    policy.proposer.propose = lambda r, m: [
        0 if r.num_tokens + j == 12 else FakeExecutor.token_at(r.num_tokens + j) for j in range(min(5, m))
    ]
    policy.add(greq("a", 9, max_tokens=30))
    outputs, reasons = run_until_done(policy, executor)
    assert outputs["a"] == [*expected_output(9, 3), 0] and reasons["a"] == FinishReason.STOP
    assert idle(policy)


def test_max_tokens_is_exact_and_drafts_never_overshoot_it():
    policy, _allocator, executor = speculating(k=8)
    for n in (1, 2, 5, 9, 10):
        policy.add(greq(f"r{n}", 5, max_tokens=n))
    outputs, _ = run_until_done(policy, executor)
    for n in (1, 2, 5, 9, 10):
        assert outputs[f"r{n}"] == expected_output(5, n)
    for step in executor.steps:
        for r in step.requests:
            assert r.num_draft_tokens <= 8
    assert idle(policy)


def test_every_decoding_request_speculates_and_big_batches_do_not():
    policy, _allocator, executor = speculating(k=3)
    policy.spec = SpeculativeConfig(num_speculative_tokens=3, disable_by_batch_size=8)
    policy.add(greq("greedy", 4, max_tokens=6, temperature=0.0))
    policy.add(greq("sampled", 4, max_tokens=6, temperature=0.8))
    policy.add(greq("logprobs", 4, max_tokens=6, temperature=0.0, logprobs=2))
    policy.add(greq("penalty", 4, max_tokens=6, temperature=0.0, presence_penalty=0.5))
    run_until_done(policy, executor)
    speculated = {r.request_id for s in executor.steps for r in s.requests if r.num_draft_tokens}
    assert speculated == {"greedy", "sampled", "logprobs", "penalty"}

    policy, _allocator, executor = speculating(k=3)
    for i in range(4):
        policy.add(greq(f"r{i}", 4, max_tokens=6))
    run_until_done(policy, executor)
    assert not any(r.num_draft_tokens for s in executor.steps for r in s.requests)


def test_preemption_mid_speculation_recomputes_only_verified_tokens():
    policy, _allocator, executor = speculating(k=3, wrong_at=1, num_blocks=10)
    policy.add(greq("a", 12, max_tokens=14))
    policy.add(greq("b", 12, max_tokens=14))
    outputs, _ = run_until_done(policy, executor)
    assert policy.num_preemptions > 0
    assert outputs["a"] == expected_output(12, 14) and outputs["b"] == expected_output(12, 14)
    for reused in executor.reused.values():  # readmission read only true tokens back
        assert reused == list(range(100, 112)) + expected_output(12, len(reused) - 12)
    assert idle(policy)


# ---- the n-gram proposer -----------------------------------------------------------------------


def ctx(tokens, output=()):
    r = Request("r", list(tokens), SamplingParams(), 100)
    r.output_token_ids = list(output)
    return r


def test_ngram_proposes_what_followed_the_latest_longest_match():
    p = NgramProposer(3, 1, 3)
    r = ctx([1, 2, 3, 4, 5, 1, 2, 3])
    assert p.propose(r, 10) == [4, 5, 1]
    r.output_token_ids.append(4)
    assert p.propose(r, 10) == [5, 1, 2]  # the index grew by the new token only
    assert p.propose(r, 2) == [5, 1]
    r.output_token_ids.append(9)
    assert p.propose(r, 10) == []  # 9 never occurred before


def test_ngram_copies_the_occurrence_whose_earlier_tokens_agree_longest():
    """The last 2-gram (5, 6) occurred twice before: after (1, 2, 3) -> 7 and, later, after
    (9, 9, 3) -> 8. The context ends in (1, 2, 3, 5, 6): the earlier occurrence agrees further
    back, so its continuation is copied; with no such agreement the latest wins."""
    p = NgramProposer(2, 1, 2)
    r = ctx([1, 2, 3, 5, 6, 7, 0, 9, 9, 3, 5, 6, 8, 0, 1, 2, 3, 5, 6])
    assert p.propose(r, 10) == [7, 0]
    latest = ctx([1, 2, 3, 5, 6, 7, 0, 9, 9, 3, 5, 6, 8, 0, 4, 4, 3, 5, 6])
    assert NgramProposer(2, 1, 2).propose(latest, 10) == [8, 0]
    # Past CANDIDATES later occurrences, the agreeing one is no longer compared.
    filler = [t for i in range(ngram.CANDIDATES) for t in (5, 6, 20 + i)]
    far = ctx([1, 2, 3, 5, 6, 7, *filler, 1, 2, 3, 5, 6])
    assert NgramProposer(2, 1, 2).propose(far, 10) == [20 + ngram.CANDIDATES - 1, 1]


def reference_drafts(ids, limit, n_min, n_max):
    """What the proposer must return, computed from scratch over the whole context."""
    num = len(ids)
    if num >= n_max:
        ends = [e for e in range(n_max, num) if ids[e - n_max : e] == ids[num - n_max :]][-ngram.CANDIDATES :]
        if ends:

            def agree(e):
                a, span = n_max, min(ngram.AGREE_MAX, num, e)
                while a < span and ids[num - 1 - a] == ids[e - 1 - a]:
                    a += 1
                return a

            best = max(reversed(ends), key=agree)  # max keeps the first (latest) of equal ones
            return ids[best : best + limit]
    for n in range(min(n_max - 1, num - 1), n_min - 1, -1):
        ends = [e for e in range(n, num) if ids[e - n : e] == ids[num - n :]]
        if ends:
            return ids[ends[-1] : ends[-1] + min(limit, n)]
    return []


@pytest.mark.parametrize("n_min, n_max", [(1, 1), (1, 3), (2, 4), (3, 3)])
def test_ngram_index_grown_call_by_call_proposes_what_a_scan_from_scratch_finds(n_min, n_max):
    """Random contexts over 3 tokens (so n-grams repeat, with many occurrences and long
    agreements), grown a few tokens between calls: the incremental index proposes exactly what
    a scan of the whole context finds, at every call."""
    rng = random.Random(n_min * 10 + n_max)
    for _ in range(40):
        k = rng.randint(1, 6)
        p = NgramProposer(k, n_min, n_max)
        r = ctx([rng.randrange(3) for _ in range(rng.randint(1, 6))])
        for _ in range(30):
            max_drafts = rng.randint(1, 8)
            ids = r.prompt_token_ids + r.output_token_ids
            assert p.propose(r, max_drafts) == reference_drafts(ids, min(k, max_drafts), n_min, n_max), ids
            r.output_token_ids.extend(rng.randrange(3) for _ in range(rng.randint(1, 4)))


def test_ngram_caps_drafts_after_rejections_and_recovers():
    p = NgramProposer(4, 1, 2)
    r = ctx([7, 8, 9, 1, 2, 3, 4, 7, 8])
    assert p.propose(r, 10) == [9, 1, 2, 3]
    p.feedback("r", 4, 0)
    assert p.propose(r, 10) == [9]  # a single draft (cap 2 * 0 + 1)
    p.feedback("r", 1, 1)
    assert len(p.propose(r, 10)) == 3


def test_ngram_drafts_no_more_than_a_short_match_is_long():
    """A match shorter than prompt_lookup_max proposes at most as many drafts as it has tokens;
    a match of prompt_lookup_max proposes up to k."""
    one = ctx([4, 10, 11, 12, 13, 14, 15, 16, 5, 10])  # the 1-gram (10) matches, (5, 10) does not
    assert NgramProposer(5, 1, 3).propose(one, 10) == [11]
    two = ctx([4, 5, 10, 11, 12, 13, 14, 15, 16, 5, 10])  # (5, 10) matches, (16, 5, 10) does not
    assert NgramProposer(5, 1, 3).propose(two, 10) == [11, 12]
    three = ctx([16, 5, 10, 11, 12, 13, 14, 15, 16, 5, 10])  # the whole 3-gram matches
    assert NgramProposer(5, 1, 3).propose(three, 10) == [11, 12, 13, 14, 15]
    assert NgramProposer(5, 1, 3).propose(three, 2) == [11, 12]


def test_speculative_config_from_json_names_the_bad_field():
    config = SpeculativeConfig.from_json('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2}')
    assert (config.num_speculative_tokens, config.prompt_lookup_max) == (3, 2)
    with pytest.raises(ValueError, match="model_path"):
        SpeculativeConfig.from_json('{"model_path": "x"}')
    with pytest.raises(ValueError, match="method"):
        SpeculativeConfig.from_json('{"method": "eagle"}')
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SpeculativeConfig.from_json('{"num_speculative_tokens": 0}')
    with pytest.raises(ValueError, match="JSON"):
        SpeculativeConfig.from_json("{nope")
    assert EngineConfig(speculative_config='{"num_speculative_tokens": 2}').speculative_config == SpeculativeConfig(
        num_speculative_tokens=2
    )


def test_draft_depth_follows_acceptance_against_the_break_even():
    depth = DraftDepth(4)
    assert depth.limit(0.95) == 4  # a depth never tried counts as paying
    for _ in range(30):
        depth.record(4, 1)  # the first draft is always accepted, the second never
    assert depth.limit(0.4) == 1 and depth.limit(0.0) == 4
    assert depth.chance(0) > 0.9 and depth.chance(1) < 0.1
    for _ in range(200):
        depth.record(1, 0)  # the text stops being copyable
    limits = [depth.limit(0.4) for _ in range(2 * PROBE_EVERY)]
    assert limits.count(1) == 2 and limits.count(0) == 2 * PROBE_EVERY - 2  # a probe now and then


def test_a_depth_dropped_on_thin_evidence_is_tried_again_and_kept_when_it_pays():
    """Two unlucky first verifies must not pin a request stream to one draft per step: the
    dropped depths' evidence decays, they are tried again, and once they are accepted they
    stay (measured: every grounded prompt ran at one draft per verify before this)."""
    depth = DraftDepth(4)
    depth.record(4, 1)
    depth.record(4, 1)
    assert depth.limit(0.4) == 1
    limits = []
    for _ in range(60):
        limit = depth.limit(0.4)
        limits.append(limit)
        depth.record(limit, limit)  # from now on every draft is accepted
    assert limits[-1] == 4 and limits.index(4) < 40


def test_policy_drafts_only_as_deep_as_pays_at_its_batch_size():
    """Drafts past the depth whose acceptance pays for a row at this batch size stop being
    proposed; a batch size where no draft can pay (its break-even above 1) gets probes only."""
    policy, _allocator, executor = make(
        speculative=SpeculativeConfig(num_speculative_tokens=4, disable_by_batch_size=8),
        spec_break_even=((1, 0.5), (2, 1.5)),
    )
    policy.proposer = ScriptedProposer(4, wrong_at=2)  # drafts 0 and 1 right, 2 wrong
    policy.add(greq("a", 6, max_tokens=40))
    outputs, _ = run_until_done(policy, executor)
    assert outputs["a"] == expected_output(6, 40)
    drafted = [r.num_draft_tokens for s in executor.steps for r in s.requests if r.num_draft_tokens]
    assert drafted[0] == 4 and set(drafted[2:]) == {2}  # depth 2 and 3 were tried once, then dropped

    policy, _allocator, executor = make(
        speculative=SpeculativeConfig(num_speculative_tokens=4, disable_by_batch_size=8),
        spec_break_even=((2, 1.5),),
    )
    policy.proposer = ScriptedProposer(4, wrong_at=0)
    policy.add(greq("a", 6, max_tokens=60))
    policy.add(greq("b", 6, max_tokens=60))
    run_until_done(policy, executor)
    steps = [s for s in executor.steps if len(s.requests) == 2]
    speculating = [s for s in steps if any(r.num_draft_tokens for r in s.requests)]
    assert 1 <= len(speculating) <= 2 + len(steps) // PROBE_EVERY  # the first try, then probes


def test_past_the_largest_timed_batch_size_its_break_even_holds():
    """Start-up timing is bounded (``step_costs``): a batch larger than any timed one drafts as
    its largest timed neighbour says, not as if drafts were free."""
    policy, _allocator, executor = make(
        speculative=SpeculativeConfig(num_speculative_tokens=4, disable_by_batch_size=8),
        spec_break_even=((1, 1.5),),  # no draft pays at batch 1: so none at 2 either
    )
    policy.proposer = ScriptedProposer(4, wrong_at=4)  # every draft right
    policy.add(greq("a", 6, max_tokens=60))
    policy.add(greq("b", 6, max_tokens=60))
    run_until_done(policy, executor)
    steps = [s for s in executor.steps if len(s.requests) == 2]
    speculating = [s for s in steps if any(r.num_draft_tokens for r in s.requests)]
    assert len(speculating) <= 2 + len(steps) // PROBE_EVERY  # probes only


def test_start_up_step_timing_is_bounded_in_time(monkeypatch):
    """Slow steps (a large dense model) are timed fewer times, and batch sizes that would not
    end within the bound are not timed: speculation stands aside from the first of them."""
    from trillium.engine import step_costs

    clock = [0.0]

    class FakeTimer:
        def __init__(self, runner, context, max_rows):
            pass

        def step_s(self, batch, rows):  # 0.1 s a row: never compute-bound enough to stop
            seconds = 0.1 * batch * (1 + 0.2 * (rows - 1))
            clock[0] += seconds
            return seconds

    monkeypatch.setattr(step_costs, "StepTimer", FakeTimer)
    monkeypatch.setattr(step_costs.time, "perf_counter", lambda: clock[0])
    threshold, costs = step_costs.measure_step_costs(None, 4, max_batch=64)
    assert clock[0] <= step_costs.TOTAL_SECONDS + 1e-9
    assert costs.batch_sizes == [1, 2, 4] and threshold == 8
    assert all(b < step_costs.NEVER_PAYS for b in costs.break_even())
