"""A step's token bitmasks, filled in the grammar thread while the model runs.

::

    event loop     schedule ─ begin_step() ─┐                             ┌─ update(): matchers accept
    grammar thread                          └─ fill masks (llguidance) ─┐ │           the new tokens
    model thread                    forward pass ─ logits ─ wait ───────┴─ apply mask ─ sample

:meth:`BitmaskFiller.begin_step` only submits work and returns at once; the runner calls
:meth:`StepBitmask.apply` after computing the logits, which waits for the fill (usually long
done) and masks the constrained rows in place through the C++ kernel. Matchers are touched by
the grammar thread only between ``begin_step`` and the runner's wait, and by their controller's
``step`` only after the step returned (on the event loop, or on the scheduler's search thread
while the request sits out steps), so they need no lock.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Future, ThreadPoolExecutor

import llguidance
import torch

from trillium.ops.attention import host_to_device
from trillium.ops.token_bitmask import apply_token_bitmask, bitmask_words
from trillium.structured.controller import OutputController


class StepBitmask:
    """The masks of one step. ``rows[i]`` is the bitmask row of the step's i-th scheduled request,
    or -1 when it is unconstrained or does not sample this step."""

    def __init__(self, tensor: torch.Tensor, rows: list[int], future: Future[None]) -> None:
        self.tensor = tensor  # [num_constrained, W] int32: a view of the filler's buffer
        self.rows = rows
        self._future = future
        self.wait_seconds = 0.0  # how long the runner waited for the fill

    def wait(self) -> None:
        """Block until the fill is done; re-raises its error."""
        start = time.perf_counter()
        self._future.result()
        self.wait_seconds = time.perf_counter() - start

    def apply(self, logits: torch.Tensor, spans: list[tuple[int, int]]) -> None:
        """Mask ``logits`` in place. ``spans`` lists, in the order of ``logits``' rows, (index of
        a scheduled request, its number of rows): one for a request sampling one token, n + 1
        for one verifying n drafts (position j takes the mask after drafts 0..j-1)."""
        self.wait()
        mask_rows: list[int] = []
        for index, count in spans:
            first = self.rows[index]
            mask_rows.extend([-1] * count if first < 0 else range(first, first + count))
        # On a GPU the masks go to the logits asynchronously from a pinned copy (the filler's buffer
        # is refilled for the next step while the copy may still be queued); on the CPU as they are.
        rows = torch.tensor(mask_rows, dtype=torch.int32)
        apply_token_bitmask(logits, host_to_device(self.tensor, logits.device), host_to_device(rows, logits.device))


class BitmaskFiller:
    """Owns the preallocated bitmask buffer and the grammar thread. One step at a time."""

    def __init__(self, max_rows: int, vocab_size: int, num_threads: int | None = None) -> None:
        self.vocab_size = vocab_size
        self.buffer = torch.full((max_rows, bitmask_words(vocab_size)), -1, dtype=torch.int32)  # [R, W]
        # llguidance's own pool computes the rows in parallel; the model thread keeps the rest.
        threads = num_threads or max(1, min(8, (os.cpu_count() or 2) // 2))
        self._executor = llguidance.LLExecutor(num_threads=threads)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar")
        self._last: Future[None] | None = None
        self.num_steps = 0
        self.num_rows = 0
        self.fill_seconds = 0.0  # time spent filling masks (overlapped with the forward pass)
        self.wait_seconds = 0.0  # time the runner waited for them (not overlapped)

    def begin_step(
        self, constrained: list[tuple[int, OutputController, list[int]]], num_requests: int
    ) -> StepBitmask | None:
        """Start filling masks for ``constrained`` = [(index among the step's requests, its controller,
        its draft tokens)]: one row for a request without drafts, n + 1 consecutive rows for n
        drafts (llguidance consumes the drafts for the later rows and rolls them back, so the
        matcher is as it was when the fill ends). Returns None when there is nothing to fill.
        Never blocks except after a failed step whose fill is still running (the buffer is
        reused)."""
        if self._last is not None:
            self._last.exception()  # wait without raising: that step already failed or succeeded
            self._last = None
        if not constrained:
            return None
        rows = [-1] * num_requests
        jobs = []
        # (row, token id, allowed) over the grammar's masks: the value checks' bans
        # (structured.guard), a think section's opening tag (OutputController.row_edits).
        edits: list[tuple[int, int, bool]] = []
        num_rows = 0
        for index, controller, drafts in constrained:
            if not controller.masks:
                continue  # inside its think section: unconstrained (row -1)
            matcher = controller.matcher
            rows[index] = num_rows
            # Drafts are filled on a copy (~10 us): consuming a draft can put llguidance's matcher
            # in a sticky error (a parser limit), and a draft the step then rejects must not end
            # the request. The original stays as it was, untouched until the step is done.
            ll = matcher.ll_matcher
            jobs.append((ll.deep_copy() if drafts else ll, num_rows, drafts, ll))
            edits += [(num_rows + j, t, allowed) for j, t, allowed in controller.row_edits(1 + len(drafts))]
            num_rows += 1 + len(drafts)
        if not num_rows:
            return None
        if num_rows > self.buffer.shape[0]:
            # Speculation's extra rows: bounded by max_running * (k + 1), grown on first need.
            self.buffer = torch.full((num_rows, self.buffer.shape[1]), -1, dtype=torch.int32)
        tensor = self.buffer[:num_rows]
        future = self._thread.submit(self._fill, jobs, tensor, edits)
        self._last = future
        self.num_steps += 1
        self.num_rows += num_rows
        return StepBitmask(tensor, rows, future)

    def end_step(self, step: StepBitmask | None) -> None:
        """Account for a finished step. The matchers are the scheduler's again once the fill is
        done; the runner waited for it before sampling, so this normally returns at once."""
        if step is None:
            return
        step._future.exception()
        if self._last is step._future:
            self._last = None
        self.wait_seconds += step.wait_seconds

    def _fill(self, jobs: list[_Job], tensor: torch.Tensor, edits: list[tuple[int, int, bool]]) -> None:
        start = time.perf_counter()
        row_bytes, num_rows = tensor.shape[1] * 4, tensor.shape[0]
        # llguidance's draft-token fill refuses a job without drafts: those go to the plain fill
        # (each call writes only its jobs' rows of the one tensor).
        drafting = [(copy, row, drafts) for copy, row, drafts, _ in jobs if drafts]
        plain = [(matcher, row) for matcher, row, drafts, _ in jobs if not drafts]
        if drafting:
            self._executor.unsafe_compute_mask_ptr_with_draft_token(drafting, tensor.data_ptr(), row_bytes, num_rows)
            for copy, row, drafts, original in jobs:
                if drafts and copy.is_error():
                    _repair_rows(tensor, row, drafts, original)
        if plain:
            self._executor.unsafe_compute_mask_ptr(plain, tensor.data_ptr(), row_bytes, num_rows)
        for row, token, allowed in edits:  # int32 words, so bit 31 is the sign
            word = int(tensor[row, token // 32]) & 0xFFFFFFFF
            word = word | (1 << (token % 32)) if allowed else word & ~(1 << (token % 32))
            tensor[row, token // 32] = word - (1 << 32) if word >= 1 << 31 else word
        self.fill_seconds += time.perf_counter() - start

    def close(self) -> None:
        self._thread.shutdown(wait=False)


# (the matcher the fill reads -- a copy when drafting --, its first row, its drafts, the request's matcher)
_Job = tuple[llguidance.LLMatcher, int, list[int], llguidance.LLMatcher]


def _repair_rows(tensor: torch.Tensor, row: int, drafts: list[int], original: llguidance.LLMatcher) -> None:
    """The draft fill's copy hit an error (a parser limit) at some draft: its later rows are not
    masks. Recomputes the rows one position at a time on another copy of the request's matcher
    (the original is not touched; rare, so not done for every fill) up to the position p whose
    draft cannot be consumed, and gives every row after p row p's mask. Those rows are read only
    if the step accepts draft p, and accepting it fails the same way for real: they just must not
    be empty rows to sample from. If even a mask cannot be computed, the rows from there copy the
    last good one (the request fails at that position anyway)."""
    probe = original.deep_copy()
    last = len(drafts)
    for j in range(len(drafts) + 1):
        mask = probe.compute_bitmask()
        if probe.is_error():
            last = j - 1
            break
        # llguidance's own bitmask may run a word past the model's vocabulary: that word is cut.
        tensor[row + j] = torch.frombuffer(bytearray(mask), dtype=torch.int32)[: tensor.shape[1]]
        if j == len(drafts) or not probe.consume_token(drafts[j]):
            last = j
            break
    if last >= 0:
        tensor[row + last + 1 : row + len(drafts) + 1] = tensor[row + last]
