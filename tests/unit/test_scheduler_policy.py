"""Scheduling policy with a fake executor and the real C++ block allocator."""

from __future__ import annotations

import pytest

from tests.fakes import FakeExecutor
from trillium import _core
from trillium.protocol import FinishReason, SamplingParams
from trillium.scheduler import Request, SchedulerConfig, SchedulerPolicy
from trillium.scheduler.kv_manager import KVBlockManager

BLOCK = 4


def make(num_blocks=64, prefix_cache=False, **kw):
    config = SchedulerConfig(block_size=BLOCK, eos_token_ids=frozenset({0}), **kw)
    allocator = _core.BlockAllocator(num_blocks)
    tree = _core.RadixTree(allocator, BLOCK) if prefix_cache else None
    return SchedulerPolicy(config, KVBlockManager(allocator, BLOCK, tree)), allocator, FakeExecutor(BLOCK)


def idle(policy) -> bool:
    """Every block is free or reclaimable from the prefix cache."""
    return policy.kv.num_reclaimable_blocks == policy.kv.num_total_blocks


def req(rid, prompt_len, max_tokens=8, **sampling):
    return Request(
        rid, list(range(100, 100 + prompt_len)), SamplingParams(max_tokens=max_tokens, **sampling), max_tokens
    )


def run_until_done(policy, executor, max_steps=10_000):
    outputs: dict[str, list[int]] = {}
    reasons: dict[str, FinishReason] = {}
    steps = 0
    while policy.has_work():
        plan = policy.schedule()
        for update in policy.update(plan, executor.execute(plan.step_input)):
            outputs.setdefault(update.request.request_id, []).extend(update.new_token_ids)
            if update.finish_reason is not None:
                reasons[update.request.request_id] = update.finish_reason
        policy.kv.check_invariants()
        steps += 1
        assert steps < max_steps
    return outputs, reasons


def expected_output(prompt_len, n):
    return [FakeExecutor.token_at(prompt_len + i) for i in range(n)]


@pytest.mark.parametrize("prefix_cache", [False, True])
def test_requests_finish_with_position_determined_tokens_and_free_all_blocks(prefix_cache):
    policy, _allocator, executor = make(prefix_cache=prefix_cache)
    for i, n in enumerate([3, 9, 17]):
        policy.add(req(f"r{i}", n, max_tokens=5))
    outputs, reasons = run_until_done(policy, executor)
    for i, n in enumerate([3, 9, 17]):
        assert outputs[f"r{i}"] == expected_output(n, 5)
        assert reasons[f"r{i}"] == FinishReason.LENGTH
    assert idle(policy)
    assert (policy.kv.num_cached_blocks > 0) == prefix_cache


def test_token_budget_chunks_long_prompt_while_decodes_continue():
    policy, _, executor = make(max_tokens_per_step=8)
    policy.add(req("short", 2, max_tokens=20))
    plan = policy.schedule()
    policy.update(plan, executor.execute(plan.step_input))  # short prefilled, first token sampled
    policy.add(req("long", 30, max_tokens=2))
    plan = policy.schedule()
    sizes = {r.request_id: len(r.token_ids) for r in plan.step_input.requests}
    assert sizes == {"short": 1, "long": 7}  # decode first, then the budget's rest of the prompt
    assert not plan.step_input.requests[1].sample  # a partial prompt chunk samples nothing
    policy.update(plan, executor.execute(plan.step_input))
    outputs, _ = run_until_done(policy, executor)
    assert outputs["long"] == expected_output(30, 2)
    for step in executor.steps:
        assert sum(len(r.token_ids) for r in step.requests) <= 8


def test_new_requests_join_a_running_batch_at_the_next_step():
    policy, _, executor = make()
    policy.add(req("a", 4, max_tokens=10))
    plan = policy.schedule()
    policy.update(plan, executor.execute(plan.step_input))
    policy.add(req("b", 4, max_tokens=10))
    plan = policy.schedule()
    assert [r.request_id for r in plan.step_input.requests] == ["a", "b"]


def test_max_running_caps_the_batch():
    policy, _, executor = make(max_running=2)
    for i in range(5):
        policy.add(req(f"r{i}", 3, max_tokens=4))
    plan = policy.schedule()
    assert len(plan.step_input.requests) == 2
    outputs, _ = run_until_done(policy, executor)
    assert len(outputs) == 5
    assert max(len(s.requests) for s in executor.steps) == 2


