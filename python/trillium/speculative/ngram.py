"""N-gram (prompt lookup) proposer: drafts copied from the request's own context.

For n from ``prompt_lookup_max`` down to ``prompt_lookup_min``, the context's last n tokens are
looked up among its earlier n-grams; the tokens that followed an earlier occurrence are the
drafts: at most n of them when the match is shorter than ``prompt_lookup_max``, up to k when it is
that long. A short match is weak evidence that the text is being copied, and a rejected draft row
is not free (a fifth of a decode step on CPU): replaying the committed grounded prompts' greedy
answers (``bench/spec_ceiling.py``, k = 5), k drafts on any match decoded 1.75x faster than plain
decoding, this rule 1.92x.

Which occurrence: a full-length n-gram often occurs several times (a variable name, a repeated
phrase of a document), and what followed its latest occurrence is not always what follows now.
Of its ``CANDIDATES`` latest occurrences, the one whose preceding tokens agree with the context's
for longest (up to ``AGREE_MAX``) is copied, the latest on a tie: the same replay accepted 2.50
drafts per verify instead of 2.42 and took 2% fewer steps. A shorter match is unique in effect
(had its occurrences agreed further back, the longer n-gram would have matched), so its latest
occurrence is used.

Each request has an index (n-gram -> end positions of its occurrences) that is extended by the
tokens appended since the last call, so a lookup costs O(n_max + k + CANDIDATES x AGREE_MAX),
never a scan of the context.
"""

from __future__ import annotations

from typing import Protocol

CANDIDATES = 8  # latest occurrences of a full-length n-gram compared by their preceding tokens
AGREE_MAX = 64  # tokens compared back from each (an agreement this long is as good as certain)


class TokenSource(Protocol):
    """A request's context as the proposer reads it (``scheduler.Request`` is one)."""

    request_id: str

    @property
    def num_tokens(self) -> int: ...

    def token_ids_slice(self, start: int, end: int) -> list[int]: ...


class _Index:
    """Latest end position of every n-gram (n in [n_min, n_max)) of a token sequence, the last
    ``CANDIDATES`` end positions of every n_max-gram, and how many drafts to propose next."""

    __slots__ = ("cap", "full", "latest", "num_indexed")

    def __init__(self, k: int) -> None:
        self.latest: dict[tuple[int, ...], int] = {}
        self.full: dict[tuple[int, ...], list[int]] = {}  # oldest first
        self.num_indexed = 0  # tokens [0, num_indexed) are indexed
        self.cap = k  # drafts to propose next time


class NgramProposer:
    """Owns one index per request; call :meth:`forget` when a request ends."""

    def __init__(self, num_speculative_tokens: int, n_min: int, n_max: int) -> None:
        self.k = num_speculative_tokens
        self.n_min = n_min
        self.n_max = n_max
        self._indexes: dict[str, _Index] = {}

    def propose(self, request: TokenSource, max_drafts: int) -> list[int]:
        """Up to ``min(k, max_drafts)`` draft tokens to follow the request's context; [] when its
        last n-gram never occurred before (or ``max_drafts`` <= 0)."""
        index = self._indexes.get(request.request_id)
        if index is None:
            index = self._indexes[request.request_id] = _Index(self.k)
        limit = min(index.cap, max_drafts)
        if limit <= 0:
            return []
        num_tokens = request.num_tokens
        # Index the n-grams ending before the last token: the last n-gram itself is the query, and
        # an occurrence ending at the context's end has nothing after it to propose.
        first = max(index.num_indexed, 1)
        if first < num_tokens:
            base = max(first - self.n_max, 0)
            window = request.token_ids_slice(base, num_tokens)
            latest, full = index.latest, index.full
            for end in range(first, num_tokens):
                for n in range(self.n_min, min(self.n_max - 1, end) + 1):
                    latest[tuple(window[end - n - base : end - base])] = end
                if end >= self.n_max:
                    ends = full.setdefault(tuple(window[end - self.n_max - base : end - base]), [])
                    ends.append(end)
                    if len(ends) > CANDIDATES:
                        del ends[0]
            index.num_indexed = num_tokens
        tail = request.token_ids_slice(max(num_tokens - self.n_max, 0), num_tokens)
        if len(tail) == self.n_max:
            occurrences = index.full.get(tuple(tail))
            if occurrences and occurrences[-1] < num_tokens:  # (a context cut back is forgotten)
                at = occurrences[-1] if len(occurrences) == 1 else self._most_agreeing(request, occurrences)
                return request.token_ids_slice(at, min(at + limit, num_tokens))
        for n in range(min(self.n_max - 1, num_tokens - 1), self.n_min - 1, -1):
            found = index.latest.get(tuple(tail[len(tail) - n :]))
            if found is not None:
                return request.token_ids_slice(found, min(found + min(limit, n), num_tokens))
        return []

    def _most_agreeing(self, request: TokenSource, ends: list[int]) -> int:
        """Of the end positions of earlier occurrences of the context's last n_max tokens, the
        one whose preceding tokens agree with the context's for longest (the latest on a tie)."""
        num_tokens = request.num_tokens
        back = min(AGREE_MAX, num_tokens)
        context = request.token_ids_slice(num_tokens - back, num_tokens)
        best, best_agree = ends[-1], -1
        for end in reversed(ends):
            span = min(back, end)
            earlier = request.token_ids_slice(end - span, end)
            agree = self.n_max  # the n_max tokens before `end` agree already; count further back
            while agree < span and context[back - 1 - agree] == earlier[span - 1 - agree]:
                agree += 1
            if agree > best_agree:
                best, best_agree = end, agree
        return best

    def feedback(self, request_id: str, num_drafts: int, num_accepted: int) -> None:
        """How a request's last drafts did: the next proposal is capped at twice the accepted run
        plus one. (A pause of 1, 2, 4 ... steps after a verify that accepted nothing, as
        ``draft_slots`` does for a draft model's costlier drafts, measured a loss here: replayed
        grounded answers decoded 1.62x faster than plain decoding with it, 1.88x without; when
        text stops being copyable, ``DraftDepth`` stops proposing for every request.)"""
        index = self._indexes.get(request_id)
        if index is not None:
            index.cap = min(self.k, 2 * num_accepted + 1)

    def forget(self, request_id: str) -> None:
        self._indexes.pop(request_id, None)
