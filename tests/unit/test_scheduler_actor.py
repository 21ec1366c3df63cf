"""SchedulerActor with a fake executor: delivery, abort, failures, backpressure, stats.

Synchronization is by events, never by guessing how long a step takes: :func:`settle` waits
until the actor has acted on everything sent to it, and :class:`SlowExecutor` can hold a step
in its thread until the test opens its gate."""

from __future__ import annotations

import threading
import time

import pytest
import trio
import trio.testing

from tests.fakes import FakeExecutor
from trillium import _core
from trillium.protocol import AbortRequest, AddRequest, FinishReason, SamplingParams, TokenDelta, Verdict
from trillium.runtime import Mailbox, MailboxClosed, Supervisor, open_inbox
from trillium.scheduler import SchedulerConfig
from trillium.scheduler.actor import SchedulerActor, merge_deltas
from trillium.scheduler.kv_manager import KVBlockManager, cache_namespace, public_namespace

BLOCK = 4


class SlowExecutor(FakeExecutor):
    """Sleeps in the worker thread, like a real model step; can be told to fail."""

    def __init__(self, *args, delay=0.01, fail_on=None, gated=False, **kw):
        super().__init__(*args, **kw)
        self.delay = delay
        self.fail_on = fail_on
        self.thread_ids = set()
        self.gate = threading.Event()  # a gated executor holds every step until this is set
        if not gated:
            self.gate.set()

    def execute(self, step_input):
        self.thread_ids.add(threading.get_ident())
        assert self.gate.wait(timeout=30), "the test never opened the gate"
        time.sleep(self.delay)
        if self.fail_on and any(r.request_id == self.fail_on for r in step_input.requests):
            raise RuntimeError("boom")
        return super().execute(step_input)


async def settle(actor: SchedulerActor) -> None:
    """Return once the actor has acted on everything sent to it: every task is blocked and no
    step is running in the executor thread (a step in its thread counts as blocked for Trio)."""
    while True:
        await trio.testing.wait_all_tasks_blocked()
        if not actor.in_step:
            return
        await trio.sleep(0.001)  # a step is running in its thread: check again when it may be done


async def start(nursery, num_blocks=64, executor=None):
    send, recv = open_inbox(8)
    allocator = _core.BlockAllocator(num_blocks)
    executor = executor or SlowExecutor(BLOCK)
    kv = KVBlockManager(allocator, BLOCK)
    actor = SchedulerActor(SchedulerConfig(block_size=BLOCK, eos_token_ids=frozenset({0})), kv, executor, recv)
    await nursery.start(actor.run)
    return send, allocator, executor, actor


def submit(send, rid, prompt_len=5, max_tokens=6, **fields):
    box = Mailbox(merge_deltas)
    send.send_nowait(
        AddRequest(
            request_id=rid,
            prompt_token_ids=list(range(50, 50 + prompt_len)),
            sampling=SamplingParams(max_tokens=max_tokens),
            reply=box,
            **fields,
        )
    )
    return box


async def collect(box, deltas=None):
    tokens, reason = [], None
    while True:
        try:
            delta = await box.get()
        except MailboxClosed:
            return tokens, reason
        if deltas is not None:
            deltas.append(delta)
        tokens += delta.token_ids
        reason = delta.finish_reason or reason


async def test_concurrent_requests_all_complete_in_worker_thread():
    async with trio.open_nursery() as nursery:
        send, allocator, executor, _ = await start(nursery)
        boxes = [submit(send, f"r{i}", prompt_len=3 + i, max_tokens=6) for i in range(6)]
        results = [await collect(b) for b in boxes]
        for i, (tokens, reason) in enumerate(results):
            assert tokens == [FakeExecutor.token_at(3 + i + k) for k in range(6)]
            assert reason == FinishReason.LENGTH
        assert threading.get_ident() not in executor.thread_ids  # steps never ran on the event loop
        assert allocator.num_free_blocks == allocator.num_total_blocks
        nursery.cancel_scope.cancel()


