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
import functools
import time
from collections import Counter

from trillium.config import SpeculativeConfig
from trillium.protocol import FinishReason, ScheduledRequest, StepInput, StepOutput, Verdict
from trillium.scheduler.fair_queue import FairQueue
from trillium.scheduler.kv_manager import KVBlockManager
from trillium.scheduler.request import Request, RequestStatus
from trillium.scheduler.step import Deferred, RequestUpdate, StepPlan
from trillium.speculative import DraftDepth, NgramProposer, SpecStats
from trillium.speculative.draft_slots import DraftSlots
from trillium.structured.controller import CLOSE_SEARCH_SECONDS, StructuredCounters


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


class SchedulerPolicy:
    """Owns request states and their blocks. Every method runs on the scheduler actor's task
    (the event loop); only a :class:`Deferred` step's :meth:`Deferred.decide` runs elsewhere."""

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
        self.structured_counters = StructuredCounters()  # what the requests' controllers did (/stats)

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
            if request.pending:  # its last step's verdict is still being decided: it sits this one out
                i += 1
                continue
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

    def update(self, plan: StepPlan, output: StepOutput, deferred: list[Deferred] | None = None) -> list[RequestUpdate]:
        """Apply a step's result: advance progress, append the kept tokens (a constrained
        request's through its controller's verdict), finish requests. With a ``deferred`` list,
        a request whose controller may search (``OutputController.searches``) is not decided
        here: its step goes into the list and the request is pending until :meth:`settle`."""
        updates: list[RequestUpdate] = []
        deadline = time.perf_counter() + CLOSE_SEARCH_SECONDS  # the step's closing searches, all together
        logprobs = output.logprobs or [None] * len(output.sampled_token_ids)
        accepted = output.num_accepted_drafts or [0] * len(output.sampled_token_ids)
        prompt_logprobs = output.prompt_logprobs or [None] * len(output.sampled_token_ids)
        for i, ((request, num_new), token_id, lp, num_accepted, prompt_lp) in enumerate(
            zip(plan.scheduled, output.sampled_token_ids, logprobs, accepted, prompt_logprobs)
        ):
            if request.status != RequestStatus.RUNNING:
                continue  # preempted or aborted while the step ran
            pending = request.pending_prompt_logprobs
            if pending is not None and prompt_lp is not None:
                pending.extend(prompt_lp)
            drafts = plan.drafts.get(request.request_id)
            if not drafts:
                request.num_computed_tokens += num_new
                self.kv.commit(request)
                if token_id < 0:
                    continue
                kept = [token_id]
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
                kept = [*drafts[:num_accepted], token_id]
                # K/V counts as computed for the last token and the accepted drafts (the kept
                # tokens' positions are bounded below, by the verdict).
                request.num_computed_tokens += num_new - (num_slots - num_accepted)
            if pending is not None:  # the prefill is complete: its first token came
                assert len(pending) == request.num_prompt_tokens - 1, (len(pending), request)
                request.pending_prompt_logprobs = None
            if request.structured is None:
                updates.append(self.settle(request, self._append(request, kept, lp), pending))
                continue
            step = Deferred(request, kept, lp, functools.partial(self._check_stop, request), pending)
            if deferred is not None and request.structured.searches:
                request.pending = True
                deferred.append(step)
            else:
                updates.append(self.settle(request, step.decide(deadline), pending))
        return updates

    def settle_deferred(self, step: Deferred, verdict: Verdict) -> RequestUpdate | None:
        """Apply the verdict of a deferred step (:meth:`settle`); None, and nothing done, if the
        request ended meanwhile (aborted: its blocks are already free)."""
        request = step.request
        if request.status != RequestStatus.RUNNING or self.requests.get(request.request_id) is not request:
            return None
        return self.settle(request, verdict, step.prompt_logprobs)

    def settle(
        self,
        request: Request,
        verdict: Verdict,
        prompt_logprobs: list[tuple[float, list[tuple[int, float]]]] | None = None,
    ) -> RequestUpdate:
        """Apply one request's verdict: K/V only up to the fewest tokens its output was cut back
        to in the step (blocks past its length are freed; the full blocks of what stands go to
        the prefix cache), the proposer told of tokens taken back, the request finished."""
        request.pending = False
        self.kv.truncate(request, request.num_prompt_tokens + verdict.num_unchanged)
        self.kv.commit(request)
        if verdict.forget_drafts and self.proposer is not None:
            self.proposer.forget(request.request_id)  # its index saw tokens taken back
        if verdict.finish_reason is not None:
            self.running.remove(request)
            self._finish(request, verdict.finish_reason)
        return RequestUpdate(request, verdict, prompt_logprobs)

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
        # (running[first] itself is never pending: it is the one being scheduled.)
        candidates = [r for r in self.running[first:] if not r.pending]
        return max(candidates, key=lambda r: (blocks[r.tenant], r.priority, r.arrival_time))

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
        over = [r for r in self.running if running[r.tenant] > share and not r.pending]
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
        # A request that ended in ERROR (its grammar rejected a token) is not cached, nor a pending
        # one (aborted while its controller may still change its output). A failed step never
        # reaches here: the scheduler actor rebuilds the whole pool instead (scheduler/actor.py).
        self.kv.release(request, cache=reason != FinishReason.ERROR and not request.pending)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        del self.requests[request.request_id]
        self._finished_since_last_step.append(request.request_id)
        if self.proposer is not None:
            self.proposer.forget(request.request_id)

    def _append(
        self, request: Request, token_ids: list[int], logprobs: list[tuple[float, list[tuple[int, float]]]] | None
    ) -> Verdict:
        """Append an unconstrained request's kept tokens (one sampled, or the accepted drafts and
        the model's token) one at a time, each checked for a stop, up to the first that ends it."""
        output = request.output_token_ids
        reason: FinishReason | None = None
        for n, t in enumerate(token_ids, 1):
            output.append(t)
            reason = self._check_stop(request, t, len(output))
            if reason is not None:
                token_ids = token_ids[:n]
                break
        if logprobs is not None:
            logprobs = logprobs[: len(token_ids)]  # none for tokens after a stop
        return Verdict(new_token_ids=token_ids, num_unchanged=len(output), finish_reason=reason, logprobs=logprobs)

    def _room(self, request: Request, num_output: int | None = None) -> int:
        """Output tokens the request may still produce (``max_tokens``, the context) after
        ``num_output`` output tokens (default: as many as it has)."""
        if num_output is None:
            num_output = len(request.output_token_ids)
        limit = min(request.max_tokens, self.config.max_model_len - request.num_prompt_tokens)
        return limit - num_output

    def _check_stop(self, request: Request, token_id: int, num_output: int) -> FinishReason | None:
        """Whether ``token_id``, the output's ``num_output``-th token, ends the request."""
        sampling = request.sampling
        if num_output > sampling.min_tokens:
            if not sampling.ignore_eos and token_id in self.config.eos_token_ids:
                return FinishReason.STOP
            if token_id in sampling.stop_token_ids:
                return FinishReason.STOP
        if self._room(request, num_output) <= 0:
            return FinishReason.LENGTH
        return None

    def _propose(self, request: Request, num_new: int, limit: int) -> list[int]:
        """Up to ``limit`` draft tokens for a decoding request, as many as ``max_tokens`` and the
        context leave room for; with a grammar, only the longest run the grammar allows."""
        if self.proposer is None or num_new != 1 or request.num_computed_tokens != request.num_tokens - 1:
            return []
        room = min(limit, self._room(request) - 1)  # the step's own token comes after the drafts
        structured = request.structured
        if structured is None:
            return self.proposer.propose(request, room)
        if isinstance(self.proposer, DraftSlots):
            return []  # its per-position masks are made before the step, a draft model drafts during it
        proposer = self.proposer
        return structured.draft_run(len(request.output_token_ids), lambda: proposer.propose(request, room))

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
