"""Speculation counters, named as vLLM's ``spec_decode`` metrics."""

from __future__ import annotations


class SpecStats:
    """Cumulative counts since start-up; mutated by the scheduler policy only.

    ``num_drafts``: verify rows (a request speculating in a step); ``num_draft_tokens``: drafts
    proposed; ``num_accepted_tokens``: drafts the model accepted; ``accepted_per_pos[j]``: how
    often draft j (0-based) was accepted.
    """

    __slots__ = ("accepted_per_pos", "num_accepted_tokens", "num_draft_tokens", "num_drafts")

    def __init__(self, num_speculative_tokens: int) -> None:
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_per_pos = [0] * num_speculative_tokens

    def record(self, num_draft_tokens: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        for j in range(num_accepted):
            self.accepted_per_pos[j] += 1

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts / proposed drafts (0 before any)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0