async def test_abort_message_frees_blocks_and_closes_mailbox():
    async with trio.open_nursery() as nursery:
        send, allocator, _, _ = await start(nursery)
        box = submit(send, "a", max_tokens=200)
        await box.get()  # it is running
        assert allocator.num_free_blocks < allocator.num_total_blocks
        await send.send(AbortRequest("a"))
        _, reason = await collect(box)
        assert reason is None  # aborted streams just close
        # The blocks were freed before the mailbox was closed.
        assert allocator.num_free_blocks == allocator.num_total_blocks
        nursery.cancel_scope.cancel()


async def test_consumer_leaving_aborts_without_a_message():
    async with trio.open_nursery() as nursery:
        send, allocator, _, actor = await start(nursery)
        box = submit(send, "gone", max_tokens=200)
        await box.get()
        box.close_consumer()
        with trio.fail_after(10):
            await settle(actor)
        assert not actor.policy.has_work()
        assert allocator.num_free_blocks == allocator.num_total_blocks
        nursery.cancel_scope.cancel()


async def test_failing_step_fails_every_request_in_flight_rebuilds_the_pool_and_serves_again():
    """A step raises: running and waiting requests get ERROR, the KV pool is rebuilt empty, the
    exception reaches the supervisor, which restarts the actor; then it serves again."""
    send, recv = open_inbox(8)
    executor = SlowExecutor(BLOCK, fail_on="bad", gated=True)
    kv = KVBlockManager(_core.BlockAllocator(64), BLOCK, None)
    config = SchedulerConfig(block_size=BLOCK, max_running=1, eos_token_ids=frozenset({0}))
    actor = SchedulerActor(config, kv, executor, recv)
    supervisor = Supervisor([actor])
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: supervisor.run(handle_signals=False, task_status=task_status))
        bad = submit(send, "bad")
        waiting = submit(send, "waiting")  # max_running=1: it waits behind "bad"
        while actor.policy.num_waiting < 1 or not actor.in_step:
            await trio.sleep(0.001)  # until "bad" is in its step and "waiting" is queued
        executor.gate.set()
        for box in (bad, waiting):
            delta = await box.get()
            assert delta.finish_reason == FinishReason.ERROR and "boom" in delta.error
        good_tokens, reason = await collect(submit(send, "good"))
        assert reason == FinishReason.LENGTH and len(good_tokens) == 6
        assert supervisor.num_restarts == 1 and executor.num_resets == 1
        pool = actor.policy.kv
        assert pool is not kv and pool.num_free_blocks == pool.num_total_blocks == 64
        assert actor.stats.latest.num_requests_running == 0
        supervisor.request_shutdown()
    assert supervisor.exit_code == 0


async def test_full_inbox_is_backpressure_not_a_queue():
    async with trio.open_nursery() as nursery:
        executor = SlowExecutor(BLOCK, gated=True)
        send, _, _, actor = await start(nursery, executor=executor)
        submit(send, "first")
        try:
            await trio.testing.wait_all_tasks_blocked()
            assert actor.in_step  # held in its step, not reading the inbox
            for i in range(8):
                submit(send, f"q{i}")
            with pytest.raises(trio.WouldBlock):
                submit(send, "one-too-many")
        finally:
            executor.gate.set()
        nursery.cancel_scope.cancel()


async def test_slow_consumer_gets_merged_deltas():
    async with trio.open_nursery() as nursery:
        send, _, _, actor = await start(nursery, executor=SlowExecutor(BLOCK, delay=0.001))
        box = submit(send, "slow", max_tokens=20)
        with trio.fail_after(10):
            await settle(actor)  # every step has finished before we read
        delta = await box.get()
        assert len(delta.token_ids) == 20 and delta.finish_reason == FinishReason.LENGTH
        nursery.cancel_scope.cancel()


