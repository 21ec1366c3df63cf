"""Step costs measured at start-up: what a draft row costs against a decoded token.

A verify step computes k + 1 rows per speculating request where a decode step computes one. At
batch 1 the step is bound by reading the weights, so the extra rows cost little; as the batch
grows the step becomes bound by arithmetic and an extra row costs about what a token does. The
runner times real steps of b requests, decoding (one row each) and verifying (k + 1 rows
each), for b = 1, 2, 4, ...; per batch size, ``break_even`` is a draft row's cost over a
decoded token's cost: the chance of acceptance a draft needs to pay (``speculative.depth``).
Speculation stands aside from the first batch size where it reaches ``NEVER_PAYS``.

Each batch size's decode and verify steps are timed in turns, ``REPEATS`` of each, and the fastest
of each kept: on a shared machine noise only ever adds time, and turns put a drift on both alike.
(With the median of three taken one kind after the other, one slow run of verifies at batch 1 read
a break-even of 0.91 where ~0.3 is usual, and a server never speculated in its whole life.)

The measurement is part of every start-up, so it is bounded: a batch size whose steps are slow
(where noise weighs less) stops after ``MIN_REPEATS`` pairs once ``SIZE_SECONDS`` are spent on
it, and a batch size starts only if it would end within ``TOTAL_SECONDS`` (reckoned at twice the
last size's cost); speculation then stands aside from the first size not timed. (Unbounded,
fp32 dense weights -- whose break-even stays low up to batch 64 -- took 28 s of a 33 s
start-up; the default model's ~4 s.)

The timed steps write the runner's first blocks: call this before any request exists (every
block is written before it is read, so nothing of them survives; a prefix-cached block would be
overwritten). They run on the step thread like any step.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time

from trillium.engine.runner import ModelRunner
from trillium.protocol import SamplingParams, ScheduledRequest, StepInput

log = logging.getLogger("trillium.engine")

NEVER_PAYS = 0.9  # a draft would need this chance of acceptance: speculation stands aside
CONTEXT = 64  # tokens each timed request has in KV: a short chat turn
REPEATS = 5  # timings of each kind per batch size; the fastest is kept
MIN_REPEATS = 2  # ... at least, however slow the steps
SIZE_SECONDS = 0.5  # past MIN_REPEATS, no new pair once a batch size has taken this long
TOTAL_SECONDS = 8.0  # no batch size started that would end past this (module doc)


@dataclasses.dataclass(frozen=True)
class StepCosts:
    """Seconds of a decode step and of a verify step of k drafts per request (the fastest of
    ``REPEATS`` each), per batch size timed."""

    num_speculative_tokens: int
    batch_sizes: list[int]
    decode_s: list[float]
    verify_s: list[float]

    def break_even_table(self) -> tuple[tuple[int, float], ...]:
        """(batch size, break-even) pairs, as ``SchedulerConfig.spec_break_even`` takes them."""
        return tuple(zip(self.batch_sizes, self.break_even()))

    def describe(self, threshold: int) -> str:
        """What the start-up log says of these costs and the threshold derived from them."""
        return (
            f"a draft pays from a {[round(p, 2) for p in self.break_even()]} chance of acceptance at batch "
            f"{self.batch_sizes}; none from {threshold} running requests"
        )

    def break_even(self) -> list[float]:
        """Per batch size: a draft row's cost over a decoded token's (see the module doc)."""
        k = self.num_speculative_tokens
        return [max(v - d, 0.0) / (b * k) / (d / b) for b, d, v in zip(self.batch_sizes, self.decode_s, self.verify_s)]


class StepTimer:
    """Times steps of ``batch`` requests of ``rows`` new tokens each (``rows - 1`` drafts, greedy)
    over a shared context of ``context`` tokens, which construction prefills once. Every timed
    request reads the same blocks (and writes its new tokens into the same slots: harmless,
    nothing reads them back). Use it on the step thread, before any request exists (see above)."""

    def __init__(self, runner: ModelRunner, context: int, max_rows: int) -> None:
        self.runner, self.context = runner, context
        self.blocks = list(range(-(-(context + max_rows) // runner.block_size)))
        self.greedy = SamplingParams(temperature=0.0, max_tokens=max_rows)
        self.vocab = vocab = runner.config.vocab_size
        prompt = [(7 * i + 11) % vocab for i in range(context)]
        runner.execute(StepInput(requests=[_request("p", prompt, 0, self.blocks, self.greedy)]))

    def step_s(self, batch: int, rows: int) -> float:
        """Seconds of one such step (``rows`` at most the ``max_rows`` given)."""
        tokens = [(13 * j + 5) % self.vocab for j in range(rows)]
        requests = [_request(f"r{i}", tokens, self.context, self.blocks, self.greedy, rows - 1) for i in range(batch)]
        step = StepInput(requests=requests)
        start = time.perf_counter()
        self.runner.execute(step)
        return time.perf_counter() - start

    def median_s(self, batch: int, rows: int, repeats: int = REPEATS) -> float:
        """Median seconds of ``repeats`` such steps."""
        return statistics.median(self.step_s(batch, rows) for _ in range(repeats))


def measure_step_costs(runner: ModelRunner, num_speculative_tokens: int, max_batch: int) -> tuple[int, StepCosts]:
    """(threshold, the costs): times batch sizes 1, 2, 4, ... up to ``max_batch`` and stops at
    the first whose break-even reaches ``NEVER_PAYS``: the threshold (``2 * max_batch`` when
    none does), or at the first not timed within ``TOTAL_SECONDS`` (module doc)."""
    k = num_speculative_tokens
    step_s = StepTimer(runner, CONTEXT, k + 1).step_s
    step_s(1, 1)  # warm-up: first-touch of the weights and the kernels' scratch
    costs = StepCosts(k, [], [], [])
    batch = 1
    threshold = 2 * max_batch
    began, pair_s = time.perf_counter(), 0.0  # pair_s: the last size's slowest decode + verify
    while batch <= max_batch:
        # A size costs about twice the last (twice the rows); it must fit what is left.
        if time.perf_counter() - began + MIN_REPEATS * 2 * pair_s > TOTAL_SECONDS:
            threshold = batch  # not timed: speculation stands aside from here
            break
        decode: list[float] = []
        verify: list[float] = []
        size_began = time.perf_counter()
        while len(decode) < REPEATS and (
            len(decode) < MIN_REPEATS or time.perf_counter() - size_began < SIZE_SECONDS
        ):  # in turns, the fastest of each kept (module doc)
            decode.append(step_s(batch, 1))
            verify.append(step_s(batch, k + 1))
        pair_s = max(d + v for d, v in zip(decode, verify))
        costs.batch_sizes.append(batch)
        costs.decode_s.append(min(decode))
        costs.verify_s.append(min(verify))
        if costs.break_even()[-1] >= NEVER_PAYS:
            threshold = batch
            break
        batch *= 2
    log.info("speculation: %s", costs.describe(threshold))
    return threshold, costs


def _request(
    request_id: str, token_ids: list[int], start: int, blocks: list[int], sampling: SamplingParams, drafts: int = 0
) -> ScheduledRequest:
    return ScheduledRequest(
        request_id=request_id,
        token_ids=token_ids,
        start_pos=start,
        block_ids=blocks,
        sample=True,
        sampling=sampling,
        num_draft_tokens=drafts,
    )
