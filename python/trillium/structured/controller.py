"""One constrained request's structured output, behind the interface the scheduler calls.

The scheduler knows a constrained request only by its :class:`OutputController` and calls:

- :meth:`~OutputController.draft_run`: the run of a proposer's drafts the grammar allows;
- :meth:`~OutputController.step`: the step's kept tokens (one sampled, or the accepted drafts
  and the model's token), appended to the output; returns a :class:`~trillium.protocol.Verdict`
  the scheduler applies (what the client gets, where the K/V stops being valid, the finish);
- :attr:`~OutputController.searches` (a step may search closings: the scheduler gives the update
  time) and :attr:`~OutputController.counters` (for ``/stats``).
The bitmask filler (``structured.bitmask``) reads :attr:`~OutputController.matcher` while a step
runs. Everything else -- the grammar matcher, the value checks and their repairs -- lives here.

Glossary (``docs/decisions/structured-output.md`` has the reasons):

- **jump-forward**: the tokens the grammar forces from here are appended without sampling.
- **value check**: a schema keyword the grammar cannot express (``uniqueItems``, ``not``, ...),
  checked on each value as it completes (``structured.guard``).
- **held back**: output from the start of a value a check may still reject is not delivered yet.
- **take back / ban**: a failed check removes the token that completed the value and bans it at
  that position; if every allowed token there is banned, the token before goes too.
- **start over**: a value failing ``RESTART_AFTER`` times is taken back to its first token.
- **dead end**: the grammar admits no continuation and the output is incomplete (a relaxed schema).
- **closing**: the shortest completion of a JSON output, appended when ``max_tokens`` runs out.
- **witness**: a value written again as a known-valid instance of its subschemas
  (``structured.witness``), when the model or a closing cannot satisfy its checks.
- **search**: closings and witnesses under value checks are searched within a per-step time
  (``CLOSE_SEARCH_SECONDS``, shared by the step's requests) and check budget.
- **think section**: a reasoning model's thinking (``SamplingParams.structured_after_think``):
  unconstrained, up to its closing tag; the grammar applies to what follows (the *answer*),
  whose tokens are the only ones the matcher, checks and closings see. The model may open it
  with its first token (the mask then allows the opening tag too); EOS inside it, or an
  allowance down to what the answer needs, closes it (a forced closing tag).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from trillium.protocol import FinishReason, SamplingParams, Verdict
from trillium.structured.closer import NUM_VARIANTS, SearchBudget
from trillium.structured.guard import MAX_VALUE_RETRIES, RESTART_AFTER
from trillium.structured.matcher import MAX_WITNESSES, GrammarMatcher
from trillium.structured.value_checks import CheckFailure

# What the value checks of one request may take back in all (``_reject``), in tokens per token
# of its max_tokens, and at least: each taken-back token was a step's work. MAX_VALUE_RETRIES
# bounds the retries of one value, each in full once it starts over, but not how many values
# fail: without this an output of many failing values had no bound in steps. (A model that
# picks the lowest token id takes back ~530 tokens to satisfy ``tests/unit/test_structured.py``'s
# NEEDS_MORE in 60 tokens; sampled ones far fewer.)
TAKE_BACK_PER_TOKEN = 8
TAKE_BACK_MIN = 1024
# Closing a JSON output (``_close_if_due``): recomputed every step once the allowance left is
# within CLOSE_MARGIN tokens of the last closing's length, else every CLOSE_RECHECK steps.
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

Logprobs = list[tuple[float, list[tuple[int, float]]]]
# The scheduler's stop check of a token just appended: (token id, the output's length with it).
Stop = Callable[[int, int], FinishReason | None]


class StructuredCounters:
    """What the controllers of one scheduler did, for ``/stats`` (``SchedulerStats``)."""

    __slots__ = ("forced_tokens", "closed_outputs", "witness_closings", "witness_values", "rejected_tokens")

    def __init__(self) -> None:
        self.forced_tokens = 0  # appended by jump-forward, never sampled
        self.closed_outputs = 0  # JSON outputs closed before max_tokens (``_close_if_due``)
        self.witness_closings = 0  # of those, closings that wrote an open value as a witness
        self.witness_values = 0  # values written as witnesses after failing their checks too often
        self.rejected_tokens = 0  # output tokens taken back by failed value checks (``_reject``)


class OutputController:
    """The structured output of one request: its grammar, value checks and their repairs.

    ``limit``: the output tokens the request may produce in all (its ``max_tokens``, clamped to
    the context). Not thread-safe: the scheduler calls it between steps; the bitmask filler
    reads :attr:`matcher` only while a step runs."""

    def __init__(
        self,
        matcher: GrammarMatcher,
        *,
        limit: int,
        sampling: SamplingParams,
        eos_token_ids: frozenset[int],
        jump_forward: bool,
        counters: StructuredCounters,
    ) -> None:
        self.matcher = matcher
        self.counters = counters
        self._limit = limit
        self._sampling = sampling
        self._eos = eos_token_ids
        # A forced token has no sampled distribution to report (and would bypass value checks: _jump).
        self._jump_forward = jump_forward and sampling.logprobs is None
        self._think = sampling.structured_after_think
        # Output tokens before the answer (the think section, its tags included); None while the
        # answer has not started (the model thinks, or may still open its think section).
        self._offset: int | None = 0 if self._think is None else None
        self._thinking = self._think is not None and self._think.opened  # inside the think section
        self._reserve = -1  # tokens kept for the answer, once known (_answer_reserve)
        self._deadline = 0.0  # when this step's searches must stop (step)
        self._unchanged = 0  # the fewest output tokens this step cut back to (Verdict.num_unchanged)
        self._forget = False  # tokens the proposer indexed were taken back this step

    # ---- the interface ---------------------------------------------------------------------

    @property
    def masks(self) -> bool:
        """This step's rows are masked: the answer's grammar applies (or its first token may
        still come instead of a think section); False inside the think section."""
        return self._offset is not None or not self._thinking

    def row_edits(self, num_rows: int) -> list[tuple[int, int, bool]]:
        """(row offset, token id, allowed) to apply over the grammar's masks of this step's
        ``num_rows`` rows: the bans of failed checks, and the think section's opening tag where
        the model may still open one."""
        if self._offset is None:
            assert self._think is not None
            return [(0, self._think.open_id, True)] if self._limit > self._answer_reserve() else []
        guard = self.matcher.guard
        if guard is None or not guard.bans:
            return []
        return [(j, t, False) for j, t in guard.bans_from(self.matcher.num_tokens, num_rows)]

    @property
    def searches(self) -> bool:
        """A step of this request may search closings and witnesses (up to the step's
        ``CLOSE_SEARCH_SECONDS``): it has value checks."""
        return self.matcher.guard is not None

    def draft_run(self, num_output: int, propose: Callable[[], list[int]]) -> list[int]:
        """The longest run of ``propose()``'s drafts (after ``num_output`` output tokens) the
        grammar allows; none, without asking, while a failed check's bans lie ahead (the drafts'
        masks would miss them). Consumes nothing."""
        if self._offset is None:  # thinking: drafts up to (not with) its end; none before it
            assert self._think is not None
            if not self._thinking:
                return []
            drafts = propose()
            end = next((j for j, t in enumerate(drafts) if t == self._think.close_id or t in self._eos), len(drafts))
            return drafts[:end]
        guard = self.matcher.guard
        if guard is not None and guard.has_bans_from(num_output - self._offset):
            return []
        drafts = propose()
        return drafts[: self.matcher.validate(drafts)] if drafts else drafts

    def step(
        self, output: list[int], token_ids: list[int], logprobs: Logprobs | None, stop: Stop, deadline: float
    ) -> Verdict:
        """Append a step's kept tokens to ``output`` (the request's list, changed in place), one
        at a time, each checked by ``stop`` and fed to the grammar and the value checks, up to the
        first that ends the request; then jump-forward, a closing when the allowance runs out,
        and the release of what no check can take back any more. ``logprobs``: one entry per
        token of ``token_ids`` when asked; ``deadline``: when the step's searches must stop."""
        self._deadline, self._forget = deadline, False
        head: list[int] = []  # this step's tokens of the think section: delivered as they come
        head_logprobs = None
        if self._offset is None:
            start = len(output)
            consumed, sampled, reason = self._think_step(output, token_ids, stop)
            head = output[start:]
            if logprobs is not None:
                head_logprobs, logprobs = logprobs[:sampled], logprobs[consumed:]
            token_ids = token_ids[consumed:]
            if reason is not None or self._offset is None:
                return Verdict(
                    new_token_ids=head, num_unchanged=len(output), finish_reason=reason, logprobs=head_logprobs
                )
        offset = self._offset
        if offset == 0:
            return self._answer_step(output, token_ids, logprobs, stop)
        answer = output[offset:]
        verdict = self._answer_step(answer, token_ids, logprobs, lambda t, n: stop(t, offset + n))
        output[offset:] = answer
        verdict.num_unchanged += offset
        verdict.new_token_ids = head + verdict.new_token_ids
        if head_logprobs is not None:
            verdict.logprobs = head_logprobs + (verdict.logprobs or [])
        return verdict

    # ---- the think section -------------------------------------------------------------------

    def _think_step(self, output: list[int], token_ids: list[int], stop: Stop) -> tuple[int, int, FinishReason | None]:
        """Append the step's tokens of the think section (or its opening). Returns how many of
        ``token_ids`` it took, how many of those were appended as sampled, and the finish
        reason. The answer starts (``_offset`` set) with the first token that is not the
        opening tag, or after the closing tag -- forced in EOS's place (the EOS has no K/V yet),
        or once the allowance is down to what the answer needs."""
        think = self._think
        assert think is not None
        for i, t in enumerate(token_ids):
            if not self._thinking:
                if t != think.open_id:  # the answer, at once
                    self._offset = len(output)
                    return i, i, None
                self._thinking = True
            elif t in self._eos:
                self._close_think(output)
                return i + 1, i, None
            output.append(t)
            reason = stop(t, len(output))
            if t == think.close_id:
                self._offset = len(output)
                return i + 1, i + 1, reason
            if reason is not None:
                return i + 1, i + 1, reason
        if self._thinking and self._limit - len(output) <= self._answer_reserve():
            self._close_think(output)
        return len(token_ids), len(token_ids), None

    def _close_think(self, output: list[int]) -> None:
        assert self._think is not None
        output.append(self._think.close_id)
        self.counters.forced_tokens += 1
        self._offset = len(output)

    def _answer_reserve(self) -> int:
        """Output tokens kept for the answer: its closing tag, its shortest complete form (with a
        closer) and ``CLOSE_MARGIN`` for what it says; thinking stops there."""
        if self._reserve < 0:
            closing = self.matcher.closing() if self.matcher.closer is not None else None
            self._reserve = 1 + (len(closing) if closing is not None else 0) + CLOSE_MARGIN
        return self._reserve

    def _answer_step(self, output: list[int], token_ids: list[int], logprobs: Logprobs | None, stop: Stop) -> Verdict:
        """:meth:`step` over the answer (``output``: its tokens only)."""
        self._unchanged = len(output) + len(token_ids)
        new_token_ids, reason, error = self._append(output, token_ids, stop)
        self._unchanged = min(self._unchanged, len(output))
        if logprobs is not None:
            logprobs = logprobs[: len(new_token_ids)]  # none for tokens after a stop (nor forced ones)
        closed, unsatisfied = False, None
        if reason is None:
            reason, error = self._jump(output, new_token_ids)
        if self.matcher.closer is not None and reason in (None, FinishReason.LENGTH):
            try:
                close_result = self._close_if_due(output, new_token_ids)
            except Exception as exc:  # a closing or check that cannot run fails this request only
                close_result, reason, error = None, FinishReason.ERROR, f"closing the output failed: {exc!r}"
            if close_result is not None:
                kept, unsatisfied = close_result
                reason, closed = FinishReason.LENGTH, True
                if logprobs is not None:
                    logprobs = logprobs[:kept]  # the closing's tokens were not sampled: none
            elif logprobs is not None:
                logprobs = logprobs[: len(new_token_ids)]  # (a deferred closing took this step's token back)
        guard = self.matcher.guard
        if guard is not None and reason == FinishReason.ERROR:
            new_token_ids, logprobs = [], None  # what was held back never passed its checks
        elif guard is not None:  # deliver only what no check can take back any more
            new_token_ids, logprobs = guard.release(output, logprobs, len(new_token_ids), finished=reason is not None)
        return Verdict(
            new_token_ids=new_token_ids,
            num_unchanged=self._unchanged,
            finish_reason=reason,
            error=error,
            logprobs=logprobs,
            closed_early=closed,
            unsatisfied_check=unsatisfied,
            forget_drafts=self._forget,
        )

    # ---- appending -------------------------------------------------------------------------

    def _cut(self, output: list[int]) -> None:
        """The output was cut back to where it stands: K/V from there on is not kept."""
        self._unchanged = min(self._unchanged, len(output))

    def _room(self, output: list[int]) -> int:
        """Tokens the answer ``output`` may still grow by."""
        assert self._offset is not None
        return self._limit - self._offset - len(output)

    def _append(
        self, output: list[int], token_ids: list[int], stop: Stop
    ) -> tuple[list[int], FinishReason | None, str | None]:
        """Append ``token_ids`` one at a time up to the first that ends the request. Returns (the
        tokens appended, finish reason, error). A complete grammar ends the request with STOP,
        even before ``min_tokens`` or under ``ignore_eos``: nothing could follow. A token the
        grammar rejects ends it in ERROR."""
        matcher = self.matcher
        appended: list[int] = []
        reason: FinishReason | None = None
        for t in token_ids:
            output.append(t)
            appended.append(t)
            reason = stop(t, len(output))
            if not matcher.accept(t):
                return appended, FinishReason.ERROR, matcher.rejection(t)
            if matcher.dead_end:  # t led where nothing can follow: take it back (checked output) or fail
                before = len(output)
                reason, error = self._dead_end(output)
                del appended[max(0, len(appended) - (before - len(output))) :]
                return appended, reason, error
            guard = matcher.guard
            if guard is not None:
                # EOS or a stop token is no JSON: it ends the output (a pending number completes).
                ends = t in self._eos or t in self._sampling.stop_token_ids
                try:
                    failure = guard.feed(t, end=ends)
                    if failure is None and matcher.is_terminated and not ends:
                        failure = guard.checker.finish()
                except Exception as exc:  # a check that cannot run fails this request only
                    return appended, FinishReason.ERROR, f"the schema checks failed: {exc!r}"
                if failure is not None:
                    before = len(output)
                    reason, error = self._reject(output, failure)
                    del appended[max(0, len(appended) - (before - len(output))) :]
                    return appended, reason, error
            if matcher.is_terminated:
                return appended, FinishReason.STOP, None
            if reason is not None:
                break
        return appended, reason, None

    def _jump(self, output: list[int], new_token_ids: list[int]) -> tuple[FinishReason | None, str | None]:
        """Append the tokens the grammar forces from here (jump-forward) to the output and to
        ``new_token_ids``. Returns the finish reason and an error message."""
        matcher = self.matcher
        if not self._jump_forward or matcher.guard is not None:
            return None, None
        forced = matcher.forced_tokens()[: self._room(output)]
        if not forced:
            return None, None
        if not matcher.accept_forced(forced):
            return FinishReason.ERROR, f"the grammar rejected its own forced tokens: {matcher.error}"
        if matcher.dead_end:
            return FinishReason.ERROR, f"the grammar admits no continuation after its forced tokens ({matcher.error})"
        output.extend(forced)
        new_token_ids.extend(forced)
        self.counters.forced_tokens += len(forced)
        if matcher.is_terminated:
            return FinishReason.STOP, None
        return (FinishReason.LENGTH if self._room(output) <= 0 else None), None

    # ---- repairs after a failed check or a dead end ---------------------------------------------

    def _reject(self, output: list[int], failure: CheckFailure) -> tuple[FinishReason | None, str | None]:
        """A value check failed on the output's last token: take the token back and ban it there;
        while every token the grammar allows at the position is banned, take back and ban the one
        before too (never past what the client already has). ``structured.guard``. Returns
        (ERROR, why) once one value failed its checks ``MAX_VALUE_RETRIES`` times, or the checks
        took back ``TAKE_BACK_PER_TOKEN`` tokens per token of the limit."""
        matcher = self.matcher
        guard = matcher.guard
        assert guard is not None
        guard.retries[failure.value_start] += 1
        spent = self._take_back_spent()
        if guard.retries[failure.value_start] > MAX_VALUE_RETRIES or spent:
            if self._write_witness(output, failure.value_start):
                return None, None  # the value, written again as a witness; the request goes on
            output.pop()  # (the request ends; nothing held back is delivered: see step)
            matcher.rollback(1)
            why = f" ({guard.num_rejected} tokens taken back in all)" if spent else ""
            return FinishReason.ERROR, f"no output satisfying the schema was found: {failure.message}{why}"
        # Usually only how the value ended is taken back; a value that keeps failing starts over.
        restart = guard.retries[failure.value_start] > RESTART_AFTER
        first = max(guard.token_at(failure.value_start), guard.num_released) if restart else len(output) - 1
        also = [] if restart else guard.completing_alike(output)
        return self._take_back(output, first, also)

    def _write_witness(self, output: list[int], start: int) -> bool:
        """The value at byte ``start`` of the output failed its checks too often: take the output
        back to where it starts and write it again as a witness of its subschemas
        (``structured.witness``; forced tokens, like jump-forward's), for the model to go on
        after. Only over tokens still held back, at most ``MAX_WITNESS_VALUES`` times per
        request, and only where the output could still be closed after it. True if written;
        otherwise the output is as it was."""
        matcher = self.matcher
        guard = matcher.guard
        assert guard is not None
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
            budget = SearchBudget(WITNESS_CHECK_BUDGET, self._time_left())
            tokens = matcher.witness_closing(
                node, head, self._room(output), budget, lambda t: guard.failure(output + t) is None, close=False
            )
        if tokens is None or not matcher.accept_forced(tokens):
            self._put_back(output, taken[::-1])
            guard.replay(output)
            return False
        guard.num_rejected += len(taken)
        self.counters.rejected_tokens += len(taken)
        guard.forget_from(cut)
        self._cut(output)  # the K/V from the cut on was of the tokens taken back
        output.extend(tokens)
        guard.replay(output)
        guard.num_witness_values += 1
        self.counters.witness_values += 1
        self._forget = True
        return True

    def _take_back_spent(self) -> bool:
        """The checks took back all they may (``TAKE_BACK_PER_TOKEN``)."""
        assert self.matcher.guard is not None
        limit = max(TAKE_BACK_MIN, TAKE_BACK_PER_TOKEN * self._limit)
        return bool(self.matcher.guard.num_rejected >= limit)

    def _dead_end(self, output: list[int]) -> tuple[FinishReason | None, str | None]:
        """The last token left the grammar at a dead end (``GrammarMatcher.dead_end``). With value
        checks (a relaxed schema, whose grammar accepts more than the schema and may so wander
        into a branch it cannot finish) the token is taken back and banned like one that failed a
        check, within the same retry bound; otherwise the request fails, saying so -- never a
        finished output that is not complete."""
        matcher = self.matcher
        guard, error = matcher.guard, matcher.error.strip().splitlines()[:1]
        token = output.pop()
        if token in self._eos and output:
            # llguidance finds the dead end when it next computes a mask, which then allows only
            # EOS: the token before led there.
            token = output.pop()
        why = f"the grammar admits no continuation after token {token}" + (f" ({error[0]})" if error else "")
        if guard is None or len(output) < guard.num_released or not matcher.start_over(output):
            return FinishReason.ERROR, why  # (a token the client has cannot be taken back)
        at = guard.ends[len(output) - 1] if output else 0  # where the culprit's bytes began
        guard.retries[at] += 1
        if guard.retries[at] > MAX_VALUE_RETRIES or self._take_back_spent():
            return FinishReason.ERROR, f"no output satisfying the schema was found: {why}"
        return self._take_back(output, len(output), [], taken=token)

    def _take_back(
        self, output: list[int], first: int, also: list[int], taken: int | None = None
    ) -> tuple[FinishReason | None, str | None]:
        """Take the output back to ``first`` tokens (``taken``: its last token, already taken
        back), then ban the last token taken back there (and ``also``); while that leaves the
        grammar nothing at the position, take back and ban the token before too."""
        matcher = self.matcher
        guard = matcher.guard
        assert guard is not None
        while True:
            if taken is not None:
                token, taken = taken, None
            elif not matcher.rollback(1):
                return FinishReason.ERROR, f"the grammar could not take a token back: {matcher.error}"
            else:
                token = output.pop()
            guard.num_rejected += 1
            self.counters.rejected_tokens += 1
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
        self._cut(output)
        self._forget = True  # the proposer's index saw the tokens taken back
        return None, None

    # ---- closing ---------------------------------------------------------------------------

    def _time_left(self) -> float:
        return max(0.0, self._deadline - time.perf_counter())

    def _close_if_due(self, output: list[int], new_token_ids: list[int]) -> tuple[int, str | None] | None:
        """Close a JSON output whose allowance is running out (``structured.closer``): when what
        is left of the limit is no more than the tokens closing needs, append the closing and
        return how many of this step's ``new_token_ids`` were kept before it, and the message of
        the value check the closed output still fails (None: it passes every check; said in the
        response as ``unsatisfied_check``, never returned silently as if valid); None while there
        is room. This step's tokens (not yet delivered) are taken back one at a time while the
        closing from after them would not fit: the state before the step had room for its own.
        The closing is computed only near the end of the allowance, and every ``CLOSE_RECHECK``
        steps elsewhere (it can grow when a value opens)."""
        matcher = self.matcher
        room = self._room(output)
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
            del output[-1]
            closing = matcher.closing(room=room)
        further_back = False
        if (closing is None or len(closing) > room) and last_chance and kept == 0:
            # The last chance, and none fits from here or after any of this step's tokens:
            # from further back, over tokens still held back.
            closing = self._closing_further_back(output)
            room, further_back = self._room(output), closing is not None
        if closing is None or len(closing) > room:
            # None found, or the steps since the last check outgrew the room (their tokens were
            # delivered): put back what was taken; the output is cut where it falls.
            matcher.closing_length = 0  # try again on the next step
            if kept < len(new_token_ids):
                matcher.accept_forced(new_token_ids[kept:])
                output.extend(new_token_ids[kept:])
            return None
        matcher.closing_length = len(closing)
        if not further_back and kept == len(new_token_ids) and (len(closing) < room or not closing):
            return None  # room to go on, or complete already
        guard = matcher.guard
        failure = guard.failure(output + closing) if guard is not None else None
        if failure is not None and (found := self._checked_closing(output, room, kept)) is not None:
            (closing, kept), failure = found, None
        elif failure is not None and guard is not None and kept > 0 and self._search_starved():
            # This step's searches ran out of time before this one had its share (every request
            # of a batch comes to its end at once): take this step's last token back, so the
            # closing is due again next step, with the next step's time.
            matcher.rollback(1)
            output.pop()
            del new_token_ids[kept - 1 :]
            guard.replay(output)
            guard.num_deferred_closings += 1
            self._cut(output)
            return None
        del new_token_ids[kept:]
        self._cut(output)  # drafts taken back had K/V: not for the closing's tokens
        output.extend(closing)
        new_token_ids.extend(closing)
        self.counters.closed_outputs += 1
        return kept, None if failure is None else failure.message

    def _search_starved(self) -> bool:
        """The step's time for closing searches is gone, and the request may wait for the next
        step's (at most ``MAX_DEFERRED_CLOSINGS`` times)."""
        guard = self.matcher.guard
        assert guard is not None
        return time.perf_counter() >= self._deadline and guard.num_deferred_closings < MAX_DEFERRED_CLOSINGS

    def _closing_further_back(self, output: list[int]) -> list[int] | None:
        """A closing from earlier in the output, for an output about to end with none that fits:
        the grammar let it into a value no character can finish (llguidance admits a key, under
        a ``patternProperties`` whose value is ``false``, that already matches the pattern), or
        the closing outgrew the room. Tokens still held back (never delivered) are taken back 1,
        2, 4, ... at a time until a closing fits the room they free. Returns that closing, the
        output, matcher and guard cut back to where it applies; None (the output as it stood)
        when there are no held tokens or none is found over them."""
        matcher = self.matcher
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
            room = self._room(output)
            closing: list[int] | None = matcher.closing(room=room)
            if closing is not None and len(closing) <= room:
                guard.replay(output)
                return closing
            step *= 2
        self._put_back(output, popped)
        return None

    def _checked_closing(self, output: list[int], room: int, kept: int) -> tuple[list[int], int] | None:
        """The usual closing completes or invents a value a check rejects (a duplicate item):
        try the closer's other variants, from the output as it is, then from up to
        ``CLOSE_BACKTRACK`` tokens earlier, then from the start of each value still open, innermost
        first: the value written again as a witness of its subschemas (``structured.witness``:
        where the text so far rules out every ending, as a number under ``not: {multipleOf}``
        inside an ``anyOf`` can), else by the checked closer -- always over tokens still held
        back, never delivered ones. Returns the closing to append and this step's tokens kept;
        None if none passes (the output as it stood)."""
        matcher = self.matcher
        guard = matcher.guard
        assert guard is not None
        # The whole step waits for the search: bounded in checks and in time (closer.SearchBudget),
        # the time shared by every such search of one step. Half of each goes to closings from
        # where the output stands (or a few tokens back), the rest to values written again from
        # their start: the first half can spend everything on a hopeless output.
        budget = SearchBudget(CLOSE_CHECK_BUDGET // 2, self._time_left() / 2)
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
        budget = SearchBudget(CLOSE_CHECK_BUDGET // 2, self._time_left())
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
                    found = SearchBudget(WITNESS_CHECK_BUDGET, self._time_left())
                    c = matcher.witness_closing(node, head, room, found, lambda c: guard.accepts(output + c), tries)
                    if c is not None:
                        self.counters.witness_closings += 1
                        return c, max(kept - len(popped), 0)
                elif not witnesses:
                    c = matcher.closing(checked=True, room=room, budget=budget)
                    if c is not None and len(c) <= room and guard.accepts(output + c):
                        return c, max(kept - len(popped), 0)
            if witnesses:  # back to where the output stood before the witnesses were tried
                self._put_back(output, popped[mark:])
                room -= len(popped) - mark
                del popped[mark:]
                guard.replay(output)
                budget = SearchBudget(CLOSE_CHECK_BUDGET // 2, self._time_left())
        # None passes: back to where the output stood, for the usual closing (it parses; the
        # checks it fails are what the model and the closer could not satisfy in the room left).
        self._put_back(output, popped)
        guard.replay(output)
        return None

    def _put_back(self, output: list[int], popped: list[int]) -> None:
        """Give the output (and the matcher) back the tokens a search took back, ``popped`` last
        first as they were taken."""
        tokens = popped[::-1]
        if tokens and not self.matcher.accept_forced(tokens):
            raise RuntimeError(f"the grammar refused tokens it had accepted: {self.matcher.error}")
        output.extend(tokens)