@pytest.mark.parametrize("prefix_cache", [False, True])
def test_preemption_under_kv_pressure_recomputes_and_gives_identical_output(prefix_cache):
    # 12 blocks of 4 tokens; four requests that each grow to 20 tokens (5 blocks) cannot all fit.
    policy, _allocator, executor = make(num_blocks=12, prefix_cache=prefix_cache)
    for i in range(4):
        policy.add(req(f"r{i}", 8, max_tokens=12))
    outputs, reasons = run_until_done(policy, executor)
    assert policy.num_preemptions > 0
    for i in range(4):
        assert outputs[f"r{i}"] == expected_output(8, 12)
        assert reasons[f"r{i}"] == FinishReason.LENGTH
    assert idle(policy)


def test_abort_frees_blocks_at_once():
    policy, allocator, executor = make()
    policy.add(req("a", 10, max_tokens=50))
    plan = policy.schedule()
    policy.update(plan, executor.execute(plan.step_input))
    assert allocator.num_free_blocks < allocator.num_total_blocks
    assert policy.abort("a") is not None
    assert allocator.num_free_blocks == allocator.num_total_blocks
    assert not policy.has_work()
    assert policy.abort("a") is None


def test_stop_reasons():
    policy, _, executor = make()
    executor.eos_at = {"eos": 6}
    policy.add(req("eos", 4, max_tokens=10))  # samples at positions 4, 5, then EOS at 6
    policy.add(req("ignore", 4, max_tokens=3, ignore_eos=True))
    policy.add(Request("stopid", [1, 2, 3], SamplingParams(stop_token_ids=[FakeExecutor.token_at(5)]), 10))
    outputs, reasons = run_until_done(policy, executor)
    assert reasons == {"eos": FinishReason.STOP, "ignore": FinishReason.LENGTH, "stopid": FinishReason.STOP}
    assert outputs["eos"] == [FakeExecutor.token_at(4), FakeExecutor.token_at(5), 0]
    assert outputs["stopid"] == [FakeExecutor.token_at(3), FakeExecutor.token_at(4), FakeExecutor.token_at(5)]


def test_max_model_len_ends_with_length():
    policy, _, executor = make(max_model_len=10)
    policy.add(req("a", 7, max_tokens=100))
    outputs, reasons = run_until_done(policy, executor)
    assert len(outputs["a"]) == 3 and reasons["a"] == FinishReason.LENGTH


def test_request_larger_than_the_pool_is_refused():
    policy, _, _ = make(num_blocks=4)
    with pytest.raises(ValueError, match="KV cache"):
        policy.add(req("big", 30, max_tokens=10))


def test_prefix_cache_reuses_whole_blocks_of_a_shared_prompt():
    policy, _, executor = make(prefix_cache=True)
    shared = list(range(200, 218))  # 18 tokens: 4 full blocks + 2
    policy.add(Request("first", [*shared, 1, 2], SamplingParams(max_tokens=3), 3))
    run_until_done(policy, executor)
    second = Request("second", [*shared, 7, 8, 9], SamplingParams(max_tokens=3), 3)
    policy.add(second)
    plan = policy.schedule()
    (scheduled,) = plan.step_input.requests
    assert scheduled.start_pos == 16 and scheduled.token_ids == [216, 217, 7, 8, 9]
    assert second.num_cached_tokens == 16
    policy.update(plan, executor.execute(plan.step_input))
    assert executor.reused["second"] == shared[:16]  # the cached blocks hold the shared tokens
    outputs, _ = run_until_done(policy, executor)
    assert outputs["second"] == expected_output(21, 3)[1:]


def test_prefix_cache_hit_is_capped_below_the_prompt_length():
    policy, _, executor = make(prefix_cache=True)
    prompt = list(range(300, 316))  # exactly 4 blocks
    for rid in ("a", "b"):
        policy.add(Request(rid, list(prompt), SamplingParams(max_tokens=2), 2))
        outputs, _ = run_until_done(policy, executor)
        assert outputs[rid] == expected_output(16, 2)
    # "b" had all 16 tokens cached but must compute the last one to get logits: 3 blocks reused
    assert executor.reused["b"] == prompt[:12]