async def test_prompt_logprobs_survive_the_merge_of_a_slow_consumers_deltas():
    first = TokenDelta("r", [1], num_prompt_tokens=2, prompt_logprobs=[(-1.5, [(9, -0.5)])])
    merged = merge_deltas(merge_deltas(first, TokenDelta("r", [2])), TokenDelta("r", [3], FinishReason.LENGTH))
    assert merged.token_ids == [1, 2, 3] and merged.prompt_logprobs == [(-1.5, [(9, -0.5)])]
    assert merge_deltas(TokenDelta("r", []), first).prompt_logprobs == first.prompt_logprobs
    async with trio.open_nursery() as nursery:
        send, _, _, actor = await start(nursery, executor=SlowExecutor(BLOCK, delay=0.001))
        box = Mailbox(merge_deltas)
        prompt = list(range(50, 59))
        sampling = SamplingParams(max_tokens=5, prompt_logprobs=1)
        send.send_nowait(AddRequest(request_id="p", prompt_token_ids=prompt, sampling=sampling, reply=box))
        with trio.fail_after(10):
            await settle(actor)
        delta = await box.get()  # every delta of the request, merged
        assert len(delta.token_ids) == 5 and delta.finish_reason == FinishReason.LENGTH
        assert delta.prompt_logprobs == [FakeExecutor.fake_prompt_logprob(p, prompt[p]) for p in range(1, 9)]
        nursery.cancel_scope.cancel()


async def test_stats_are_published_as_snapshots():
    """Readers get an immutable snapshot that moves with the actor, never a call into it."""
    async with trio.open_nursery() as nursery:
        executor = SlowExecutor(BLOCK, gated=True)
        send, allocator, _, actor = await start(nursery, executor=executor)
        idle = actor.stats.latest
        assert (idle.num_steps, idle.num_requests_running, idle.num_free_blocks) == (0, 0, 64)
        box = submit(send, "r", prompt_len=5, max_tokens=3)
        try:
            await trio.testing.wait_all_tasks_blocked()
            busy = actor.stats.latest  # published once scheduled, before the first step returns
        finally:
            executor.gate.set()
        assert busy.num_requests_running == 1 and busy.num_blocks_in_use > 0
        await collect(box)
        with trio.fail_after(10):
            await settle(actor)
        done = actor.stats.latest
        assert done.num_steps == 3 and done.num_step_tokens == 5 + 2 and done.num_requests_running == 0
        assert done.num_free_blocks == allocator.num_free_blocks
        assert idle.num_steps == 0  # earlier snapshots are never changed
        with pytest.raises(AttributeError):
            done.num_steps = 0  # frozen
        nursery.cancel_scope.cancel()


async def test_a_step_past_its_time_limit_makes_the_actor_not_live():
    send, recv = open_inbox(8)
    executor = SlowExecutor(BLOCK, gated=True)
    kv = KVBlockManager(_core.BlockAllocator(64), BLOCK)
    actor = SchedulerActor(SchedulerConfig(block_size=BLOCK), kv, executor, recv, step_timeout_s=0.05)
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        box = submit(send, "slow")
        while not actor.in_step:
            await trio.sleep(0.001)
        assert actor.liveness(time.monotonic()) is None
        await trio.sleep(0.1)
        assert "model step running for" in actor.liveness(time.monotonic())
        executor.gate.set()
        await collect(box)
        assert actor.liveness(time.monotonic()) is None
        # The limit follows the recent steps' p99 once it is above the floor.
        actor._recent_steps.extend([1.0] * 100)
        assert actor.step_limit() == pytest.approx(10.0)
        nursery.cancel_scope.cancel()


class RecordingSink:
    """A CacheEventSink that keeps what it is given."""

    num_sent = 7  # what /stats shows as kv_events_published
    num_dropped = 2

    def __init__(self) -> None:
        self.journal: list = []
        self.num_cleared = 0
        self.want_snapshot = False
        self.namespaces: set[int] = set()

    def publish(self, events) -> None:
        self.journal.extend(events)

    def cleared(self) -> None:
        self.num_cleared += 1

    def snapshot_wanted(self) -> bool:
        wanted, self.want_snapshot = self.want_snapshot, False
        return wanted

    def add_namespace(self, namespace: int) -> None:
        self.namespaces.add(namespace)


