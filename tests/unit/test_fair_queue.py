"""Fair admission: the waiting queue (fair between tenants, by priority inside one), the policy's
use of it (admission order, preemption victims) and the front door's bound."""

from __future__ import annotations

import itertools

import pytest

from tests.fakes import FakeExecutor
from trillium import _core
from trillium.engine_client import EngineOverloaded, FairAdmission
from trillium.protocol import SamplingParams
from trillium.scheduler import Request, SchedulerConfig, SchedulerPolicy
from trillium.scheduler.fair_queue import FairQueue
from trillium.scheduler.kv_manager import KVBlockManager

BLOCK = 4
_clock = itertools.count()


def req(rid, tenant="", prompt_len=8, max_tokens=4, priority=0):
    return Request(
        rid,
        list(range(100, 100 + prompt_len)),
        SamplingParams(max_tokens=max_tokens),
        max_tokens,
        arrival_time=float(next(_clock)),
        tenant=tenant,
        priority=priority,
    )


def drain(queue: FairQueue) -> list[str]:
    out = []
    while queue:
        head = queue.peek()
        assert queue.popleft() is head
        out.append(head.request_id)
    return out


# ---- the queue ---------------------------------------------------------------------------------


def test_one_tenant_is_fifo():
    queue = FairQueue()
    for i in range(5):
        queue.append(req(f"r{i}"))
    assert len(queue) == 5
    assert drain(queue) == [f"r{i}" for i in range(5)]
    with pytest.raises(IndexError):
        queue.peek()


def test_a_tenant_arriving_behind_a_flood_goes_next():
    queue = FairQueue()
    for i in range(100):
        queue.append(req(f"a{i}", "A"))
    queue.popleft()  # A has been served: its virtual finish is ahead
    queue.append(req("b0", "B"))
    assert queue.popleft().request_id == "b0"


def test_two_backlogged_tenants_alternate_by_prompt_tokens():
    queue = FairQueue()
    for i in range(6):
        queue.append(req(f"a{i}", "A", prompt_len=8))
        queue.append(req(f"b{i}", "B", prompt_len=16))  # twice the cost: half as many
    order = drain(queue)[:9]
    assert sum(r.startswith("a") for r in order) == 6
    assert sum(r.startswith("b") for r in order) == 3


def test_an_idle_tenant_banks_no_credit_and_cannot_skip_its_charge():
    queue = FairQueue()
    queue.append(req("b0", "B", prompt_len=64))
    queue.popleft()  # B charged 64 and now empty
    for i in range(4):
        queue.append(req(f"a{i}", "A", prompt_len=8))
    queue.append(req("b1", "B", prompt_len=8))  # B refills at once: still owes its last charge
    assert drain(queue)[:4] == ["a0", "a1", "a2", "a3"]


def test_priority_then_arrival_inside_a_tenant():
    queue = FairQueue()
    queue.append(req("low", "A", priority=5))
    queue.append(req("high", "A", priority=-1))
    queue.append(req("mid1", "A", priority=0))
    queue.append(req("mid2", "A", priority=0))
    assert drain(queue) == ["high", "mid1", "mid2", "low"]


def test_a_readded_request_goes_before_later_arrivals_of_its_tenant():
    queue = FairQueue()
    first = req("first", "A")
    queue.append(first)
    queue.append(req("second", "A"))
    assert queue.popleft() is first
    queue.append(req("third", "A"))
    queue.readd(first)  # preempted
    assert drain(queue) == ["first", "second", "third"]


def test_peek_among_some_tenants():
    queue = FairQueue()
    queue.append(req("a0", "A"))
    queue.append(req("b0", "B"))
    assert queue.peek().request_id == "a0"
    assert queue.take(queue.peek(["B", "C"])).request_id == "b0"
    with pytest.raises(IndexError):
        queue.peek(["C"])


def test_remove_and_iteration():
    queue = FairQueue()
    requests = [req(f"r{i}", "AB"[i % 2]) for i in range(6)]
    for r in requests:
        queue.append(r)
    queue.remove(requests[2])
    assert len(queue) == 5 and requests[2] not in list(queue)
    with pytest.raises(ValueError):
        queue.remove(requests[2])
    for r in requests[::2]:
        if r is not requests[2]:
            queue.remove(r)
    assert queue.tenants == ["B"] and queue.num_waiting("A") == 0
    assert drain(queue) == ["r1", "r3", "r5"]


# ---- the policy ----------------------------------------------------------------------------------


def make(num_blocks=64, **kw):
    config = SchedulerConfig(block_size=BLOCK, eos_token_ids=frozenset({0}), **kw)
    allocator = _core.BlockAllocator(num_blocks)
    return SchedulerPolicy(config, KVBlockManager(allocator, BLOCK, None)), FakeExecutor(BLOCK)


