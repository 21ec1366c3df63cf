"""The scheduling policy: pure, synchronous, unit-testable (no Trio, no torch).

There are no prefill and decode phases. Every step hands out a token budget: running
requests first (oldest first), then waiting ones, in the order of the fair queue
(``fair_queue.py``: fair between tenants, by priority then arrival inside one). A request gets
``min(num_tokens - num_computed_tokens, budget left)`` tokens, so long prompts are chunked
across steps and decodes of other requests are never starved behind them. When the block
pool runs dry, a running request is preempted by recompute, picked by the same fairness rule:
from the tenant holding the most blocks, its lowest-priority, newest request. Its blocks are
freed and it goes back to the front of its tenant's queue with ``num_computed_tokens = 0`` (its
computed blocks stay in the prefix cache, so readmission recomputes only what was evicted); a
step that preempted admits nothing new (vLLM's rule: the freed blocks go to the running
requests that needed them). Running slots are shared the same way: when all ``max_running``
are taken and a waiting tenant runs fewer than its share (``max_running`` / tenants running or
waiting), the tenant running the most gives up one request for it (queue order alone would
make it wait for a slot to free, a whole generation when a flood's requests end together).
At admission a request first reuses the longest cached prefix of its tokens (not one owed
prompt logprobs: it computes its whole prompt). The waiting queue's bound is held at the front
door (``EngineClient``).

Prompt logprobs: each prompt chunk of a request that asked for them names the prompt tokens its
rows predict (``ScheduledRequest.prompt_logprob_token_ids``); the executor's results are
collected on the request (``pending_prompt_logprobs``) and delivered all at once with its first
token. A preemption before then drops what was collected (the recompute computes it again).

Speculation (``SpeculativeConfig``): while fewer than ``disable_by_batch_size`` requests run, a
decoding request asks the proposer for up to k drafts (with a grammar: cut to the longest run
the grammar allows) and is scheduled for 1 + n tokens (its budget and blocks count them all).
After the step it keeps the a drafts the model accepted plus the model's next token; the
rejected drafts' positions are rolled back (``num_computed_tokens`` stops at the accepted run,
blocks past the new length are freed), so only verified tokens ever reach the prefix cache. Stop
tokens, ``max_tokens`` and the grammar are checked token by token: a stop inside the accepted
run ends the request there (the executor processes each draft position as if the drafts before
it were output: its grammar mask, penalties and logprobs; see ``engine.verify``).
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter

from trillium.config import SpeculativeConfig
from trillium.protocol import FinishReason, ScheduledRequest, StepInput, StepOutput
from trillium.scheduler.fair_queue import FairQueue
from trillium.scheduler.kv_manager import KVBlockManager
from trillium.scheduler.request import Request, RequestStatus
from trillium.speculative import DraftDepth, NgramProposer, SpecStats
from trillium.speculative.draft_slots import DraftSlots
from trillium.structured.closer import NUM_VARIANTS, SearchBudget
from trillium.structured.guard import MAX_VALUE_RETRIES, RESTART_AFTER
from trillium.structured.matcher import MAX_WITNESSES
from trillium.structured.value_checks import CheckFailure

# What the value checks of one request may take back in all (``SchedulerPolicy._reject``), in
# tokens per token of its max_tokens, and at least: each taken-back token was a step's work.
# MAX_VALUE_RETRIES bounds the retries of one value, each in full once it starts over, but not
# how many values fail: without this an output of many failing values had no bound in steps.
# (A model that picks the lowest token id takes back ~530 tokens to satisfy
# ``tests/unit/test_structured.py``'s NEEDS_MORE in 60 tokens; sampled ones far fewer.)
TAKE_BACK_PER_TOKEN = 8
TAKE_BACK_MIN = 1024
# Closing a JSON output (``SchedulerPolicy._close_if_due``): recomputed every step once the
# allowance left is within CLOSE_MARGIN tokens of the last closing's length, else every
# CLOSE_RECHECK steps.
CLOSE_MARGIN = 64  # a value opening in one step can add tens of tokens (an item's required keys)
CLOSE_RECHECK = 8
CLOSE_BACKTRACK = 8  # held tokens a closing that fails value checks may be moved back over
# What one search for a closing that passes the value checks may spend (closer.SearchBudget):
# measured on JSONSchemaBench Handwritten at temperature 1, searches that found one ran at most
# ~500 checks in 0.07 s but one (1,100 checks, 7 s); fruitless ones ran up to 20 s.
CLOSE_CHECK_BUDGET = 1000  # per search
CLOSE_SEARCH_SECONDS = 0.25  # per step, all searches together
MAX_WITNESS_VALUES = 4  # values of one request written as witnesses (``_write_witness``)
# What one witness search may validate (structured.witness; small values, ~20-100 µs a check):
# on JSONSchemaBench Handwritten the searches that found one took 65 checks at p50, 869 at p90.
WITNESS_CHECK_BUDGET = 3000
MAX_DEFERRED_CLOSINGS = 16  # steps a request's closing may wait for search time (``_close_if_due``)


@dataclasses.dataclass(frozen=True)
class SchedulerConfig:
    block_size: int = 16
    max_running: int = 64  # requests holding blocks at once
    max_tokens_per_step: int = 2048  # token budget of one forward pass
    max_model_len: int = 8192  # prompt + output limit of one request
    eos_token_ids: frozenset[int] = frozenset()
    model_key: str = ""  # prefix-cache namespace root: the served model's identity
    jump_forward: bool = True  # structured output: append the tokens a grammar forces without sampling
    speculative: SpeculativeConfig | None = None  # draft tokens for decoding requests (None: off)
    # (batch size, chance of acceptance a draft needs to pay for its row), measured at start-up
    # (engine.step_costs); empty: every draft is taken to pay.
    spec_break_even: tuple[tuple[int, float], ...] = ()


@dataclasses.dataclass
class StepPlan:
    """The requests of one step, each with its number of new tokens, and the executor's input."""

    scheduled: list[tuple[Request, int]]
    step_input: StepInput
    drafts: dict[str, list[int]] = dataclasses.field(default_factory=dict)  # request id -> its draft tokens