async def test_the_prefix_caches_changes_reach_the_event_sink_and_a_rebuilt_pool_clears_it():
    """Between steps the actor hands the tree's journal to its sink: what a request computed is
    reported stored (the cached prompt blocks, in order), and a failed step's rebuilt pool is
    reported cleared, with the new tree journaling too."""
    send, recv = open_inbox(8)
    executor = SlowExecutor(BLOCK, fail_on="bad")
    allocator = _core.BlockAllocator(64)
    tree = _core.RadixTree(allocator, BLOCK)
    tree.record_events = True
    sink = RecordingSink()
    config = SchedulerConfig(block_size=BLOCK, eos_token_ids=frozenset({0}))
    actor = SchedulerActor(config, KVBlockManager(allocator, BLOCK, tree), executor, recv, cache_events=sink)
    supervisor = Supervisor([actor])
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: supervisor.run(handle_signals=False, task_status=task_status))
        await collect(submit(send, "a", prompt_len=9, max_tokens=2))
        await settle(actor)
        stored = [e for e in sink.journal if e.kind == "stored"]
        assert stored and stored[0].tokens[: 2 * BLOCK] == list(range(50, 50 + 2 * BLOCK))
        assert stored[0].parent_block_id == -1
        await collect(submit(send, "bad"))
        await settle(actor)
        assert sink.num_cleared == 1 and actor.policy.kv.tree.record_events
        sink.journal.clear()
        await collect(submit(send, "b", prompt_len=9, max_tokens=2))
        await settle(actor)
        assert any(e.kind == "stored" for e in sink.journal)  # the rebuilt tree reports too
        # A subscriber joins while the scheduler idles: within a tick it is sent the whole cache.
        sink.journal.clear()
        sink.want_snapshot = True
        with trio.fail_after(5):
            while not sink.journal:
                await trio.sleep(0.05)
        assert sink.num_cleared == 2 and all(e.kind == "stored" for e in sink.journal)
        cached = sum(len(e.block_ids) for e in sink.journal)
        assert cached == actor.policy.kv.num_cached_blocks > 0
        stats = actor.stats.latest
        assert (stats.kv_events_published, stats.kv_events_dropped) == (7, 2)
        supervisor.request_shutdown()


class GatedController:
    """A structured-output controller whose verdicts may search (``searches``) and wait for the
    test's gate: appends each kept token, checked by the scheduler's stop rule, like a grammar
    that allows everything."""

    searches = True

    def __init__(self, limit):
        self.gate = threading.Event()
        self.called = threading.Event()
        self.threads: set[int] = set()

    def draft_run(self, num_output, propose):
        return []

    def step(self, output, token_ids, logprobs, stop, deadline):
        self.threads.add(threading.get_ident())
        self.called.set()
        assert self.gate.wait(timeout=30), "the test never opened the gate"
        reason = None
        for t in token_ids:
            output.append(t)
            reason = stop(t, len(output))
            if reason is not None:
                break
        return Verdict(new_token_ids=list(token_ids), num_unchanged=len(output), finish_reason=reason)


class GatedGrammar:
    def __init__(self):
        self.controllers: list[GatedController] = []

    def new_controller(self, *, limit, **_):
        self.controllers.append(GatedController(limit))
        return self.controllers[-1]


async def test_a_verdict_that_may_search_is_decided_off_the_loop_while_other_requests_step_on():
    """A value-checked structured request's verdict (closing and witness searches, up to the
    step's search time of Python work) is decided on the search thread: while it is held, the
    event loop runs, an unconstrained request streams to its end, and the held request sits out
    the steps (it is not scheduled again before its verdict). Its output is then the same."""
    grammar = GatedGrammar()
    async with trio.open_nursery() as nursery:
        send, allocator, _, actor = await start(nursery)
        held = submit(send, "held", max_tokens=3, grammar=grammar)
        await trio.to_thread.run_sync(lambda: grammar.controllers[0].called.wait(10))
        steps_before = actor.num_steps
        free, _ = await collect(submit(send, "free", prompt_len=7, max_tokens=6))
        assert free == [FakeExecutor.token_at(7 + k) for k in range(6)]
        assert actor.num_steps >= steps_before + 6  # the free request's steps ran meanwhile
        held_request = actor.policy.requests["held"]
        assert held_request.pending and held_request.output_token_ids == []  # its first verdict is held
        controller = grammar.controllers[0]
        controller.gate.set()
        tokens, reason = await collect(held)
        nursery.cancel_scope.cancel()
    assert tokens == [FakeExecutor.token_at(5 + k) for k in range(3)] and reason == FinishReason.LENGTH
    assert controller.threads and threading.get_ident() not in controller.threads
    assert allocator.num_free_blocks == allocator.num_total_blocks