def test_cache_namespaces_do_not_share_blocks():
    policy, _, executor = make(prefix_cache=True)
    prompt = list(range(400, 420))
    policy.add(Request("a", list(prompt), SamplingParams(max_tokens=1), 1, cache_namespace=1))
    run_until_done(policy, executor)
    other = Request("b", list(prompt), SamplingParams(max_tokens=1), 1, cache_namespace=2)
    policy.add(other)
    run_until_done(policy, executor)
    assert other.num_cached_tokens == 0 and "b" not in executor.reused


PUBLIC = list(range(500, 514))  # a declared public prefix's tokens: 3 full blocks + 2
PUBLIC_NS = 77


NUM_PUBLIC = len(PUBLIC)


def tenant_request(policy, rid, namespace, prompt, num_public=NUM_PUBLIC):
    request = Request(rid, prompt, SamplingParams(max_tokens=2), 2, cache_namespace=namespace)
    policy.kv.set_public_prefix(request, PUBLIC_NS, num_public)
    return request


def test_public_prefix_blocks_are_shared_across_namespaces_and_nothing_past_them():
    policy, _, executor = make(prefix_cache=True)
    secret = list(range(900, 912))
    a = tenant_request(policy, "a", 1, [*PUBLIC, *secret])
    assert a.public_len == 12
    policy.add(a)
    run_until_done(policy, executor)
    assert a.num_cached_tokens == 0
    # Another namespace, same public prefix and the same "secret" after it: only the public
    # text's whole blocks are a hit, never a token past what the public text covers.
    b = tenant_request(policy, "b", 2, [*PUBLIC, *secret])
    policy.add(b)
    outputs, _ = run_until_done(policy, executor)
    assert b.num_cached_tokens == 12 and executor.reused["b"] == PUBLIC[:12]
    assert outputs["b"] == expected_output(len(b.prompt_token_ids), 2)
    # b's own namespace holds what followed: its repeat hits all of it.
    again = tenant_request(policy, "b2", 2, [*PUBLIC, *secret])
    policy.add(again)
    run_until_done(policy, executor)
    assert again.num_cached_tokens == 24 and executor.reused["b2"] == [*PUBLIC, *secret][:24]
    # The same tokens after a different public prefix are another K/V: no hit past the prefix.
    other_public = tenant_request(policy, "d", 2, [*PUBLIC[:12], 1, 2, *secret])
    policy.add(other_public)
    run_until_done(policy, executor)
    assert other_public.num_cached_tokens == 12
    # Without the public mark (a salted request, an open server) nothing is shared.
    c = tenant_request(policy, "c", 3, [*PUBLIC, *secret], num_public=0)
    policy.add(c)
    run_until_done(policy, executor)
    assert c.num_cached_tokens == 0 and c.public_len == 0
    policy.kv.check_invariants()
    assert idle(policy)


def test_public_prefixes_are_evicted_like_any_prefix():
    """Under pressure every namespace's blocks go, the public ones included (one LRU); requests
    keep completing, and the pool is whole again afterwards."""
    policy, _, executor = make(num_blocks=12, prefix_cache=True)
    for i in range(12):
        prompt = [*PUBLIC, *range(1000 * (i + 1), 1000 * (i + 1) + 10)]
        request = tenant_request(policy, f"r{i}", i, prompt)
        policy.add(request)
        _outputs, reasons = run_until_done(policy, executor)
        assert reasons[f"r{i}"] == FinishReason.LENGTH
    assert policy.kv.tree.num_evicted_blocks > 0
    policy.kv.check_invariants()
    assert idle(policy)


def test_cached_blocks_are_evicted_before_requests_are_refused():
    policy, _allocator, executor = make(num_blocks=10, prefix_cache=True)
    for i in range(6):  # each leaves 4 cached blocks behind; the pool holds 10
        prompt = list(range(1000 * (i + 1), 1000 * (i + 1) + 16))
        policy.add(Request(f"r{i}", prompt, SamplingParams(max_tokens=4), 4))
        _outputs, reasons = run_until_done(policy, executor)
        assert reasons[f"r{i}"] == FinishReason.LENGTH
    assert policy.kv.tree.num_evicted_blocks > 0
    assert idle(policy)


