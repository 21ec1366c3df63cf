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
after which the value may end (a key that must match ``b$`` ends after a ``b``), else the first
after which the grammar allows something else, so that a pattern such as ``[a-z]+/[0-9]``
(whose strings cannot close after letters alone) still ends.
The characters are then re-tokenized (BPE merges ``"]}`` into fewer tokens) and the shorter of
the two token sequences the grammar accepts is the closing.

Cost: one ``validate_tokens`` per candidate character, ~5 µs each; a 40-character closing takes
~0.2 ms. The scheduler calls it only when a request's remaining allowance comes near its last
closing length (``structured.controller``), not every step.
"""

from __future__ import annotations

import dataclasses
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
_STRUCTURAL = frozenset(b'"]},:')  # bytes that complete a JSON value or key
MAX_BACKTRACKS = 64  # characters a checked closing may take back (each then tries another)
MAX_CHARS = 1024  # a closing longer than this is not attempted (no allowance is that large)


class SearchBudget:
    """What a checked closing search may still spend: value checks (counted with the memoized
    ones, so where it stops does not depend on other requests) and, since one check of a
    recursive schema can take milliseconds, seconds (the whole step waits for the search)."""

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
        # The checked search's: the other digits right after the first, so that a value a check
        # rejects (a duplicate 0) becomes the next short one (1), not a longer -1 or 10.
        digits = self._single_tokens("0123456789")
        self._checked_alphabets = {key: _digits_together(a, digits) for key, a in self._alphabets.items()}
        # What ends the value being written: a string's quote, or (outside strings) a closer.
        self._enders = {True: self._single_tokens('"'), False: self._single_tokens("]},")}
        self._backslash = self._single_tokens("\\")[0]

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
        checked search over a recursive schema could otherwise hold the step for
        seconds). ``in_string``: the output so far ends inside a JSON string
        (``string_state``); False at the start of an output."""
        if matcher.is_error():
            return None
        if matcher.is_accepting():
            return [] if checker is None or checker.finish() is None else None
        if checker is not None:
            return self._checked_closing(matcher, limit, variant, checker, in_string, budget)
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
                state = string_state(state, self._ll_tokenizer.decode_bytes(forced))
                chars.extend(forced)
                last, repeats = -1, 0
                continue
            choice = self._pick_progress(m, alphabet, state[0]) if repeats >= MAX_REPEAT else self._pick(m, alphabet)
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
        return self._merged(matcher, chars)

    def closing_after(
        self, matcher: llguidance.LLMatcher, text: bytes, limit: int = MAX_CHARS, in_string: bool = False
    ) -> tuple[list[int], list[int]] | None:
        """``text`` tokenized, and the usual closing from after it: the tokens that take
        ``matcher`` (not modified) to a complete output by way of ``text`` -- a witness of an
        open value's subschemas, written from that value's start (``structured.witness``) -- in
        two parts, or None if the grammar refuses ``text`` or no closing follows it within
        ``limit`` characters. ``in_string``: where ``matcher`` stands, as for :meth:`closing`."""
        tokens = self._ll_tokenizer.tokenize_bytes(text)
        if matcher.is_error() or matcher.validate_tokens(tokens) != len(tokens):
            return None
        m = matcher.deep_copy()
        if not m.consume_tokens(tokens):
            return None
        after = string_state((in_string, False), text)[0]
        rest = self.closing(m, max(limit - len(text), 0), in_string=after)
        return None if rest is None else (tokens, rest)

    def _merged(self, matcher: llguidance.LLMatcher, chars: list[int]) -> list[int]:
        """``chars`` re-tokenized when that is shorter and the grammar accepts it (BPE merges
        ``"]}`` into fewer tokens)."""
        merged = self._ll_tokenizer.tokenize_bytes(self._ll_tokenizer.decode_bytes(chars))
        if len(merged) < len(chars) and _completes(matcher, merged):
            return merged
        return chars

    def _checked_closing(
        self,
        matcher: llguidance.LLMatcher,
        limit: int,
        variant: int,
        checker: Checker,
        in_string: bool,
        budget: SearchBudget | None,
    ) -> list[int] | None:
        """``closing`` under value checks: the same preference order, each character also
        passing the checks, and a depth-first search over the characters where the first
        choice leads nowhere -- ``[0,-1,`` under ``uniqueItems`` must not close with a ``0``,
        and once ``0`` is written no digit may follow it, so the search steps back and tries
        ``1``. Once a character that would complete a value (one with ``"`` ``]`` ``}`` ``,``
        ``:``) fails a check, the characters that would only extend that value are not tried
        there: ``[0,1,`` then ``0,`` fails, and the search goes back to try ``2`` rather than
        ``10`` -- depth-first alone would try every longer number before changing a digit.
        Bounded by ``budget``, ``limit`` characters and :data:`MAX_BACKTRACKS`."""
        # One frame per character placed: the state before it and the next alternative to try.
        frames: list[_Frame] = []
        m, state, repeats, last = matcher.deep_copy(), (in_string, False), 0, -1
        chars: list[int] = []
        start, backtracks = 0, 0  # where in this position's alphabet to resume
        resumed_failed = False  # a completing character failed there before ``start``
        while True:
            if budget is not None and budget.spent:
                return None
            placed = False
            if m.is_accepting():
                if checker.copy().finish() is None:
                    return self._merged(matcher, chars)
            elif len(chars) < limit:
                forced = m.compute_ff_tokens() if start == 0 else []
                if forced:
                    # (On failure the dead end below restores m and checker from a frame.)
                    before = _Frame(m.deep_copy(), checker.copy(), state, len(chars), -1, repeats, last, False)
                    data = self._ll_tokenizer.decode_bytes(forced)
                    if m.consume_tokens(forced) and checker.feed(data) is None:
                        frames.append(before)
                        state = string_state(state, data)
                        chars.extend(forced)
                        repeats, last, placed = 0, -1, True
                else:
                    alphabet = self._checked_alphabets[variant, state[0]]
                    if repeats >= MAX_REPEAT:  # (see ``_pick_progress``): the way out first
                        way_out = self._pick_progress(m, alphabet, state[0])
                        alphabet = [way_out, *(t for t in alphabet if t != way_out)] if way_out >= 0 else alphabet
                    completer_failed = resumed_failed
                    for i in range(start, len(alphabet)):
                        token = alphabet[i]
                        data = self._ll_tokenizer.decode_bytes([token])
                        ends_value = not _STRUCTURAL.isdisjoint(data)
                        if (completer_failed and not ends_value) or m.validate_tokens([token]) != 1:
                            continue
                        trial = checker.copy()
                        if trial.feed(data) is not None:
                            completer_failed = completer_failed or ends_value
                            continue
                        frames.append(
                            _Frame(m.deep_copy(), checker, state, len(chars), i + 1, repeats, last, completer_failed)
                        )
                        if not m.consume_token(token):
                            return None
                        checker, state = trial, string_state(state, data)
                        chars.append(token)
                        repeats = repeats + 1 if token == last and repeats < MAX_REPEAT else 1
                        last, placed = token, True
                        break
            if placed:
                start, resumed_failed = 0, False
                continue
            # A dead end: back to the last character that has an alternative left.
            while frames and frames[-1].next_choice < 0:
                frames.pop()
            backtracks += 1
            if not frames or backtracks > MAX_BACKTRACKS:
                return None
            frame = frames.pop()
            m, checker, state, repeats, last = frame.matcher, frame.checker, frame.state, frame.repeats, frame.last
            del chars[frame.num_chars :]
            start, resumed_failed = frame.next_choice, frame.completer_failed

    @staticmethod
    def _pick(m: llguidance.LLMatcher, alphabet: list[int]) -> int:
        for token in alphabet:
            if m.validate_tokens([token]) == 1:
                return token
        return -1

    def _pick_progress(self, m: llguidance.LLMatcher, alphabet: list[int], in_string: bool) -> int:
        """After a character repeated: the first allowed one after which the value can end
        (``b`` in a key under ``patternProperties: {"b$": ...}`` with no other properties
        allowed: ``"`` may follow it), else the first after which the grammar allows a
        different set of tokens (``/`` in ``[a-z]+/``: letters lead back to the same state), else
        the first allowed one (a ``minLength`` string: every letter is progress)."""
        # validate_tokens of two tokens costs what one does (~5 µs): every character is tried
        # for an ending, the costlier mask comparison below only for the first few allowed. (After
        # a backslash a quote is part of the string.)
        for token in alphabet:
            if token != self._backslash and any(m.validate_tokens([token, e]) == 2 for e in self._enders[in_string]):
                return token
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


@dataclasses.dataclass(slots=True)
class _Frame:
    """A character (or forced run) the checked closing search placed: the state before it, and
    where in that position's alphabet to go on (-1: a forced run, no alternative)."""

    matcher: llguidance.LLMatcher
    checker: Checker
    state: tuple[bool, bool]
    num_chars: int
    next_choice: int
    repeats: int
    last: int
    completer_failed: bool  # a value-completing character failed here before next_choice


def _digits_together(alphabet: list[int], digits: list[int]) -> list[int]:
    """``alphabet`` with every digit moved to where its first digit is, that one first and the
    rest in numeric order."""
    out: list[int] = []
    for token in alphabet:
        if token not in digits:
            out.append(token)
        elif not any(t in digits for t in out):
            out += [token, *(d for d in digits if d != token)]
    return out


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
