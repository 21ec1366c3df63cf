"""How many drafts pay for themselves: recent acceptance by depth against measured row costs.

A draft adds one row to the step. It pays when the chance that it is accepted (with every draft
before it) is at least the draft row's cost relative to the cost of a token decoded without
speculation: ``break_even`` (measured at start-up per batch size, ``engine.step_costs``). At
batch 1 a row is cheap next to reading the weights; as the batch grows the step becomes bound by
arithmetic and a row costs as much as a token, so only near-certain drafts pay.

The chance is estimated per depth from recent verifies (exponentially decayed counts, with an
optimistic prior: a depth never tried counts as paying, so it gets tried), over all requests; each
request also caps its own next drafts after a rejection (``ngram.py``). Counts decay with every
verify, proposed at that depth or not, so a depth dropped on thin evidence is soon tried again.
When no depth pays, one draft is still proposed every ``PROBE_EVERY`` steps so that the estimate
keeps learning and speculation comes back when the text turns copyable.
"""

from __future__ import annotations

DECAY = 0.98  # per recorded verify: about the last 50 verifies count
PROBE_EVERY = 16


class DraftDepth:
    """Decayed counts of drafts proposed and accepted (with every draft before them) per depth."""

    __slots__ = ("_accepted", "_proposed", "_steps_without")

    def __init__(self, num_speculative_tokens: int) -> None:
        self._proposed = [0.0] * num_speculative_tokens
        self._accepted = [0.0] * num_speculative_tokens
        self._steps_without = 0

    def record(self, num_drafts: int, num_accepted: int) -> None:
        # Every depth's counts decay with every verify, not only the depths proposed: a depth
        # that stopped paying is not proposed, so its counts would otherwise never change and
        # it would never be tried again (one unlucky early verify kept a whole run at one draft
        # per step). Decayed evidence drifts back to the optimistic prior, so a dropped depth is
        # retried after a number of verifies that grows with how clearly it failed.
        for j in range(len(self._proposed)):
            self._proposed[j] *= DECAY
            self._accepted[j] *= DECAY
            if j < num_drafts:
                self._proposed[j] += 1.0
                self._accepted[j] += 1.0 if j < num_accepted else 0.0

    def chance(self, depth: int) -> float:
        """Estimated chance that draft ``depth`` (0-based) and all before it are accepted."""
        return (self._accepted[depth] + 1.0) / (self._proposed[depth] + 1.0)

    def limit(self, break_even: float) -> int:
        """Drafts to propose per request this step: the deepest run whose every draft's chance
        reaches ``break_even``; 1 every ``PROBE_EVERY`` calls that would give 0. Call once per
        step."""
        depth = 0
        while depth < len(self._proposed) and self.chance(depth) >= break_even:
            depth += 1
        if depth:
            self._steps_without = 0
            return depth
        self._steps_without += 1
        if self._steps_without >= PROBE_EVERY:
            self._steps_without = 0
            return 1
        return 0
