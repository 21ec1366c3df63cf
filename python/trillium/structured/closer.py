"""The shortest way to close a constrained output from where its grammar stands.

A request whose ``max_tokens`` runs out in the middle of a JSON value would return text that does
not parse. Before that happens the scheduler appends a *closing*: tokens the grammar accepts
that bring it to an accepting state (``"]}`` for a half-written string in an array in an
object, plus whatever required properties are still missing, each with its shortest value).

The closing is built one character at a time on a copy of the request's matcher: first the
bytes the grammar forces (``compute_ff_tokens``), otherwise the first character of
:data:`PREFERENCE` the grammar allows — closers first (``"``, ``]``, ``}``), then the separator
that leads to a missing property or item, then the shortest values (``0``, ``""``, ``null``,
``[]``, ``{}``). Closing the innermost open value as soon as the grammar allows it is what makes
the result short: every character either ends a value or is one the grammar demands. After a
character was picked :data:`MAX_REPEAT` times in a row, the pick is the first allowed character
after which the grammar allows something else, so that a pattern such as ``[a-z]+/[0-9]``
(whose strings cannot close after letters alone) still ends.
The characters are then re-tokenized (BPE merges ``"]}`` into fewer tokens) and the shorter of
the two token sequences the grammar accepts is the closing.

Cost: one ``validate_tokens`` per candidate character, ~5 µs each; a 40-character closing takes
~0.2 ms. The scheduler calls it only when a request's remaining allowance comes near its last
closing length (``scheduler.policy``), not every step.
"""

from __future__ import annotations

import time

import llguidance

from trillium.structured.call_checks import Checker
from trillium.structured.value_checks import checks_run

# Single characters, most preferred first (see the module docstring). The tail is every other
# printable ASCII character, for grammars that are not JSON.
PREFERENCE = '"a]},0n-ft[{1:'
MAX_REPEAT = 4
PROGRESS_CANDIDATES = 32  # allowed characters tried for progress (each costs a mask, ~20 µs)
NUM_VARIANTS = 8
MAX_CHARS = 1024  # a closing longer than this is not attempted (no allowance is that large)


class SearchBudget:
    """What a checked closing search may still spend: value checks (counted with the memoized
    ones, so where it stops does not depend on other requests) and, since one check of a
    recursive schema can take milliseconds, seconds (the search runs on the event loop)."""

    def __init__(self, max_checks: int, seconds: float) -> None:
        self._stop_checks = checks_run() + max_checks
        self._deadline = time.perf_counter() + seconds

    @property
    def spent(self) -> bool:
        return checks_run() >= self._stop_checks or time.perf_counter() >= self._deadline