def collect_updates(policy, executor, max_steps=10_000):
    """Run to the end; every update of every request, in order."""
    updates: dict[str, list] = {}
    for _ in range(max_steps):
        if not policy.has_work():
            return updates
        plan = policy.schedule()
        for update in policy.update(plan, executor.execute(plan.step_input)):
            updates.setdefault(update.request.request_id, []).append(update)
        policy.kv.check_invariants()
    raise AssertionError("did not finish")


def expected_prompt_logprobs(prompt):
    return [FakeExecutor.fake_prompt_logprob(p, prompt[p]) for p in range(1, len(prompt))]


def test_prompt_logprobs_span_every_chunk_skip_the_prefix_cache_and_come_with_the_first_token():
    policy, _, executor = make(prefix_cache=True, max_tokens_per_step=5)
    prompt = list(range(500, 517))  # 17 tokens: four chunks of 5 (the last one samples)
    policy.add(Request("warm", list(prompt), SamplingParams(max_tokens=2), 2))
    run_until_done(policy, executor)
    assert policy.kv.num_cached_blocks == 4  # the whole prompt but its last token is cached
    asked = Request("asked", list(prompt), SamplingParams(max_tokens=3, prompt_logprobs=2), 3)
    policy.add(asked)
    first = len(executor.steps)
    updates = collect_updates(policy, executor)["asked"]
    assert asked.num_cached_tokens == 0 and "asked" not in executor.reused  # nothing reused
    chunks = [r for s in executor.steps[first:] for r in s.requests if r.start_pos < len(prompt)]
    assert [r.start_pos for r in chunks] == [0, 5, 10, 15]
    # each chunk names the prompt tokens its rows predict; the last prompt token's row samples
    assert [r.prompt_logprob_token_ids for r in chunks] == [prompt[1:6], prompt[6:11], prompt[11:16], prompt[16:17]]
    assert all(r.prompt_logprob_token_ids is None for s in executor.steps[first:] for r in s.requests[len(chunks) :])
    assert updates[0].new_token_ids == expected_output(17, 1)
    assert updates[0].prompt_logprobs == expected_prompt_logprobs(prompt)
    assert all(u.prompt_logprobs is None for u in updates[1:])
    assert asked.pending_prompt_logprobs is None
    # its blocks went into the cache as usual: a later plain request reuses them
    again = Request("again", list(prompt), SamplingParams(max_tokens=1), 1)
    policy.add(again)
    run_until_done(policy, executor)
    assert again.num_cached_tokens == 16


def test_prompt_logprobs_of_a_one_token_prompt_are_empty_and_none_unless_asked():
    policy, _, executor = make()
    policy.add(Request("one", [7], SamplingParams(max_tokens=2, prompt_logprobs=0), 2))
    policy.add(req("plain", 9, max_tokens=2))
    updates = collect_updates(policy, executor)
    assert updates["one"][0].prompt_logprobs == []
    assert all(u.prompt_logprobs is None for u in updates["plain"])
    assert all(r.prompt_logprob_token_ids is None for s in executor.steps for r in s.requests)


def test_preemption_in_the_middle_of_a_prefill_recomputes_its_prompt_logprobs():
    # 8 blocks of 4: "a" decodes from 13 to 24 tokens while "b" (prompt logprobs) prefills 3
    # tokens a step; "b", the newest, is preempted mid-prefill, then readmitted and computed
    # from position 0 (its blocks cached meanwhile are not reused).
    policy, _, executor = make(num_blocks=8, prefix_cache=True, max_tokens_per_step=4)
    policy.add(req("a", 12, max_tokens=12))
    plan = policy.schedule()
    policy.update(plan, executor.execute(plan.step_input))
    b = req("b", 16, max_tokens=2, prompt_logprobs=1)
    policy.add(b)
    updates = collect_updates(policy, executor)
    assert policy.num_preemptions > 0
    b_chunks = [r for s in executor.steps for r in s.requests if r.request_id == "b"]
    restarts = [k for k, r in enumerate(b_chunks) if r.start_pos == 0]
    assert len(restarts) >= 2 and b_chunks[restarts[1] - 1].start_pos + len(b_chunks[restarts[1] - 1].token_ids) < 16
    assert updates["b"][0].prompt_logprobs == expected_prompt_logprobs(b.prompt_token_ids)
    assert [u.prompt_logprobs is None for u in updates["b"]] == [False] + [True] * (len(updates["b"]) - 1)
    assert [t for u in updates["b"] for t in u.new_token_ids] == expected_output(16, 2)
    assert idle(policy)