def step(policy, executor):
    plan = policy.schedule()
    policy.update(plan, executor.execute(plan.step_input))
    policy.kv.check_invariants()
    return [r.request_id for r, _ in plan.scheduled]


def test_a_flooding_tenant_does_not_delay_another_beyond_one_admission():
    policy, executor = make(num_blocks=1024, max_running=8)
    for i in range(100):
        policy.add(req(f"a{i}", "A", max_tokens=1))
    assert len(step(policy, executor)) == 8  # eight of A admitted; done after one token
    policy.add(req("b0", "B", max_tokens=1))
    assert step(policy, executor)[0] == "b0"  # of the next eight admitted, B's goes first


def test_a_tenant_under_its_share_of_running_slots_takes_one_from_a_tenant_over_it():
    policy, executor = make(num_blocks=1024, max_running=4)
    for i in range(6):
        policy.add(req(f"a{i}", "A", max_tokens=50))
    step(policy, executor)  # a0..a3 running, A over its share as soon as B shows up
    policy.add(req("b0", "B", max_tokens=50))
    assert "b0" in step(policy, executor)
    assert sorted(r.request_id for r in policy.running) == ["a0", "a1", "a2", "b0"]
    assert policy.num_preemptions == 1 and policy.waiting.peek().request_id == "a3"  # first again
    policy.add(req("b1", "B", max_tokens=50))
    step(policy, executor)  # B at 1 of its 2 slots: it takes a2's
    policy.add(req("b2", "B", max_tokens=50))
    step(policy, executor)  # B at its share: b2 waits, nothing swings back
    assert sorted(r.request_id for r in policy.running) == ["a0", "a1", "b0", "b1"]
    assert policy.num_preemptions == 2
    outputs_done = 0
    while policy.has_work():
        step(policy, executor)
        outputs_done += 1
        assert outputs_done < 1000
    assert policy.kv.num_free_blocks == policy.kv.num_total_blocks


def test_priority_orders_admission_inside_a_tenant():
    policy, executor = make(max_running=1)
    policy.add(req("late", "A", priority=1))
    policy.add(req("urgent", "A", priority=-1))
    assert step(policy, executor) == ["urgent"]


def test_preemption_takes_the_newest_lowest_priority_request_of_the_tenant_holding_most_blocks():
    # 12 blocks: three 8-token prompts (2 blocks each) of A and one of B, all decoding.
    policy, executor = make(num_blocks=9, max_running=8)
    policy.add(req("a0", "A", prompt_len=8, max_tokens=12))
    policy.add(req("b0", "B", prompt_len=8, max_tokens=12))
    policy.add(req("a1", "A", prompt_len=8, max_tokens=12, priority=3))
    policy.add(req("a2", "A", prompt_len=8, max_tokens=12))
    step(policy, executor)  # all four prefilled: 8 of 9 blocks
    assert policy.num_running == 4
    preempted = []
    while policy.num_preemptions == 0:
        running = {r.request_id for r in policy.running}
        step(policy, executor)
        preempted = sorted(running - {r.request_id for r in policy.running})
    assert preempted == ["a1"]  # A holds most blocks; a1 has its lowest priority
    assert [r.request_id for r in policy.waiting] == ["a1"]


def test_a_step_that_preempts_admits_nothing():
    policy, executor = make(num_blocks=5, max_running=8)
    policy.add(req("a0", "A", prompt_len=8, max_tokens=12))
    policy.add(req("a1", "A", prompt_len=8, max_tokens=12))
    step(policy, executor)  # 4 of 5 blocks
    policy.add(req("b0", "B", prompt_len=2, max_tokens=2))  # would fit in the last block
    while policy.num_preemptions == 0:
        scheduled = step(policy, executor)
    assert "b0" not in scheduled


# ---- the front door --------------------------------------------------------------------------------


def test_admission_bound_is_shared_by_tenants():
    admission = FairAdmission(max_running=4, max_waiting=8)
    for _ in range(10):
        admission.opened("A")
    admission.opened("B")
    admission.check("A", 3)  # under half full: anyone
    with pytest.raises(EngineOverloaded):
        admission.check("A", 4)  # half full and A has 10 >= (4 + 8) / 2 in flight
    admission.check("B", 4)  # B has 1 in flight: room
    admission.check("C", 7)  # so has a new tenant
    with pytest.raises(EngineOverloaded):
        admission.check("A", 8)  # full, and A is at its share
    admission.check("B", 8)  # full, but B is under its share: the flood cannot lock it out
    with pytest.raises(EngineOverloaded):
        admission.check("B", 16)  # twice full: nobody
    for _ in range(10):
        admission.ended("A")
    admission.ended("B")
    assert not admission.in_flight


def test_admission_lets_one_tenant_fill_the_whole_queue():
    admission = FairAdmission(max_running=4, max_waiting=8)
    for _ in range(4 + 7):
        admission.opened("")
    admission.check("", 7)
    with pytest.raises(EngineOverloaded):
        admission.check("", 8)
