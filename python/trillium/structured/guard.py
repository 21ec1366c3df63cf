"""The value checks of one constrained request: keywords its grammar cannot express.

A JSON Schema keyword that llguidance cannot compile (``uniqueItems``, ``not``, ``if``/``then``/
``else``, ``contains``, ``dependentRequired``, ``min/maxProperties`` over optional keys, ...) is
relaxed out of the grammar (``schema_rewrite``) and checked here instead, on each value as it
completes (``value_checks.ValueChecker``). A failed check rolls the output back by one token --
the token that completed the failing value -- and bans that token at that position, so the
model must continue differently (a duplicate item ``"a"`` becomes ``"ab"``, an object that must
not end yet gets another property). When every token the grammar allows at a position is banned,
the token before it is rolled back and banned too (depth-first search, bounded by
:data:`MAX_VALUE_RETRIES` failures per value, and by what one request may take back in all:
``structured.controller.TAKE_BACK_PER_TOKEN``). The request's controller does the rolling back
(``OutputController._reject``); this class keeps the per-request state:

- the byte end of every output token (to map the checker's byte offsets to tokens),
- the bans (output position -> tokens the mask removes there; a ban at a position clears those
  past it, whose prefix is gone),
- how many output tokens were released to the client: text from the start of a value that a
  check may still reject is held back (``ValueChecker.hold_from``), so nothing the client saw is
  ever taken back,
- the held tokens' logprobs.

Not thread-safe: the request's controller owns it (on the event loop, or on the scheduler's
search thread while the request sits out steps: ``SchedulerActor._update``); the grammar thread
reads the bans of a step's rows only while the step runs (``BitmaskFiller``), when nothing
changes them.
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter
from collections.abc import Callable
from typing import Any

from trillium.structured.call_checks import Checker
from trillium.structured.value_checks import CheckFailure

MAX_VALUE_RETRIES = 32  # failed checks of one value before the request ends in an error
# After this many failed checks of one value, the retry starts the value over (its first token
# is banned) instead of changing only how it ends: ``"admin"`` under ``not: {pattern: "^a"}``
# fails however it ends.
RESTART_AFTER = 3
_STRUCTURAL = frozenset(b'"]},:')


class CompletionIndex:
    """Token ids by the bytes they start with, up to each structural byte (``"`` ``]`` ``}`` ``,``
    ``:``): the tokens that would complete a value the same way as a rejected one (``5}`` and
    ``5},`` both close the object after ``5``). Built once per tokenizer (~0.1 s)."""

    def __init__(self, vocab_size: int, token_bytes: Callable[[int], bytes]) -> None:
        self._by_prefix: dict[bytes, list[int]] = {}
        for t in range(vocab_size):
            data = token_bytes(t)
            for j, byte in enumerate(data):
                if byte in _STRUCTURAL:
                    self._by_prefix.setdefault(data[: j + 1], []).append(t)

    def starting_with(self, prefix: bytes) -> list[int]:
        """Tokens whose bytes start with ``prefix`` (which ends in a structural byte)."""
        return self._by_prefix.get(prefix, [])


class OutputGuard:
    """Checks, bans and held-back output of one request."""

    def __init__(
        self,
        new_checker: Callable[[], Checker],
        token_bytes: Callable[[int], bytes],
        index: CompletionIndex | None = None,
    ) -> None:
        """``new_checker``: a fresh checker of the whole output (a ``ValueChecker`` of the schema's
        checks, or a ``CallsChecker`` of a tool-call grammar's)."""
        self._index = index
        self._new_checker = new_checker
        self.checker = new_checker()
        self._token_bytes = token_bytes
        self.ends: list[int] = []  # byte end of each output token the checker saw
        self.bans: dict[int, set[int]] = {}
        self.retries: Counter[int] = Counter()  # value start (byte offset) -> failed checks
        self.num_released = 0  # output tokens delivered to the client
        self._logprobs: dict[int, Any] = {}  # output position -> its logprobs entry, while held
        self.num_rejected = 0  # tokens rolled back by failed checks
        self.num_witness_values = 0  # values written as witnesses after failing too often
        self.num_deferred_closings = 0  # steps the closing waited for the next step's search time

    def feed(self, token_id: int, *, end: bool = False) -> CheckFailure | None:
        """Check the output after one more token; ``end``: it ends the output (EOS, a stop token),
        so it is no JSON: a pending top-level value completes."""
        if end:
            self.ends.append(self.ends[-1] if self.ends else 0)
            return self.checker.finish()
        data = self._token_bytes(token_id)
        self.ends.append((self.ends[-1] if self.ends else 0) + len(data))
        return self.checker.feed(data)

    def replay(self, output_token_ids: list[int]) -> None:
        """The output was cut back to ``output_token_ids``: check it again from the start (those
        tokens passed before, so nothing fails)."""
        pieces = [self._token_bytes(t) for t in output_token_ids]
        self.ends = list(itertools.accumulate(len(p) for p in pieces))
        self.checker.reset()
        self.checker.feed(b"".join(pieces))

    def accepts(self, output_token_ids: list[int]) -> bool:
        """Whether the whole output ``output_token_ids`` (a closed one) passes every check."""
        return self.failure(output_token_ids) is None

    def failure(self, output_token_ids: list[int]) -> CheckFailure | None:
        """The first check the whole output ``output_token_ids`` (a closed one) fails; None if
        it passes every check."""
        checker = self._new_checker()
        data = self.text(output_token_ids)
        return checker.feed(data) or checker.finish()

    def ban(self, position: int, token_id: int, also: list[int] | tuple[int, ...] = ()) -> None:
        """Never sample ``token_id`` (nor the ``also`` ones) at output ``position`` (again); bans
        past it are dropped: their prefix is gone."""
        for p in [p for p in self.bans if p > position]:
            del self.bans[p]
        banned = self.bans.setdefault(position, set())
        banned.add(token_id)
        banned.update(also)

    def forget_from(self, position: int) -> None:
        """The output was cut back to ``position`` tokens and goes on differently: the bans and
        retry counts past it were about text that is gone."""
        for p in [p for p in self.bans if p >= position]:
            del self.bans[p]
        at = self.ends[position - 1] if position else 0
        for start in [s for s in self.retries if s >= at]:
            del self.retries[start]

    def unban(self, position: int, token_ids: list[int]) -> None:
        banned = self.bans.get(position)
        if banned is not None:
            banned.difference_update(token_ids)
            if not banned:
                del self.bans[position]

    def completing_alike(self, output_token_ids: list[int]) -> list[int]:
        """The tokens that would complete a value as the output's last token did (it failed a
        check): those starting with its bytes up to the one at which the check failed. The
        checker is replayed to find that byte (only on a failure)."""
        if self._index is None or not output_token_ids:
            return []
        *before, last = output_token_ids
        checker = self._new_checker()
        checker.feed(self.text(before))
        data = self._token_bytes(last)
        for j in range(len(data)):
            if checker.feed(data[j : j + 1]) is not None:
                return self._index.starting_with(data[: j + 1]) if data[j] in _STRUCTURAL else []
        return []

    def text(self, token_ids: list[int]) -> bytes:
        """The bytes of ``token_ids``."""
        return b"".join(self._token_bytes(t) for t in token_ids)

    def head(self, output_token_ids: list[int], cut: int, start: int) -> bytes | None:
        """The bytes of the output from its token ``cut`` on up to byte ``start`` (where a value
        begins that is to be written again after them), or None if ``start`` lies before that
        token. The checker must stand where ``output_token_ids`` ends (``ends``)."""
        begin = self.ends[cut - 1] if cut else 0
        return self.text(output_token_ids[cut:])[: start - begin] if start >= begin else None

    def token_at(self, byte_offset: int) -> int:
        """Index of the output token holding byte ``byte_offset``."""
        return bisect.bisect_right(self.ends, byte_offset)

    def checker_copy(self) -> Checker:
        """A copy of the checker as it stands (for trying closings)."""
        return self.checker.copy()

    def bans_from(self, position: int, count: int) -> list[tuple[int, int]]:
        """(row offset, token id) of the bans at positions ``position .. position + count - 1``."""
        return [(p - position, t) for p in range(position, position + count) for t in self.bans.get(p, ())]

    def has_bans_from(self, position: int) -> bool:
        return any(p >= position for p in self.bans)

    def dead_end(self, position: int, bitmask: bytes) -> bool:
        """Whether every token ``bitmask`` (the grammar's, at ``position``) allows is banned there."""
        allowed = int.from_bytes(bitmask, "little")
        for t in self.bans.get(position, ()):
            allowed &= ~(1 << t)
        return allowed == 0

    def release(
        self, output_token_ids: list[int], new_logprobs: list[Any] | None, num_new: int, *, finished: bool
    ) -> tuple[list[int], list[Any] | None]:
        """After a step that left the output as ``output_token_ids``, its last ``num_new`` tokens
        (with ``new_logprobs``, one per sampled token, when asked) new: the tokens (and logprobs)
        that can now be delivered -- all when ``finished``, else those before the value a check
        may still reject."""
        n = len(output_token_ids)
        first_new = n - num_new
        for p in [p for p in self._logprobs if p >= first_new]:
            del self._logprobs[p]
        if new_logprobs is not None:
            for j, entry in enumerate(new_logprobs):
                self._logprobs[first_new + j] = entry
        upto = n
        if not finished:
            hold = self.checker.hold_from
            if hold is not None:
                upto = max(self.num_released, bisect.bisect_right(self.ends, hold))
        tokens = output_token_ids[self.num_released : upto]
        logprobs = None
        if new_logprobs is not None or self._logprobs:
            logprobs = [self._logprobs.pop(p) for p in range(self.num_released, upto) if p in self._logprobs]
        self.num_released = upto
        return tokens, logprobs