@dataclasses.dataclass
class RequestUpdate:
    """What one request produced in a step, for delivery to its client."""

    request: Request
    new_token_ids: list[int]
    finish_reason: FinishReason | None
    logprobs: list[tuple[float, list[tuple[int, float]]]] | None = None  # one (chosen logprob, top
    #                                                                      alternatives) per new token
    error: str | None = None  # with FinishReason.ERROR: what went wrong
    # With the first token of a request that asked for prompt logprobs: one entry per prompt
    # position 1 .. P-1 (see protocol.TokenDelta).
    prompt_logprobs: list[tuple[float, list[tuple[int, float]]]] | None = None
    closed_early: bool = False  # the grammar's closing was appended before max_tokens (LENGTH)
    # With closed_early: the check no closing found in the room left could satisfy (the output
    # parses but fails it); None when the closed output passes every check.
    unsatisfied_check: str | None = None


class SchedulerPolicy:
    """Owns request states and their blocks. Every method runs on one thread at a time: the
    scheduler actor's task, on the event loop or, for an update that may search
    (:meth:`may_search`), on a worker thread it waits for."""

    def __init__(self, config: SchedulerConfig, kv: KVBlockManager) -> None:
        self.config = config
        self.kv = kv
        self.spec = spec = config.speculative
        self.proposer: NgramProposer | DraftSlots | None = None
        if spec is not None and spec.method == "draft":
            self.proposer = DraftSlots(spec.num_speculative_tokens)  # placeholders; a draft model fills them
        elif spec is not None:
            self.proposer = NgramProposer(spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max)
        self.spec_stats = SpecStats(spec.num_speculative_tokens if spec else 0)
        self.draft_depth = DraftDepth(spec.num_speculative_tokens if spec else 0)
        self.waiting = FairQueue()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._finished_since_last_step: list[str] = []
        self.num_preemptions = 0
        self.num_forced_tokens = 0  # appended by jump-forward (structured output), never sampled
        self.num_closed_outputs = 0  # JSON outputs closed before max_tokens (``_close_if_due``)
        self.num_witness_closings = 0  # of those, closings that wrote an open value as a witness
        self.num_witness_values = 0  # values written as witnesses after failing their checks too often
        self.num_rejected_tokens = 0  # output tokens taken back by failed value checks (``_reject``)
        self._search_deadline = 0.0  # when this step's checked closing searches must stop (update)

    # ---- admission and abort -------------------------------------------------------------

    def add(self, request: Request) -> None:
        """Queue a request. Raises ``ValueError`` if it could never fit in the block pool."""
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        longest = min(request.num_prompt_tokens + request.max_tokens, self.config.max_model_len)
        if self.kv.blocks_for(longest) > self.kv.num_total_blocks:
            raise ValueError(
                f"request needs {longest} tokens of KV cache but the pool holds only "
                f"{self.kv.num_total_blocks * self.config.block_size}"
            )
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def abort(self, request_id: str) -> Request | None:
        """Finish a request now and free its blocks; ``None`` if it is unknown or finished."""
        request = self.requests.get(request_id)
        if request is None:
            return None
        if request.status == RequestStatus.WAITING:
            self.waiting.remove(request)
        else:
            self.running.remove(request)
        self._finish(request, FinishReason.ABORT)
        return request

    @property
    def spec_threshold(self) -> int:
        """Requests running from which none speculates (0: speculation off). An unset
        ``disable_by_batch_size`` (the engine measures one at start-up) counts as 4."""
        if self.spec is None:
            return 0
        return self.spec.disable_by_batch_size or 4

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    # ---- one step ----------------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        """Plan the next step: allocates the blocks the scheduled tokens need."""
        budget = self.config.max_tokens_per_step
        scheduled: list[tuple[Request, int]] = []
        drafts: dict[str, list[int]] = {}
        draft_limit = self._draft_limit()

        i = 0
        preempted = False
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            proposed = self._propose(request, num_new, min(budget - 1, draft_limit)) if draft_limit else []
            if proposed and self.kv.grow(request, num_new + len(proposed)):
                drafts[request.request_id] = proposed
                num_new += len(proposed)
            elif not self.kv.grow(request, num_new):
                # Out of blocks: preempt a request not scheduled yet in this step (this one or a
                # later one) and retry; if this one was the victim, go on with the next.
                self._preempt(self._victim(i))
                preempted = True
                continue
            scheduled.append((request, num_new))
            budget -= num_new
            i += 1

        while self.waiting and not preempted and budget > 0:
            request = self.waiting.peek()
            if len(self.running) >= self.config.max_running:
                swap = self._slot_swap()
                if swap is None:
                    break
                # The victim's tenant runs more than its share, the request's less: the slot changes hands.
                request, victim = swap
                budget += self._unschedule(victim, scheduled)
                self._preempt(victim)
            self.kv.match_prefix(request)
            if request.num_cached_tokens is None:
                request.num_cached_tokens = 0  # first admission found nothing cached
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            if not self.kv.grow(request, num_new):
                self.kv.release(request, cache=False)  # give the matched prefix back; retry next step
                break
            self.waiting.take(request)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            scheduled.append((request, num_new))
            budget -= num_new

        step_input = StepInput(
            requests=[self._scheduled_request(r, n, drafts.get(r.request_id, [])) for r, n in scheduled],
            finished_request_ids=self._finished_since_last_step if scheduled else [],
        )
        if scheduled:  # an empty plan is not run: its finished ids go with the next step
            self._finished_since_last_step = []
        return StepPlan(
            scheduled, step_input, {r.request_id: drafts[r.request_id] for r, _ in scheduled if r.request_id in drafts}
        )

    def may_search(self, plan: StepPlan) -> bool:
        """Whether :meth:`update` of this plan may run closing searches (up to
        ``CLOSE_SEARCH_SECONDS``): a request in it has value checks."""
        return any(request.matcher is not None and request.matcher.guard is not None for request, _ in plan.scheduled)

    def update(self, plan: StepPlan, output: StepOutput) -> list[RequestUpdate]:
        """Apply a step's result: advance progress, append sampled tokens, finish requests."""
        updates: list[RequestUpdate] = []
        self._search_deadline = time.perf_counter() + CLOSE_SEARCH_SECONDS  # checked closings' time, this step
        logprobs = output.logprobs or [None] * len(output.sampled_token_ids)
        accepted = output.num_accepted_drafts or [0] * len(output.sampled_token_ids)
        prompt_logprobs = output.prompt_logprobs or [None] * len(output.sampled_token_ids)
        for i, ((request, num_new), token_id, lp, num_accepted, prompt_lp) in enumerate(
            zip(plan.scheduled, output.sampled_token_ids, logprobs, accepted, prompt_logprobs)
        ):
            if request.status != RequestStatus.RUNNING:
                continue  # preempted or aborted while the step ran
            guard = request.matcher.guard if request.matcher is not None else None
            rejected_before = guard.num_rejected if guard is not None else 0
            pending = request.pending_prompt_logprobs
            if pending is not None and prompt_lp is not None:
                pending.extend(prompt_lp)
            drafts = plan.drafts.get(request.request_id)
            if not drafts:
                request.num_computed_tokens += num_new
                self.kv.commit(request)
                if token_id < 0:
                    continue
                new_token_ids, reason, error = self._append(request, [token_id])
            else:
                num_slots = len(drafts)
                filled = output.draft_token_ids[i] if output.draft_token_ids else None
                if filled is not None:
                    drafts = filled  # a draft model's, in the placeholder slots (maybe fewer, maybe none)
                if drafts:
                    self.spec_stats.record(len(drafts), num_accepted)
                    self.draft_depth.record(len(drafts), num_accepted)
                    if self.proposer is not None:
                        self.proposer.feedback(request.request_id, len(drafts), num_accepted)
                new_token_ids, reason, error = self._append(request, [*drafts[:num_accepted], token_id])
                self._roll_back(request, num_new - (num_slots - num_accepted))
            if guard is not None and guard.num_rejected > rejected_before:
                self.kv.truncate(request)  # K/V of tokens a failed check took back is not kept
            if lp is not None:
                lp = lp[: len(new_token_ids)]  # none for tokens after a stop (nor for forced ones)
            if pending is not None:  # the prefill is complete: its first token came
                assert len(pending) == request.num_prompt_tokens - 1, (len(pending), request)
                request.pending_prompt_logprobs = None
            closed, unsatisfied = False, None
            if reason is None and request.matcher is not None:
                reason, error = self._jump_forward(request, new_token_ids)
            if (
                request.matcher is not None
                and request.matcher.closer is not None
                and reason in (None, FinishReason.LENGTH)
            ):
                try:
                    close_result = self._close_if_due(request, new_token_ids)
                except Exception as exc:  # a closing or check that cannot run fails this request only
                    close_result, reason, error = None, FinishReason.ERROR, f"closing the output failed: {exc!r}"
                if close_result is not None:
                    kept, unsatisfied = close_result
                    reason, closed = FinishReason.LENGTH, True
                    if lp is not None:
                        lp = lp[:kept]  # the closing's tokens were not sampled: none
                elif lp is not None:
                    lp = lp[: len(new_token_ids)]  # (a deferred closing took this step's token back)
            if guard is not None and reason == FinishReason.ERROR:
                new_token_ids, lp = [], None  # what was held back never passed its checks
            elif guard is not None:  # deliver only what no check can take back any more
                new_token_ids, lp = guard.release(
                    request.output_token_ids, lp, len(new_token_ids), finished=reason is not None
                )
            if reason is not None:
                self.running.remove(request)
                self._finish(request, reason)
            updates.append(RequestUpdate(request, new_token_ids, reason, lp, error, pending, closed, unsatisfied))
        return updates

    def take_finished(self) -> list[str]:
        """The ids of requests finished since the last step that ran, for an executor that keeps
        per-request state (a draft model's KV) to free while no step runs; cleared."""
        finished, self._finished_since_last_step = self._finished_since_last_step, []
        return finished

    # ---- internals ---------------------------------------------------------------------------

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.kv.release(request)  # its computed blocks stay cached: readmission recomputes little
        if request.pending_prompt_logprobs is not None:
            request.pending_prompt_logprobs.clear()  # its prompt is computed again from position 0
        request.status = RequestStatus.WAITING
        self.num_preemptions += 1
        self.waiting.readd(request)

    def _victim(self, first: int) -> Request:
        """The request to preempt among ``running[first:]``: from the tenant holding the most
        blocks (the most over its fair share), the lowest priority, then the newest."""
        blocks: Counter[str] = Counter()
        for r in self.running:
            blocks[r.tenant] += len(r.block_ids)
        return max(self.running[first:], key=lambda r: (blocks[r.tenant], r.priority, r.arrival_time))

    def _slot_swap(self) -> tuple[Request, Request] | None:
        """Every running slot is taken: ``(request, victim)`` if a waiting tenant runs fewer than
        its fair share of them (``max_running`` / tenants running or waiting) even with one more,
        and another runs more. ``request`` is the first (fair-queue order) of the tenants under
        their share; ``victim``, by the preemption rule, is from the tenant running the most, its
        lowest priority, newest. None if there is no such pair. (A swap leaves the victim's tenant
        at or above its share, so it cannot swing back.)"""
        running: Counter[str] = Counter(r.tenant for r in self.running)
        waiting = self.waiting.tenants
        share = self.config.max_running / len(set(running).union(waiting))
        under = [t for t in waiting if running[t] + 1 <= share]
        over = [r for r in self.running if running[r.tenant] > share]
        if not under or not over:
            return None
        victim = max(over, key=lambda r: (running[r.tenant], r.priority, r.arrival_time))
        return self.waiting.peek(under), victim

    @staticmethod
    def _unschedule(request: Request, scheduled: list[tuple[Request, int]]) -> int:
        """Drop ``request`` from this step's plan; returns the tokens it had (0 if it had none)."""
        for k, (r, num_new) in enumerate(scheduled):
            if r is request:
                del scheduled[k]
                return num_new
        return 0

    def _finish(self, request: Request, reason: FinishReason) -> None:
        # A request that ended in ERROR (its grammar rejected a token) is not cached. A failed step
        # never reaches here: the scheduler actor rebuilds the whole pool instead (scheduler/actor.py).
        self.kv.release(request, cache=reason != FinishReason.ERROR)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        del self.requests[request.request_id]
        self._finished_since_last_step.append(request.request_id)
        if self.proposer is not None:
            self.proposer.forget(request.request_id)

    def _append(self, request: Request, token_ids: list[int]) -> tuple[list[int], FinishReason | None, str | None]:
        """Append the step's kept tokens (one sampled, or the accepted drafts and the model's
        token) one at a time, each checked for a stop and fed to the request's grammar, up to
        the first that ends the request. Returns (the tokens appended, finish reason, error).

        A complete grammar ends the request with STOP, even before ``min_tokens`` or under
        ``ignore_eos``: nothing could follow. A token the grammar rejects ends it in ERROR."""
        appended: list[int] = []
        reason: FinishReason | None = None
        for t in token_ids:
            request.output_token_ids.append(t)
            appended.append(t)
            reason = self._check_stop(request, t)
            matcher = request.matcher
            if matcher is not None:
                if not matcher.accept(t):
                    return appended, FinishReason.ERROR, matcher.rejection(t)
                if matcher.dead_end:  # t led where nothing can follow: take it back (checked output) or fail
                    before = len(request.output_token_ids)
                    reason, error = self._dead_end(request)
                    del appended[max(0, len(appended) - (before - len(request.output_token_ids))) :]
                    return appended, reason, error
                guard = matcher.guard
                if guard is not None:
                    # EOS or a stop token is no JSON: it ends the output (a pending number completes).
                    ends = t in self.config.eos_token_ids or t in request.sampling.stop_token_ids
                    try:
                        failure = guard.feed(t, end=ends)
                        if failure is None and matcher.is_terminated and not ends:
                            failure = guard.checker.finish()
                    except Exception as exc:  # a check that cannot run fails this request only
                        return appended, FinishReason.ERROR, f"the schema checks failed: {exc!r}"
                    if failure is not None:
                        before = len(request.output_token_ids)
                        reason, error = self._reject(request, failure)
                        del appended[max(0, len(appended) - (before - len(request.output_token_ids))) :]
                        return appended, reason, error
                if matcher.is_terminated:
                    return appended, FinishReason.STOP, None
            if reason is not None:
                break
        return appended, reason, None

    def _reject(self, request: Request, failure: CheckFailure) -> tuple[FinishReason | None, str | None]:
        """A value check failed on the request's last output token: take the token back and ban
        it there; while every token the grammar allows at the position is banned, take back and
        ban the one before too (never past what the client already has). ``structured.guard``.
        Returns (ERROR, why) once one value failed its checks ``MAX_VALUE_RETRIES`` times, or the
        request's checks took back ``TAKE_BACK_PER_TOKEN`` tokens per token of its max_tokens."""
        matcher = request.matcher
        assert matcher is not None and matcher.guard is not None
        guard = matcher.guard
        guard.retries[failure.value_start] += 1
        output = request.output_token_ids
        spent = self._take_back_spent(request)
        if guard.retries[failure.value_start] > MAX_VALUE_RETRIES or spent:
            if self._write_witness(request, failure.value_start):
                return None, None  # the value, written again as a witness; the request goes on
            output.pop()  # (the request ends; nothing held back is delivered: see update)
            matcher.rollback(1)
            why = f" ({guard.num_rejected} tokens taken back in all)" if spent else ""
            return FinishReason.ERROR, f"no output satisfying the schema was found: {failure.message}{why}"
        # Usually only how the value ended is taken back; a value that keeps failing starts over.
        restart = guard.retries[failure.value_start] > RESTART_AFTER
        first = max(guard.token_at(failure.value_start), guard.num_released) if restart else len(output) - 1
        also = [] if restart else guard.completing_alike(output)
        return self._take_back(request, first, also)

    def _write_witness(self, request: Request, start: int) -> bool:
        """The value at byte ``start`` of the output failed its checks too often: take the output
        back to where it starts and write it again as a witness of its subschemas
        (``structured.witness``; forced tokens, like jump-forward's), for the model to go on
        after. Only over tokens still held back, at most ``MAX_WITNESS_VALUES`` times per
        request, and only where the output could still be closed after it. True if written;
        otherwise the output is as it was."""
        matcher, output = request.matcher, request.output_token_ids
        assert matcher is not None and matcher.guard is not None
        guard = matcher.guard
        cut = guard.token_at(start)
        if cut < guard.num_released or guard.num_witness_values >= MAX_WITNESS_VALUES or matcher.closer is None:
            return False
        taken = output[cut:]
        head = guard.head(output, cut, start)
        if head is None or not matcher.rollback(len(taken)):
            return False
        del output[cut:]
        guard.replay(output)
        probe = guard.checker.copy()
        node = probe.next_value_node if probe.feed(head) is None else None
        tokens = None
        if node is not None:
            budget = SearchBudget(WITNESS_CHECK_BUDGET, max(0.0, self._search_deadline - time.perf_counter()))
            room = self._room(request)
            tokens = matcher.witness_closing(
                node, head, room, budget, lambda t: guard.failure(output + t) is None, close=False
            )
        if tokens is None or not matcher.accept_forced(tokens):
            self._put_back(request, taken[::-1])
            guard.replay(output)
            return False
        guard.num_rejected += len(taken)
        self.num_rejected_tokens += len(taken)
        guard.forget_from(cut)
        self.kv.truncate(request)  # the K/V from the cut on was of the tokens taken back
        output.extend(tokens)
        guard.replay(output)
        guard.num_witness_values += 1
        self.num_witness_values += 1
        if self.proposer is not None:
            self.proposer.forget(request.request_id)
        return True

    @staticmethod
    def _take_back_spent(request: Request) -> bool:
        """The request's checks took back all they may (``TAKE_BACK_PER_TOKEN``)."""
        assert request.matcher is not None and request.matcher.guard is not None
        limit = max(TAKE_BACK_MIN, TAKE_BACK_PER_TOKEN * request.max_tokens)
        return bool(request.matcher.guard.num_rejected >= limit)

    def _dead_end(self, request: Request) -> tuple[FinishReason | None, str | None]:
        """The request's last token left its grammar at a dead end (``GrammarMatcher.dead_end``).
        With value checks (a relaxed schema, whose grammar accepts more than the schema and may
        so wander into a branch it cannot finish) the token is taken back and banned like one
        that failed a check, within the same retry bound; otherwise the request fails, saying so
        -- never a finished output that is not complete."""
        matcher, output = request.matcher, request.output_token_ids
        assert matcher is not None
        guard, error = matcher.guard, matcher.error.strip().splitlines()[:1]
        token = output.pop()
        if token in self.config.eos_token_ids and output:
            # llguidance finds the dead end when it next computes a mask, which then allows only
            # EOS: the token before led there.
            token = output.pop()
        why = f"the grammar admits no continuation after token {token}" + (f" ({error[0]})" if error else "")
        if guard is None or len(output) < guard.num_released or not matcher.start_over(output):
            return FinishReason.ERROR, why  # (a token the client has cannot be taken back)
        at = guard.ends[len(output) - 1] if output else 0  # where the culprit's bytes began
        guard.retries[at] += 1
        if guard.retries[at] > MAX_VALUE_RETRIES or self._take_back_spent(request):
            return FinishReason.ERROR, f"no output satisfying the schema was found: {why}"
        return self._take_back(request, len(output), [], taken=token)

    def _take_back(
        self, request: Request, first: int, also: list[int], taken: int | None = None
    ) -> tuple[FinishReason | None, str | None]:
        """Take the output back to ``first`` tokens (``taken``: its last token, already taken
        back), then ban the last token taken back there (and ``also``); while that leaves the
        grammar nothing at the position, take back and ban the token before too."""
        matcher, output = request.matcher, request.output_token_ids
        assert matcher is not None and matcher.guard is not None
        guard = matcher.guard
        while True:
            if taken is not None:
                token, taken = taken, None
            elif not matcher.rollback(1):
                return FinishReason.ERROR, f"the grammar could not take a token back: {matcher.error}"
            else:
                token = output.pop()
            guard.num_rejected += 1
            self.num_rejected_tokens += 1
            if len(output) > first:
                continue  # inside the value that starts over
            guard.ban(len(output), token, also)
            if not guard.dead_end(len(output), matcher.bitmask()):
                break
            if len(output) <= guard.num_released:
                # Nothing else is allowed here and what came before was delivered: retry without
                # this ban (a sampled retry may differ further on; the retry bound still holds).
                guard.unban(len(output), [token, *also])
                break
            also = []
        guard.replay(output)
        if self.proposer is not None:
            self.proposer.forget(request.request_id)  # its index saw the tokens taken back
        return None, None

    def _jump_forward(self, request: Request, new_token_ids: list[int]) -> tuple[FinishReason | None, str | None]:
        """Append the tokens the request's grammar forces from here (jump-forward) to its output
        and to ``new_token_ids``. Returns the finish reason and an error message. Requests that
        asked for logprobs skip it (a forced token has no sampled distribution to report)."""
        matcher = request.matcher
        assert matcher is not None
        if not self.config.jump_forward or request.sampling.logprobs is not None or matcher.guard is not None:
            return None, None  # (a forced token would bypass the value checks)
        forced = matcher.forced_tokens()[: self._room(request)]
        if not forced:
            return None, None
        if not matcher.accept_forced(forced):
            return FinishReason.ERROR, f"the grammar rejected its own forced tokens: {matcher.error}"
        if matcher.dead_end:
            return FinishReason.ERROR, f"the grammar admits no continuation after its forced tokens ({matcher.error})"
        request.output_token_ids.extend(forced)
        new_token_ids.extend(forced)
        self.num_forced_tokens += len(forced)
        if matcher.is_terminated:
            return FinishReason.STOP, None
        return (FinishReason.LENGTH if self._length_reached(request) else None), None

    def _close_if_due(self, request: Request, new_token_ids: list[int]) -> tuple[int, str | None] | None:
        """Close a JSON output whose allowance is running out (``structured.closer``): when what
        is left of ``max_tokens`` (or the context) is no more than the tokens closing needs,
        append the closing and return how many of this step's ``new_token_ids`` were kept
        before it, and the message of the value check the closed output still fails (None: it
        passes every check; said in the response as ``unsatisfied_check``, never returned
        silently as if valid); None while there is room. This step's tokens (not yet delivered)
        are taken back one at a time while the closing from after them would not fit: the state
        before the step had room for its own. The closing is computed only near the end of the
        allowance, and every ``CLOSE_RECHECK`` steps elsewhere (it can grow when a value opens)."""
        matcher = request.matcher
        assert matcher is not None
        room = self._room(request)
        last_chance = room <= 0  # no closing now: the output ends where it falls
        if matcher.closing_length >= 0 and matcher.closing_length + CLOSE_MARGIN < room:
            matcher.closing_age += 1
            if matcher.closing_age < CLOSE_RECHECK:
                return None
        matcher.closing_age = 0
        closing = matcher.closing(room=room)
        if closing is None and room > CLOSE_MARGIN:
            matcher.closing_length = 0  # none found from here; far from the end: try again later
            return None
        kept = len(new_token_ids)
        while (closing is None or len(closing) > room) and kept > 0 and matcher.rollback(1):
            kept -= 1
            room += 1
            del request.output_token_ids[-1]
            closing = matcher.closing(room=room)
        further_back = False
        if (closing is None or len(closing) > room) and last_chance and kept == 0:
            # The last chance, and none fits from here or after any of this step's tokens:
            # from further back, over tokens still held back.
            closing = self._closing_further_back(request)
            room, further_back = self._room(request), closing is not None
        if closing is None or len(closing) > room:
            # None found, or the steps since the last check outgrew the room (their tokens were
            # delivered): put back what was taken; the output is cut where it falls.
            matcher.closing_length = 0  # try again on the next step
            if kept < len(new_token_ids):
                matcher.accept_forced(new_token_ids[kept:])
                request.output_token_ids.extend(new_token_ids[kept:])
            return None
        matcher.closing_length = len(closing)
        if not further_back and kept == len(new_token_ids) and (len(closing) < room or not closing):
            return None  # room to go on, or complete already
        guard = matcher.guard
        failure = guard.failure(request.output_token_ids + closing) if guard is not None else None
        if failure is not None and (found := self._checked_closing(request, room, kept)) is not None:
            (closing, kept), failure = found, None
        elif failure is not None and guard is not None and kept > 0 and self._search_starved(request):
            # This step's searches ran out of time before this one had its share (every request
            # of a batch comes to its end at once): take this step's last token back, so the
            # closing is due again next step, with the next step's time.
            matcher.rollback(1)
            request.output_token_ids.pop()
            del new_token_ids[kept - 1 :]
            guard.replay(request.output_token_ids)
            guard.num_deferred_closings += 1
            self.kv.truncate(request)
            return None
        del new_token_ids[kept:]
        self.kv.truncate(request)  # drafts taken back had K/V: not for the closing's tokens
        request.output_token_ids.extend(closing)
        new_token_ids.extend(closing)
        self.num_closed_outputs += 1
        return kept, None if failure is None else failure.message

    def _search_starved(self, request: Request) -> bool:
        """The step's time for closing searches is gone, and the request may wait for the next
        step's (at most ``MAX_DEFERRED_CLOSINGS`` times)."""
        assert request.matcher is not None and request.matcher.guard is not None
        spent = time.perf_counter() >= self._search_deadline
        return spent and request.matcher.guard.num_deferred_closings < MAX_DEFERRED_CLOSINGS

    def _closing_further_back(self, request: Request) -> list[int] | None:
        """A closing from earlier in the output, for an output about to end with none that fits:
        the grammar let it into a value no character can finish (llguidance admits a key, under
        a ``patternProperties`` whose value is ``false``, that already matches the pattern), or
        the closing outgrew the room. Tokens still held back (never delivered) are taken back 1,
        2, 4, ... at a time until a closing fits the room they free. Returns that closing, the
        output, matcher and guard cut back to where it applies; None (the output as it stood)
        when there are no held tokens or none is found over them."""
        matcher, output = request.matcher, request.output_token_ids
        assert matcher is not None
        guard = matcher.guard
        if guard is None:  # every token was delivered as it came
            return None
        popped: list[int] = []
        step = 1
        while len(output) > guard.num_released:
            n = min(step, len(output) - guard.num_released)
            if not matcher.rollback(n):
                break
            popped.extend(reversed(output[-n:]))
            del output[-n:]
            room = self._room(request)
            closing: list[int] | None = matcher.closing(room=room)
            if closing is not None and len(closing) <= room:
                guard.replay(output)
                return closing
            step *= 2
        self._put_back(request, popped)
        return None

    def _checked_closing(self, request: Request, room: int, kept: int) -> tuple[list[int], int] | None:
        """The usual closing completes or invents a value a check rejects (a duplicate item):
        try the closer's other variants, from the output as it is, then from up to
        ``CLOSE_BACKTRACK`` tokens earlier, then from the start of each value still open, innermost
        first: the value written again as a witness of its subschemas (``structured.witness``:
        where the text so far rules out every ending, as a number under ``not: {multipleOf}``
        inside an ``anyOf`` can), else by the checked closer -- always over tokens still held
        back, never delivered ones. Returns the closing to append and this step's tokens kept;
        None if none passes (the output as it stood)."""
        matcher, output = request.matcher, request.output_token_ids
        assert matcher is not None and matcher.guard is not None
        guard = matcher.guard
        # The whole step waits for the search: bounded in checks and in time (closer.SearchBudget),
        # the time shared by every such search of one step. Half of each goes to closings from
        # where the output stands (or a few tokens back), the rest to values written again from
        # their start: the first half can spend everything on a hopeless output.
        left = max(0.0, self._search_deadline - time.perf_counter())
        budget = SearchBudget(CLOSE_CHECK_BUDGET // 2, left / 2)
        popped: list[int] = []
        for _ in range(CLOSE_BACKTRACK):
            guard.replay(output)
            # One closing built under the checks (slower: a checker copy per character tried),
            # then the plain variants, each verified.
            for variant in range(NUM_VARIANTS):
                if budget.spent:
                    break
                c = matcher.closing(variant, checked=variant == 0, room=room, budget=budget)
                if c is not None and len(c) <= room and guard.accepts(output + c):
                    return c, max(kept - len(popped), 0)
            if budget.spent or len(output) <= guard.num_released or not matcher.rollback(1):
                break
            popped.append(output.pop())
            room += 1
        # Then from the start of each value still open, innermost first: the one whose checks
        # the text so far rules out is written again -- first as a witness of its subschemas
        # (structured.witness; only values with checks have known subschemas), then, over every
        # open value, by the (checked) closer.
        budget = SearchBudget(CLOSE_CHECK_BUDGET // 2, max(0.0, self._search_deadline - time.perf_counter()))
        guard.replay(output)
        values = guard.checker.open_values
        mark = len(popped)
        for witnesses in (True, False):
            for depth in range(len(values) - 1, -1, -1):
                start, node = values[depth]
                if budget.spent:
                    break
                if witnesses and node is None:
                    continue
                cut = max(guard.token_at(start), guard.num_released)
                if cut >= len(output) or not matcher.rollback(len(output) - cut):
                    continue
                head = guard.head(output, cut, start)
                popped.extend(reversed(output[cut:]))
                room += len(output) - cut
                del output[cut:]
                guard.replay(output)
                if witnesses and node is not None and head is not None:  # its start was not delivered
                    # The outermost value gets more tries: written again, it ends the output.
                    tries = MAX_WITNESSES if depth == 0 else MAX_WITNESSES // 4
                    found = SearchBudget(WITNESS_CHECK_BUDGET, max(0.0, self._search_deadline - time.perf_counter()))
                    c = matcher.witness_closing(node, head, room, found, lambda c: guard.accepts(output + c), tries)
                    if c is not None:
                        self.num_witness_closings += 1
                        return c, max(kept - len(popped), 0)
                elif not witnesses:
                    c = matcher.closing(checked=True, room=room, budget=budget)
                    if c is not None and len(c) <= room and guard.accepts(output + c):
                        return c, max(kept - len(popped), 0)
            if witnesses:  # back to where the output stood before the witnesses were tried
                self._put_back(request, popped[mark:])
                room -= len(popped) - mark
                del popped[mark:]
                guard.replay(output)
                budget = SearchBudget(CLOSE_CHECK_BUDGET // 2, max(0.0, self._search_deadline - time.perf_counter()))
        # None passes: back to where the output stood, for the usual closing (it parses; the
        # checks it fails are what the model and the closer could not satisfy in the room left).
        self._put_back(request, popped)
        guard.replay(output)
        return None

    @staticmethod
    def _put_back(request: Request, popped: list[int]) -> None:
        """Give the output (and its matcher) back the tokens a closing search took back,
        ``popped`` last first as they were taken."""
        matcher = request.matcher
        assert matcher is not None
        tokens = popped[::-1]
        if tokens and not matcher.accept_forced(tokens):
            raise RuntimeError(f"the grammar refused tokens it had accepted: {matcher.error}")
        request.output_token_ids.extend(tokens)

    def _room(self, request: Request) -> int:
        """Output tokens the request may still produce (``max_tokens``, the context)."""
        return min(request.max_tokens - len(request.output_token_ids), self.config.max_model_len - request.num_tokens)

    def _check_stop(self, request: Request, token_id: int) -> FinishReason | None:
        sampling = request.sampling
        if len(request.output_token_ids) > sampling.min_tokens:
            if not sampling.ignore_eos and token_id in self.config.eos_token_ids:
                return FinishReason.STOP
            if token_id in sampling.stop_token_ids:
                return FinishReason.STOP
        if self._length_reached(request):
            return FinishReason.LENGTH
        return None

    def _length_reached(self, request: Request) -> bool:
        """``max_tokens`` output tokens, or the context is full."""
        return self._room(request) <= 0

    def _propose(self, request: Request, num_new: int, limit: int) -> list[int]:
        """Up to ``limit`` draft tokens for a decoding request, as many as ``max_tokens`` and the
        context leave room for; with a grammar, only the longest run the grammar allows."""
        if self.proposer is None or num_new != 1 or request.num_computed_tokens != request.num_tokens - 1:
            return []
        room = min(limit, self._room(request) - 1)  # the step's own token comes after the drafts
        if request.matcher is not None and isinstance(self.proposer, DraftSlots):
            return []  # its per-position masks are made before the step, a draft model drafts during it
        guard = request.matcher.guard if request.matcher is not None else None
        if guard is not None and guard.has_bans_from(len(request.output_token_ids)):
            return []  # retrying after a failed check: the drafts' masks would miss the bans
        drafts = self.proposer.propose(request, room)
        if drafts and request.matcher is not None:
            drafts = drafts[: request.matcher.validate(drafts)]
        return drafts

    def _draft_limit(self) -> int:
        """Drafts per request this step: none from ``spec_threshold`` running requests on, else
        as deep as recent acceptance pays for at this batch size (``speculative.depth``)."""
        running = len(self.running)
        if running >= self.spec_threshold:
            return 0
        # The break-even of the nearest timed batch size at or above this one (the costlier);
        # past the largest timed (start-up timing is bounded), the largest's.
        table = self.config.spec_break_even
        break_even = next((p for b, p in table if b >= running), table[-1][1] if table else 0.0)
        return self.draft_depth.limit(break_even)

    def _roll_back(self, request: Request, num_verified: int) -> None:
        """After a verify step that computed ``num_verified`` tokens worth keeping (the last
        token and the accepted drafts): K/V counts as computed only for those, never past the
        kept tokens; the blocks past the new length are freed."""
        request.num_computed_tokens = min(request.num_computed_tokens + num_verified, request.num_tokens - 1)
        self.kv.trim(request)
        self.kv.commit(request)

    def _scheduled_request(self, request: Request, num_new: int, drafts: list[int]) -> ScheduledRequest:
        start = request.num_computed_tokens
        end = start + num_new - len(drafts)
        sample = end == request.num_tokens
        # A draft model drafts from the whole context (speculative.draft).
        history = sample and (request.sampling.needs_history or bool(drafts and isinstance(self.proposer, DraftSlots)))
        # Rows start .. last-1 predict prompt tokens start+1 .. last (the last prompt token's row
        # predicts the output).
        last = min(end, request.num_prompt_tokens - 1)
        owed = request.pending_prompt_logprobs is not None and last > start
        return ScheduledRequest(
            request_id=request.request_id,
            token_ids=request.token_ids_slice(start, end) + drafts if drafts else request.token_ids_slice(start, end),
            num_draft_tokens=len(drafts),
            start_pos=start,
            block_ids=list(request.block_ids),
            sample=sample,
            sampling=request.sampling,
            prompt_token_ids=request.prompt_token_ids if history else None,
            output_token_ids=list(request.output_token_ids) if history else None,
            prompt_logprob_token_ids=request.prompt_token_ids[start + 1 : last + 1] if owed else None,
        )
