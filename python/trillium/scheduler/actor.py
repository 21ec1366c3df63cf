"""SchedulerActor: the async shell around :class:`SchedulerPolicy` and the executor.

Loop: take messages → schedule a step → run it on the step thread (the event loop stays free
for HTTP, ``/health`` included) → update requests and deliver :class:`TokenDelta`s → publish a
:class:`SchedulerStats` snapshot. Messages that arrive while a step runs wait in the bounded
inbox and are applied before the next schedule, so the policy is only ever touched by the
actor's own task, on the event loop.

Structured output with value checks: a request's verdict may take closing and witness searches
of up to ``structured.controller.CLOSE_SEARCH_SECONDS`` per step. Such a request's step is
deferred (``policy.Deferred``) to the search thread while the next step runs without it; its
verdict is settled on the loop before a later step (the request sat one out). ``/health``, the
other streams and the model never wait for a search.

Failure: if a step raises (the model runner) or the actor's own code does, every request in
flight -- running or waiting -- gets an error delta, the KV pool is rebuilt empty (a fresh
allocator and prefix cache: the K/V and bookkeeping of a failed step cannot be trusted), and the
exception goes on to the supervisor, which restarts the actor as its policy allows. Requests
queued in the inbox meanwhile are served after the restart.

Watchdog: :meth:`SchedulerActor.liveness` reports a step that has run longer than
``max(step_timeout_factor x the p99 of recent steps, step_timeout_s)``.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol

import trio

from trillium.engine.step_thread import StepThread
from trillium.protocol import (
    AbortRequest,
    AddRequest,
    FinishReason,
    FlushPrefixCache,
    SchedulerStats,
    StepInput,
    StepOutput,
    TokenDelta,
    Verdict,
)
from trillium.runtime import Actor, Snapshot, faults
from trillium.scheduler.kv_manager import KVBlockManager, cache_namespace, public_namespace
from trillium.scheduler.policy import SchedulerConfig, SchedulerPolicy
from trillium.scheduler.request import Request
from trillium.scheduler.step import Deferred, RequestUpdate, StepPlan
from trillium.structured.controller import CLOSE_SEARCH_SECONDS

if TYPE_CHECKING:
    from trillium._core import CacheEvent
    from trillium.structured.bitmask import BitmaskFiller, StepBitmask

log = logging.getLogger("trillium.scheduler")


class Executor(Protocol):
    """Runs one step. Called on the step thread; must not touch scheduler state."""

    def execute(self, step_input: StepInput) -> StepOutput: ...

    def reset(self) -> None:
        """Forget every request (after a failure; the KV pool is rebuilt empty)."""


@dataclasses.dataclass(frozen=True)
class ChainedEvent:
    """A journalled 'stored' event of a derived namespace, its first block chained to the public
    block its sequence continues (the C++ event says -1: the namespace's own root)."""

    kind: str
    namespace: int
    block_ids: list[int]
    parent_block_id: int
    tokens: list[int]


def rechain(events: list[CacheEvent], parents: dict[int, int]) -> list[Any]:
    """``events`` with each derived namespace's root 'stored' event chained to its public parent."""
    if not parents:
        return list(events)
    out: list[Any] = []
    for e in events:
        parent = parents.get(e.namespace) if e.kind == "stored" and e.parent_block_id < 0 else None
        out.append(e if parent is None else ChainedEvent(e.kind, e.namespace, e.block_ids, parent, e.tokens))
    return out


class CacheEventSink(Protocol):
    """Where the prefix cache's journal goes between steps (cluster.kv_events publishes it for a
    KV-aware router). Called on the event loop; must not block."""

    def publish(self, events: list[CacheEvent]) -> None: ...

    def cleared(self) -> None:
        """The prefix cache was dropped whole (the KV pool was rebuilt after a failure)."""

    def snapshot_wanted(self) -> bool:
        """True once when a new subscriber needs the whole cache (cleared, then every block)."""

    def add_namespace(self, namespace: int) -> None:
        """Publish this namespace's events from now on (one an unsalted request uses)."""

    @property
    def num_sent(self) -> int:
        """Batches handed to the wire so far (for /stats and /metrics)."""

    @property
    def num_dropped(self) -> int:
        """Batches dropped so far because the sender was behind."""


def merge_deltas(old: TokenDelta, new: TokenDelta) -> TokenDelta:
    """Mailbox merge: a slow client gets the tokens of several steps in one delta (prompt
    logprobs come in one delta only, the request's first: kept from whichever has them)."""
    return TokenDelta(
        request_id=old.request_id,
        token_ids=old.token_ids + new.token_ids,
        finish_reason=new.finish_reason,
        num_prompt_tokens=new.num_prompt_tokens,
        error=new.error,
        num_cached_tokens=new.num_cached_tokens,
        logprobs=None if old.logprobs is None and new.logprobs is None else (old.logprobs or []) + (new.logprobs or []),
        queue_time=new.queue_time,
        prompt_logprobs=old.prompt_logprobs if old.prompt_logprobs is not None else new.prompt_logprobs,
        closed_early=new.closed_early,
        unsatisfied_check=new.unsatisfied_check,
    )


# The watchdog's step limit: max(factor x p99 of the last RECENT_STEPS steps, floor).
STEP_TIMEOUT_S = 30.0
STEP_TIMEOUT_FACTOR = 10.0
RECENT_STEPS = 512
IDLE_TICK_S = 0.5


class SchedulerActor(Actor):
    """Owns the policy and the executor thread; the only writer of KV bookkeeping."""

    name = "scheduler"

    def __init__(
        self,
        config: SchedulerConfig,
        kv: KVBlockManager,
        executor: Executor,
        inbox: trio.MemoryReceiveChannel[AddRequest | AbortRequest | FlushPrefixCache],
        bitmask_filler: BitmaskFiller | None = None,
        *,
        step_timeout_s: float = STEP_TIMEOUT_S,
        step_timeout_factor: float = STEP_TIMEOUT_FACTOR,
        step_thread: StepThread | None = None,
        cache_events: CacheEventSink | None = None,
    ) -> None:
        """``step_thread``: where steps run -- the thread that loaded the model (see
        :mod:`trillium.engine.step_thread`); a private one when None. ``cache_events``: gets the
        prefix cache's journal after every change (its tree must record events)."""
        super().__init__(inbox)
        self.cache_events = cache_events
        self._public_namespace = public_namespace(config.model_key)  # declared public prefixes' blocks
        self.policy = SchedulerPolicy(config, kv)
        self.executor = executor
        self._inbox = inbox
        self.step_timeout_s = step_timeout_s
        self.step_timeout_factor = step_timeout_factor
        # Monotonic start of the step in the executor, for the watchdog (which also covers the
        # search thread's oldest batch: _searching), so nothing stuck off the loop leaves /health green.
        self._step_started: float | None = None
        self._recent_steps: collections.deque[float] = collections.deque(maxlen=RECENT_STEPS)
        self.bitmask_filler = bitmask_filler  # structured output: fills masks while the model runs
        # One model step at a time, always on the same thread: the executor owns the model and
        # the KV tensors.
        if step_thread is None:
            step_thread = StepThread()
            weakref.finalize(self, step_thread.close)
        self.step_thread = step_thread
        # Deferred structured-output verdicts (closing and witness searches): one thread, one
        # step's batch at a time, in order; (the batch, its verdicts, when it was submitted).
        self._search_thread = ThreadPoolExecutor(1, thread_name_prefix="trillium-search")
        weakref.finalize(self, self._search_thread.shutdown, wait=False)
        self._searching: collections.deque[tuple[list[Deferred], Future[list[Verdict | Exception]], float]] = (
            collections.deque()
        )
        self._decided = trio.Event()  # set when a batch of verdicts is ready (a fresh one after each wait)
        self.num_steps = 0
        self.step_seconds = 0.0  # time inside executor.execute, for /stats and benchmarks
        self.num_step_tokens = 0
        # Where /stats and /metrics read this actor's counters: replaced whole, never read back.
        self.stats = Snapshot(SchedulerStats())
        self._publish_stats()  # the empty pool, true before the actor runs

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                self._drain_inbox()
                self._publish_stats()  # what the last step and the messages since then changed
                if self.policy.has_work():
                    await self._step()
                else:
                    await self._release_finished()
                    # Idle with a cache-event sink: look up every IDLE_TICK_S, so a subscriber
                    # that joins while no request runs gets its snapshot (_publish_cache_events).
                    with trio.move_on_after(IDLE_TICK_S if self.cache_events is not None else math.inf):
                        message = await self._inbox.receive()
                        self.took_message()
                        self._apply(message)
        except Exception as exc:
            self._fail_all(exc)
            raise
        finally:
            self._abort_all()  # shutdown: what is left is aborted, not failed
            self._publish_stats()

    def liveness(self, now: float) -> str | None:
        """A step running past its limit (the model hung, or is far slower than it was), or a
        structured-output search that did (its requests would wait for ever)."""
        limit = self.step_limit()
        started = self._step_started
        if started is not None and now - started > limit:
            return f"model step running for {now - started:.0f} s (limit {limit:.0f} s)"
        if self._searching and now - self._searching[0][2] > limit:
            return f"structured-output search running for {now - self._searching[0][2]:.0f} s (limit {limit:.0f} s)"
        return None

    def step_limit(self) -> float:
        """Seconds a step may take before the watchdog reports it."""
        recent = sorted(self._recent_steps)
        p99 = recent[int(0.99 * (len(recent) - 1))] if recent else 0.0
        return max(self.step_timeout_factor * p99, self.step_timeout_s)

    @property
    def in_step(self) -> bool:
        """True while a step runs on the step thread."""
        return self._step_started is not None

    def inbox_backlog(self) -> int:
        """While a step runs, messages wait by design; the step limit covers a stuck step."""
        return 0 if self._step_started is not None else super().inbox_backlog()

    def _fail_all(self, error: BaseException) -> None:
        """Fail every request in flight and rebuild the KV pool empty (see the module docstring)."""
        requests = list(self.policy.requests.values())
        log.error("scheduler failed; failing its %d requests and rebuilding the KV pool", len(requests))
        message = f"internal error: {type(error).__name__}: {error}"
        for request in requests:
            self._deliver_error(request, message)
        self.policy = SchedulerPolicy(self.policy.config, self.policy.kv.rebuilt())
        self._searching.clear()  # their requests were failed above; late verdicts are dropped
        if self.cache_events is not None:
            self.cache_events.cleared()
        self.executor.reset()
        self._step_started = None
        self._publish_stats()

    # ---- messages ----------------------------------------------------------------------------

    def _drain_inbox(self) -> None:
        while True:
            try:
                message = self._inbox.receive_nowait()
            except trio.WouldBlock:
                return
            self.took_message()
            self._apply(message)

    def _apply(self, message: AddRequest | AbortRequest | FlushPrefixCache) -> None:
        if isinstance(message, AddRequest):
            self._add(message)
        elif isinstance(message, AbortRequest):
            request = self.policy.abort(message.request_id)
            if request is not None:
                request.reply.close()
        elif isinstance(message, FlushPrefixCache):
            log.info("prefix cache flushed: %d blocks freed", self.policy.kv.flush())
        else:
            log.error("scheduler: unexpected message %r", message)

    def _add(self, message: AddRequest) -> None:
        sampling = message.sampling
        room = self.policy.config.max_model_len - len(message.prompt_token_ids)
        max_tokens = room if sampling.max_tokens is None else min(sampling.max_tokens, room)
        namespace = cache_namespace(self.policy.config.model_key, message.cache_salt, message.cache_scope)
        if self.cache_events is not None and message.cache_salt is None:
            self.cache_events.add_namespace(namespace)
        request = Request(
            message.request_id,
            message.prompt_token_ids,
            sampling,
            max_tokens,
            reply=message.reply,
            arrival_time=message.arrival_time or None,
            cache_namespace=namespace,
            structured=(
                None
                if message.grammar is None
                else message.grammar.new_controller(
                    limit=max_tokens,
                    sampling=sampling,
                    eos_token_ids=self.policy.config.eos_token_ids,
                    jump_forward=self.policy.config.jump_forward,
                    counters=self.policy.structured_counters,
                )
            ),
            tenant=message.tenant,
            priority=message.priority,
        )
        if message.num_public_tokens:
            self.policy.kv.set_public_prefix(request, self._public_namespace, message.num_public_tokens)
            if self.cache_events is not None and request.public_len:
                # The public blocks start at position 0; what follows them (a derived namespace,
                # from position public_len on) is published chained to the public chain's last
                # block (_publish_cache_events), so a router sees the whole sequence.
                self.cache_events.add_namespace(self._public_namespace)
                self.cache_events.add_namespace(request.rest_namespace)
        try:
            if max_tokens < 1:
                raise ValueError("the prompt fills the model's context; no room to generate")
            self.policy.add(request)
        except ValueError as exc:
            message.reply.put(
                TokenDelta(message.request_id, [], FinishReason.ERROR, len(message.prompt_token_ids), str(exc))
            )
            message.reply.close()

    # ---- steps -------------------------------------------------------------------------------

    async def _step(self) -> None:
        """One step: schedule → run → update (and deliver)."""
        await faults.ahit("scheduler.step")
        self._abort_disconnected()
        self._settle_decided()
        plan = self.policy.schedule()
        self._publish_stats()  # admissions and preemptions show while the step runs
        if not plan.scheduled:
            await self._wait_for_room()
            return
        await self._update(plan, await self._run(plan))

    async def _release_finished(self) -> None:
        """Going idle: give the executor the requests that finished since the last step, in a
        step of no requests, so what it keeps per request (a draft model's KV blocks) is freed
        now rather than with the next request's first step."""
        finished = self.policy.take_finished()
        if finished:
            await self.step_thread.run(self.executor.execute, StepInput(requests=[], finished_request_ids=finished))
            self._publish_stats()  # the draft pool's blocks are back

    async def _wait_for_room(self) -> None:
        """Nothing fits right now: wait briefly for a message (an abort may free blocks), or for
        the verdicts of requests that sit out steps, rather than spin."""
        with trio.move_on_after(0.05):
            if self._searching:
                await self._decided.wait()
                self._decided = trio.Event()
                return
            message = await self._inbox.receive()
            self.took_message()
            self._apply(message)

    async def _run(self, plan: StepPlan) -> StepOutput:
        """Run the plan's step on the step thread (masks filled meanwhile). Raises what the
        executor raised (the actor fails: see the module docstring)."""
        step_bitmask = self._begin_bitmask(plan)
        now = time.monotonic()
        for request, _ in plan.scheduled:
            if request.first_scheduled_time is None:
                request.first_scheduled_time = now  # its queue time ends here (metering)
        start = time.perf_counter()
        self._step_started = time.monotonic()
        try:
            output = await self.step_thread.run(self._execute, plan.step_input)
        finally:
            self._step_started = None
        seconds = time.perf_counter() - start
        self._recent_steps.append(seconds)
        self.num_steps += 1
        self.step_seconds += seconds
        self.num_step_tokens += sum(n for _, n in plan.scheduled)
        if self.bitmask_filler is not None:
            self.bitmask_filler.end_step(step_bitmask)  # the runner waited for the fill before sampling
        return output

    def _execute(self, step_input: StepInput) -> StepOutput:
        """On the step thread."""
        faults.hit("runner.execute")
        return self.executor.execute(step_input)

    async def _update(self, plan: StepPlan, output: StepOutput) -> None:
        """Apply the step's tokens to the requests and deliver each one's delta; the verdicts
        that may search go to the search thread (:meth:`_settle_decided` applies them)."""
        deferred: list[Deferred] = []
        for update in self.policy.update(plan, output, deferred):
            self._deliver(update)
        if deferred:
            future = self._search_thread.submit(_decide, deferred)
            self._searching.append((deferred, future, time.monotonic()))
            token = trio.lowlevel.current_trio_token()
            future.add_done_callback(lambda _: _call_soon(token, self._wake))

    def _wake(self) -> None:
        self._decided.set()

    def _settle_decided(self) -> None:
        """Apply the verdicts the search thread has reached, in the order of their steps."""
        while self._searching and self._searching[0][1].done():
            deferred, future, _ = self._searching.popleft()
            for step, verdict in zip(deferred, future.result()):
                if isinstance(verdict, Exception):  # a check or search that cannot run fails its request only
                    error = f"structured output failed: {verdict!r}"
                    verdict = Verdict(new_token_ids=[], num_unchanged=0, finish_reason=FinishReason.ERROR, error=error)
                update = self.policy.settle_deferred(step, verdict)
                if update is not None:
                    self._deliver(update)

    def _begin_bitmask(self, plan: StepPlan) -> StepBitmask | None:
        """Start filling the masks of this step's constrained sampling rows (grammar thread)."""
        if self.bitmask_filler is None:
            return None
        constrained = [
            (i, request.structured, plan.drafts.get(request.request_id, []))
            for i, ((request, _), scheduled) in enumerate(zip(plan.scheduled, plan.step_input.requests))
            if scheduled.sample and request.structured is not None
        ]
        step_bitmask = self.bitmask_filler.begin_step(constrained, len(plan.scheduled))
        plan.step_input.bitmask = step_bitmask
        return step_bitmask

    def _deliver(self, update: RequestUpdate) -> None:
        request, verdict = update.request, update.verdict
        assert request.first_scheduled_time is not None  # it was in the step that produced the update
        request.reply.put(
            TokenDelta(
                request.request_id,
                verdict.new_token_ids,
                verdict.finish_reason,
                request.num_prompt_tokens,
                verdict.error,
                num_cached_tokens=request.num_cached_tokens or 0,
                logprobs=verdict.logprobs,
                queue_time=request.first_scheduled_time - request.arrival_time,
                prompt_logprobs=update.prompt_logprobs,
                closed_early=verdict.closed_early,
                unsatisfied_check=verdict.unsatisfied_check,
            )
        )
        if verdict.finish_reason is not None:
            request.reply.close()

    def _deliver_error(self, request: Request, error: str) -> None:
        request.reply.put(TokenDelta(request.request_id, [], FinishReason.ERROR, request.num_prompt_tokens, error))
        request.reply.close()

    def _abort_disconnected(self) -> None:
        """Free the blocks of requests whose client went away (mailbox closed by the consumer)."""
        gone = [r.request_id for r in self.policy.requests.values() if r.reply.consumer_closed]
        for request_id in gone:
            self.policy.abort(request_id)

    def _abort_all(self) -> None:
        for request_id in list(self.policy.requests):
            request = self.policy.abort(request_id)
            if request is not None:
                request.reply.put(TokenDelta(request_id, [], FinishReason.ABORT, request.num_prompt_tokens))
                request.reply.close()

    # ---- introspection (for /stats, /metrics, tests and benchmarks) ----------------------------

    def _publish_cache_events(self) -> None:
        """Hand the prefix cache's journal to ``cache_events``; and the whole cache, after a
        clear, when a new subscriber asked for it."""
        tree = self.policy.kv.tree
        if self.cache_events is None or tree is None:
            return
        parents = self.policy.kv.chain_parents
        events = tree.take_events()
        if events:
            self.cache_events.publish(rechain(events, parents))
        if self.cache_events.snapshot_wanted():
            self.cache_events.cleared()
            tree.journal_cached()
            self.cache_events.publish(rechain(tree.take_events(), parents))

    def _publish_stats(self) -> None:
        """Publish the counters as a new immutable snapshot (a few microseconds), after the prefix
        cache's changes since the last call (:meth:`_publish_cache_events`): both are due at the
        same moments."""
        self._publish_cache_events()
        kv = self.policy.kv
        filler = self.bitmask_filler
        spec = self.policy.spec_stats
        counters = self.policy.structured_counters
        # A draft model's pool (speculative.draft), read between steps: a count, not a structure.
        drafter = getattr(self.executor, "drafter", None)
        self.stats.publish(
            SchedulerStats(
                num_requests_running=self.policy.num_running,
                num_requests_waiting=self.policy.num_waiting,
                num_free_blocks=kv.num_free_blocks,
                num_total_blocks=kv.num_total_blocks,
                num_cached_blocks=kv.num_cached_blocks,
                num_blocks_in_use=kv.num_total_blocks - kv.num_reclaimable_blocks,
                kv_cache_usage_perc=round(1 - kv.num_reclaimable_blocks / kv.num_total_blocks, 4),
                num_preemptions=self.policy.num_preemptions,
                num_steps=self.num_steps,
                num_step_tokens=self.num_step_tokens,
                step_seconds=round(self.step_seconds, 3),
                num_forced_tokens=counters.forced_tokens,
                num_closed_outputs=counters.closed_outputs,
                num_witness_closings=counters.witness_closings,
                num_witness_values=counters.witness_values,
                num_rejected_tokens=counters.rejected_tokens,
                grammar_steps=filler.num_steps if filler is not None else 0,
                grammar_masks=filler.num_rows if filler is not None else 0,
                grammar_fill_seconds=round(filler.fill_seconds, 4) if filler is not None else 0.0,
                grammar_wait_seconds=round(filler.wait_seconds, 4) if filler is not None else 0.0,
                spec_num_drafts=spec.num_drafts,
                spec_num_draft_tokens=spec.num_draft_tokens,
                spec_num_accepted_tokens=spec.num_accepted_tokens,
                spec_accepted_per_pos=list(spec.accepted_per_pos),
                spec_acceptance_rate=round(spec.acceptance_rate, 4),
                spec_disable_by_batch_size=self.policy.spec_threshold,
                spec_draft_num_free_blocks=drafter.num_free_blocks if drafter is not None else 0,
                spec_draft_num_total_blocks=drafter.num_total_blocks if drafter is not None else 0,
                kv_events_published=self.cache_events.num_sent if self.cache_events is not None else 0,
                kv_events_dropped=self.cache_events.num_dropped if self.cache_events is not None else 0,
            )
        )


def _decide(deferred: list[Deferred]) -> list[Verdict | Exception]:
    """On the search thread: one step's deferred verdicts, their searches sharing the step's
    time (``CLOSE_SEARCH_SECONDS``) from now."""
    deadline = time.perf_counter() + CLOSE_SEARCH_SECONDS
    verdicts: list[Verdict | Exception] = []
    for step in deferred:
        try:
            verdicts.append(step.decide(deadline))
        except Exception as exc:
            verdicts.append(exc)
    return verdicts


def _call_soon(token: trio.lowlevel.TrioToken, fn: Callable[[], None]) -> None:
    """Run ``fn`` on the event loop of ``token``; nothing if that loop has ended."""
    try:
        token.run_sync_soon(fn)
    except trio.RunFinishedError:
        pass