async def test_a_request_aborted_while_its_verdict_is_pending_frees_its_blocks_at_once():
    grammar = GatedGrammar()
    async with trio.open_nursery() as nursery:
        send, allocator, _, actor = await start(nursery)
        held = submit(send, "held", max_tokens=3, grammar=grammar)
        await trio.to_thread.run_sync(lambda: grammar.controllers[0].called.wait(10))
        await send.send(AbortRequest("held"))
        _, reason = await collect(held)
        assert reason is None and allocator.num_free_blocks == allocator.num_total_blocks
        grammar.controllers[0].gate.set()  # its late verdict is dropped
        box = submit(send, "next", max_tokens=2)
        assert (await collect(box))[1] == FinishReason.LENGTH
        assert not actor.policy.requests
        nursery.cancel_scope.cancel()


def journaling_actor():
    """(its inbox, a scheduler whose prefix cache journals to a RecordingSink, the sink)."""
    send, recv = open_inbox(8)
    allocator = _core.BlockAllocator(64)
    tree = _core.RadixTree(allocator, BLOCK)
    tree.record_events = True
    sink = RecordingSink()
    config = SchedulerConfig(block_size=BLOCK, eos_token_ids=frozenset({0}))
    actor = SchedulerActor(config, KVBlockManager(allocator, BLOCK, tree), SlowExecutor(BLOCK), recv, cache_events=sink)
    return send, actor, sink


async def test_tenant_scopes_never_share_cached_blocks_and_their_events_are_published():
    """The same prompt from two tenant scopes: the second computes it all (0 cached tokens); from
    the first scope again, it hits. Each unsalted scope's namespace is published for the router; a
    salted request's is not."""
    send, actor, sink = journaling_actor()
    config = actor.policy.config
    supervisor = Supervisor([actor])

    async def cached_tokens(rid: str, **fields) -> int:
        deltas: list = []
        await collect(submit(send, rid, prompt_len=3 * BLOCK + 1, max_tokens=2, **fields), deltas)
        await settle(actor)
        return max(d.num_cached_tokens for d in deltas)

    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: supervisor.run(handle_signals=False, task_status=task_status))
        assert await cached_tokens("a1", cache_scope="tenant:acme") == 0
        assert await cached_tokens("g1", cache_scope="tenant:globex") == 0
        assert await cached_tokens("a2", cache_scope="tenant:acme") == 3 * BLOCK
        assert await cached_tokens("open", cache_scope=None) == 0
        assert await cached_tokens("salted", cache_scope="tenant:acme", cache_salt="s") == 0
        model = config.model_key
        published = {cache_namespace(model, None, s) for s in ("tenant:acme", "tenant:globex", None)}
        assert sink.namespaces == published
        assert {e.namespace for e in sink.journal if e.kind == "stored"} >= published
        actor.policy.kv.check_invariants()
        supervisor.request_shutdown()


async def test_a_public_prefix_is_published_whole_its_rest_chained_to_it():
    """A request whose first blocks are a declared public prefix's: the public chain is published
    from position 0, and the rest (its derived namespace) chained to the public chain's last block,
    so a router indexes one sequence."""
    send, actor, sink = journaling_actor()
    config = actor.policy.config
    supervisor = Supervisor([actor])
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: supervisor.run(handle_signals=False, task_status=task_status))
        box = submit(
            send,
            "p",
            prompt_len=4 * BLOCK + 1,
            max_tokens=2,
            cache_scope="tenant:acme",
            num_public_tokens=2 * BLOCK + 1,
        )
        await collect(box)
        await settle(actor)
        public = public_namespace(config.model_key)
        stored = [e for e in sink.journal if e.kind == "stored"]
        head = [e for e in stored if e.namespace == public]
        rest = [e for e in stored if e.namespace not in (public,)]
        assert len(head) == 1 and head[0].parent_block_id == -1 and head[0].tokens == list(range(50, 50 + 2 * BLOCK))
        assert rest and rest[0].parent_block_id == head[0].block_ids[-1]
        assert rest[0].tokens[:BLOCK] == list(range(50 + 2 * BLOCK, 50 + 3 * BLOCK))
        assert {public, rest[0].namespace} <= sink.namespaces
        supervisor.request_shutdown()
