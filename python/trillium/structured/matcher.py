"""One request's grammar state: advanced only with tokens the request actually keeps."""

from __future__ import annotations

import json
from collections.abc import Callable

import llguidance

from trillium.structured.closer import MAX_CHARS, Closer, SearchBudget, string_state
from trillium.structured.guard import OutputGuard
from trillium.structured.value_checks import CheckNode
from trillium.structured.witness import Spent, WitnessFinder

# How llguidance words a per-token parser limit (LLParserLimits: max_items_in_row, step_max_items).
PARSER_LIMIT_SIGNS = ("max is", "TooComplex", "too complex")
MAX_WITNESSES = 32  # witnesses of one value a closing tries (each tokenized, closed and checked)


class GrammarMatcher:
    """Wraps an ``llguidance.LLMatcher``. Not thread-safe: the scheduler advances it on the event
    loop between steps; the grammar thread reads it (fills its mask) only while a step runs.

    ``guard`` (``structured.guard``) holds the value checks of schema keywords the grammar
    cannot express, the tokens banned after a failed check, and the output held back from the
    client until its checks pass. ``closer`` is set for JSON constraints: the scheduler closes such an output before its
    allowance runs out (:meth:`closing`); ``closing_length`` and ``closing_age`` are its
    bookkeeping (the last closing's length in tokens, -1 before the first or when none exists,
    and the steps since it was computed)."""

    __slots__ = ("_m", "_template", "_strings", "closer", "closing_age", "closing_length", "guard", "num_tokens")

    def __init__(
        self,
        matcher: llguidance.LLMatcher,
        closer: Closer | None = None,
        guard: OutputGuard | None = None,
        template: llguidance.LLMatcher | None = None,
    ) -> None:
        self._m = matcher
        self._template = template  # the compiled grammar's pristine matcher (start_over), or None
        self.closer = closer
        self.guard = guard  # value checks of keywords the grammar cannot express, or None
        self.num_tokens = 0  # tokens consumed (the output's length, as far as the grammar saw it)
        self.closing_length = -1
        self.closing_age = 0
        # With a closer: the JSON string state after each accepted token (closer.string_state),
        # so a closing knows whether it starts inside a string.
        self._strings: list[tuple[bool, bool]] = []

    def accept(self, token_id: int) -> bool:
        """Advance by one sampled token. False (and the matcher is then in error) if the grammar
        does not allow it; EOS is allowed only where the grammar may end."""
        ok = self._m.consume_token(token_id)
        self.num_tokens += ok
        if ok and self.closer is not None:
            self._track([token_id])
        return ok

    @property
    def dead_end(self) -> bool:
        """The last accepted token left the output where the grammar admits no continuation and
        the output is not complete: llguidance stops the matcher in error (its own limits, or a
        relaxed schema's branch it cannot finish), allowing only EOS. Such a token is to be
        taken back (:meth:`start_over`), never the output ended as if complete."""
        return self._m.is_error() or (self._m.is_stopped() and not self._m.is_accepting())

    def start_over(self, token_ids: list[int]) -> bool:
        """A fresh matcher advanced by ``token_ids``, in place of one at a dead end (which cannot
        roll back). False if there is no template or it refuses the tokens."""
        if self._template is None:
            return False
        m = self._template.deep_copy()
        if token_ids and not m.consume_tokens(token_ids):
            return False
        self._m = m
        self.num_tokens = len(token_ids)
        self._strings = []
        if self.closer is not None:
            self._track(token_ids)
        return True

    def validate(self, token_ids: list[int]) -> int:
        """How many of ``token_ids`` the grammar allows in a row from here (speculation's drafts
        are cut there); consumes nothing."""
        return self._m.validate_tokens(token_ids)

    def forced_tokens(self) -> list[int]:
        """Tokens the grammar admits as the only continuation from here (jump-forward), possibly
        empty. They are not consumed: :meth:`accept_forced` does that once the caller keeps them."""
        return self._m.compute_ff_tokens()

    def accept_forced(self, token_ids: list[int]) -> bool:
        ok = self._m.consume_tokens(token_ids)
        self.num_tokens += len(token_ids) if ok else 0
        if ok and self.closer is not None:
            self._track(token_ids)
        return ok

    def _track(self, token_ids: list[int]) -> None:
        assert self.closer is not None
        state = self._strings[-1] if self._strings else (False, False)
        for t in token_ids:
            state = string_state(state, self.closer.token_bytes(t))
            self._strings.append(state)

    def rollback(self, num_tokens: int) -> bool:
        """Forget the last ``num_tokens`` accepted tokens (the output was cut back). False if the
        matcher could not (it is in error: :attr:`error` says why)."""
        if num_tokens <= 0:
            return True
        if self._m.is_error() or not self._m.rollback(num_tokens):
            return False
        self.num_tokens -= num_tokens
        del self._strings[len(self._strings) - num_tokens :]
        return True

    def closing(
        self, variant: int = 0, *, checked: bool = False, room: int | None = None, budget: SearchBudget | None = None
    ) -> list[int] | None:
        """The shortest tokens found that complete the output from here ([] if it is complete),
        or None (no closer, or none found). Consumes nothing. ``variant``: see ``Closer.closing``;
        ``checked``: the closing must also pass the guard's value checks (its checker must
        stand where the output does), within ``budget`` (``Closer.closing``); ``room``:
        the tokens it may take (the search stops at 4 characters a token: a longer closing could
        not fit)."""
        if self.closer is None:
            return None
        checker = self.guard.checker_copy() if checked and self.guard is not None else None
        return self.closer.closing(self._m, _limit(room), variant, checker, self._in_string, budget)

    def closing_after(self, text: bytes, room: int | None = None) -> tuple[list[int], list[int]] | None:
        """The tokens of ``text`` and then of the usual closing, as the grammar accepts them from
        here (``Closer.closing_after``), or None. Consumes nothing."""
        if self.closer is None:
            return None
        return self.closer.closing_after(self._m, text, _limit(room), self._in_string)

    @property
    def _in_string(self) -> bool:
        """The output so far ends inside a JSON string."""
        return self._strings[-1][0] if self._strings else False

    def witness_closing(
        self,
        node: CheckNode,
        head: bytes,
        room: int,
        budget: SearchBudget,
        accepts: Callable[[list[int]], bool],
        tries: int = MAX_WITNESSES,
        *,
        close: bool = True,
    ) -> list[int] | None:
        """A closing that writes the open value whose checks are ``node``'s again, as a witness of
        its subschemas (``structured.witness``), after ``head`` (the bytes between where the
        output stands and that value's start), then closes the rest as usual: the first within
        ``room`` tokens that ``accepts`` (the whole output's checks) takes, trying at most
        ``tries`` witnesses within ``budget``; None otherwise. ``close=False``: only the tokens
        of ``head`` and the witness (the output goes on after it), still only where the closing
        after it fits. Consumes nothing."""
        ctx = node.context
        finder = WitnessFinder(ctx.validator, ctx.specification, ctx.legacy_ref, lambda: budget.spent)
        try:
            for i, value in enumerate(finder.witnesses(node.schemas)):
                if i == tries:
                    break
                text = head + json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
                parts = self.closing_after(text, room)
                if parts is None or len(parts[0]) + len(parts[1]) > room:
                    continue
                closing = parts[0] + parts[1] if close else parts[0]
                if accepts(closing):
                    return closing
        except Spent:
            pass
        return None

    def bitmask(self) -> bytes:
        """The grammar's allowed tokens from here, one bit per token id (little-endian)."""
        return self._m.compute_bitmask()

    @property
    def is_terminated(self) -> bool:
        """The grammar is complete and admits nothing more (not even whitespace): stop now."""
        return self._m.is_stopped()

    @property
    def is_accepting(self) -> bool:
        """The output so far is a complete match (EOS is allowed)."""
        return self._m.is_accepting()

    @property
    def error(self) -> str:
        return self._m.get_error()

    def rejection(self, token_id: int) -> str:
        """Why :meth:`accept` refused ``token_id``, for the request's error. llguidance bounds
        its parser's work per token; an output nested or ambiguous past that bound is refused
        although the mask allowed the token, which is no fault of the request's sampling."""
        error = self.error
        if any(sign in error for sign in PARSER_LIMIT_SIGNS):
            return f"the output grew past what the grammar's parser follows (a per-token limit) at token {token_id}: {error}"
        return f"the grammar rejected token {token_id}: {error}"

    @property
    def ll_matcher(self) -> llguidance.LLMatcher:
        """The llguidance matcher, for the bitmask filler."""
        return self._m


def _limit(room: int | None) -> int:
    """The characters a closing may take within ``room`` tokens (at most 4 a token: a longer one
    could not fit)."""
    return MAX_CHARS if room is None else 4 * room + 16
