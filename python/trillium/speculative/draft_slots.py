"""The scheduler's half of draft-model speculation: how many draft slots a request gets.

With ``method: draft`` the drafts come from a second model that runs on the step thread
(``speculative.draft``), after the scheduler has planned the step. So the scheduler plans
``n`` placeholder drafts per speculating request (its budget and blocks count them, as for
n-gram drafts) and the runner has the draft model fill them in before the verify forward; the
draft model may fill fewer (its KV pool is full), and the step's output says which drafts were
verified (``StepOutput.draft_token_ids``).
"""

from __future__ import annotations

from trillium.speculative.ngram import TokenSource

PLACEHOLDER = 0  # a draft slot's token until the draft model fills it (any id in the vocabulary)


class _Pace:
    __slots__ = ("backoff", "cap", "cooldown")

    def __init__(self, k: int) -> None:
        self.cap = k  # slots to give next time
        self.cooldown = 0  # steps to skip before drafting again
        self.backoff = 1  # the next cooldown after a verify that accepted nothing


class DraftSlots:
    """Placeholder drafts, with the same per-request back-off as ``NgramProposer``: after a
    verify that accepted ``a`` drafts the next step gets at most ``2a + 1`` slots, and one that
    accepted nothing pauses the request's drafting for 1, 2, 4 ... 32 steps (a draft model's k
    forwards are not free). Call :meth:`forget` when a request ends."""

    def __init__(self, num_speculative_tokens: int) -> None:
        self.k = num_speculative_tokens
        self._paces: dict[str, _Pace] = {}

    def propose(self, request: TokenSource, max_drafts: int) -> list[int]:
        """``min(cap, max_drafts)`` placeholders; [] while the request is cooling down."""
        pace = self._paces.get(request.request_id)
        if pace is None:
            pace = self._paces[request.request_id] = _Pace(self.k)
        if pace.cooldown > 0:
            pace.cooldown -= 1
            return []
        return [PLACEHOLDER] * max(min(pace.cap, max_drafts), 0)

    def feedback(self, request_id: str, num_drafts: int, num_accepted: int) -> None:
        pace = self._paces.get(request_id)
        if pace is None:
            return
        pace.cap = min(self.k, 2 * num_accepted + 1)
        if num_accepted == 0:
            pace.cooldown = pace.backoff
            pace.backoff = min(2 * pace.backoff, 32)
        else:
            pace.backoff = 1

    def forget(self, request_id: str) -> None:
        self._paces.pop(request_id, None)
