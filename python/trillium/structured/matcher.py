"""One request's grammar state: advanced only with tokens the request actually keeps."""

from __future__ import annotations

import llguidance


class GrammarMatcher:
    """Wraps an ``llguidance.LLMatcher``. Not thread-safe: the scheduler advances it on the event
    loop between steps; the grammar thread reads it (fills its mask) only while a step runs."""

    __slots__ = ("_m",)

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self._m = matcher

    def accept(self, token_id: int) -> bool:
        """Advance by one sampled token. False (and the matcher is then in error) if the grammar
        does not allow it; EOS is allowed only where the grammar may end."""
        return self._m.consume_token(token_id)

    def validate(self, token_ids: list[int]) -> int:
        """How many of ``token_ids`` the grammar allows in a row from here (speculation's drafts
        are cut there); consumes nothing."""
        return self._m.validate_tokens(token_ids)

    def forced_tokens(self) -> list[int]:
        """Tokens the grammar admits as the only continuation from here (jump-forward), possibly
        empty. They are not consumed: :meth:`accept_forced` does that once the caller keeps them."""
        return self._m.compute_ff_tokens()

    def accept_forced(self, token_ids: list[int]) -> bool:
        return self._m.consume_tokens(token_ids)

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

    @property
    def ll_matcher(self) -> llguidance.LLMatcher:
        """The llguidance matcher, for the bitmask filler."""
        return self._m