class Closer:
    """Builds closings for matchers of one tokenizer. Immutable and thread-safe after construction."""

    def __init__(self, ll_tokenizer: llguidance.LLTokenizer) -> None:
        self._ll_tokenizer = ll_tokenizer
        order = PREFERENCE + "".join(chr(c) for c in range(32, 127) if chr(c) not in PREFERENCE)
        # Token ids of the single characters, most preferred first; variant k (for outputs whose
        # value checks rejected the usual closing, e.g. a duplicate 0 under uniqueItems) puts the
        # digit k and the k-th letter first, so that the values it completes or invents differ.
        # Outside a string (``in_string`` False) a ``}`` or ``]`` that the grammar allows comes
        # before ``"``: it ends the value instead of starting an optional key.
        self._alphabets: dict[tuple[int, bool], list[int]] = {}
        for k in range(NUM_VARIANTS):
            lead = str(k) + chr(ord("a") + k)
            chars = order if k == 0 else lead + "".join(c for c in order if c not in lead)
            self._alphabets[k, True] = self._single_tokens(chars)
            self._alphabets[k, False] = self._single_tokens("]}" + chars.replace("]", "").replace("}", ""))

    def token_bytes(self, token_id: int) -> bytes:
        return self._ll_tokenizer.decode_bytes([token_id])

    def _single_tokens(self, chars: str) -> list[int]:
        out = []
        for ch in chars:
            ids = self._ll_tokenizer.tokenize_str(ch)
            if len(ids) == 1 and self._ll_tokenizer.decode_str(ids) == ch:
                out.append(ids[0])
        return out

    def closing(
        self,
        matcher: llguidance.LLMatcher,
        limit: int = MAX_CHARS,
        variant: int = 0,
        checker: Checker | None = None,
        in_string: bool = False,
        budget: SearchBudget | None = None,
    ) -> list[int] | None:
        """Tokens that take ``matcher`` (not modified) to a state where the output is complete, or
        None when none was found within ``limit`` characters. [] if it is complete already.
        ``variant`` (0 .. NUM_VARIANTS - 1) picks other characters for the values it invents.
        ``checker`` (the request's value checks, as they stand; it is consumed): each character
        must also pass them -- a ``}`` that would leave out a property an ``if``/``then`` needs
        gives way to ``,`` -- and the closed output too; ``budget``: None once it is spent (a
        checked search over a recursive schema could otherwise hold the event loop for
        seconds). ``in_string``: the output so far ends inside a JSON string
        (``string_state``); False at the start of an output."""
        if matcher.is_error():
            return None
        if matcher.is_accepting():
            return [] if checker is None or checker.finish() is None else None
        m = matcher.deep_copy()
        chars: list[int] = []  # the closing as single-character (or forced) tokens
        last, repeats = -1, 0
        state = (in_string, False)  # (inside a string, after a backslash)
        while len(chars) < limit:
            if m.is_accepting():
                break
            alphabet = self._alphabets[variant, state[0]]
            forced = m.compute_ff_tokens()
            if forced:
                if not m.consume_tokens(forced):
                    return None
                data = self._ll_tokenizer.decode_bytes(forced)
                if checker is not None and checker.feed(data) is not None:
                    return None
                state = string_state(state, data)
                chars.extend(forced)
                last, repeats = -1, 0
                continue
            if checker is not None:
                choice, checker = self._pick_checked(m, alphabet, checker, budget)
            elif repeats >= MAX_REPEAT:
                choice = self._pick_progress(m, alphabet)
            else:
                choice = self._pick(m, alphabet)
            if choice < 0 or not m.consume_token(choice):
                return None
            state = string_state(state, self._ll_tokenizer.decode_bytes([choice]))
            chars.append(choice)
            # After a progress check the count starts over: at most one check per MAX_REPEAT
            # characters where every character leads to the same state (a long minLength).
            repeats = repeats + 1 if choice == last and repeats < MAX_REPEAT else 1
            last = choice
        else:
            return None
        if checker is not None and checker.finish() is not None:
            return None
        merged = self._ll_tokenizer.tokenize_bytes(self._ll_tokenizer.decode_bytes(chars))
        if len(merged) < len(chars) and _completes(matcher, merged):
            return merged
        return chars

    def _pick_checked(
        self, m: llguidance.LLMatcher, alphabet: list[int], checker: Checker, budget: SearchBudget | None
    ) -> tuple[int, Checker]:
        """The first allowed character that the value checks also pass, and the checker after it;
        -1 if none does, or once ``budget`` is spent."""
        for token in alphabet:
            if budget is not None and budget.spent:
                break
            if m.validate_tokens([token]) != 1:
                continue
            trial = checker.copy()
            if trial.feed(self._ll_tokenizer.decode_bytes([token])) is None:
                return token, trial
        return -1, checker

    @staticmethod
    def _pick(m: llguidance.LLMatcher, alphabet: list[int]) -> int:
        for token in alphabet:
            if m.validate_tokens([token]) == 1:
                return token
        return -1

    @staticmethod
    def _pick_progress(m: llguidance.LLMatcher, alphabet: list[int]) -> int:
        """After a character repeated: the first allowed one after which the grammar allows a
        different set of tokens (``/`` in ``[a-z]+/``: letters lead back to the same state), else
        the first allowed one (a ``minLength`` string: every letter is progress)."""
        here = m.compute_bitmask()
        first, tried = -1, 0
        for token in alphabet:
            if tried == PROGRESS_CANDIDATES:
                break
            if m.validate_tokens([token]) != 1:
                continue
            tried += 1
            if first < 0:
                first = token
            # A copy per candidate, not consume + rollback: llguidance's rollback leaves state
            # behind that can make a later consume exceed its parser limits (ParserTooComplex).
            trial = m.deep_copy()
            if trial.consume_token(token) and trial.compute_bitmask() != here:
                return token
        return first


def string_state(state: tuple[bool, bool], data: bytes) -> tuple[bool, bool]:
    """(inside a JSON string, after a backslash in it) once ``data`` follows ``state``."""
    in_string, escaped = state
    for byte in data:
        if escaped:
            escaped = False
        elif in_string and byte == 0x5C:  # backslash
            escaped = True
        elif byte == 0x22:  # quote
            in_string = not in_string
    return in_string, escaped


def _completes(matcher: llguidance.LLMatcher, tokens: list[int]) -> bool:
    if matcher.validate_tokens(tokens) != len(tokens):
        return False
    m = matcher.deep_copy()
    return m.consume_tokens(tokens) and m.is_accepting()
