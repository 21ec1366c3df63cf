"""Incremental detokenization: ids arrive a few at a time, text leaves with no broken characters.

Decoding each token alone is wrong (byte-level tokens can split a UTF-8 character; SentencePiece
decoders strip a leading space of the first token), and re-decoding everything is O(n) per step.
We decode a short window instead and emit the difference:

    ids:   ... | prefix_offset ........ read_offset ........ len(ids)
                 |<- already emitted ->|<- not yet emitted ->|
    prefix_text = decode(ids[prefix_offset:read_offset])
    new_text    = decode(ids[prefix_offset:])          -> emit new_text[len(prefix_text):]

The window re-includes the last emitted tokens so context-dependent decoding (leading-space
stripping) cancels out in the difference. Text ending in U+FFFD is held back: it is (almost
always) an incomplete UTF-8 sequence that the next token completes.
"""

from __future__ import annotations

from trillium.tokenizer.tokenizer import Tokenizer

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Per-request streaming decoder. Not thread-safe; one instance per request.

    Contract: ``"".join(outputs of add(...)) + flush()`` equals
    ``tokenizer.decode(all_ids, skip_special_tokens)``, and no ``add`` output ends with an
    incomplete character (a U+FFFD from a partial byte sequence).
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    @property
    def token_ids(self) -> list[int]:
        """Every id added so far (do not mutate)."""
        return self._ids

    def add(self, new_ids: list[int]) -> str:
        """Append ids; return the text they complete (possibly "")."""
        self._ids.extend(new_ids)
        if not new_ids:
            return ""
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        new_text = self._decode(self._prefix_offset, len(self._ids))
        if len(new_text) <= len(prefix_text) or new_text.endswith(_REPLACEMENT):
            return ""  # nothing new, or a character still incomplete: wait for more ids
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :]

    def flush(self) -> str:
        """Return whatever is held back (an unfinished sequence decodes to U+FFFD) and reset the window."""
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        new_text = self._decode(self._prefix_offset, len(self._ids))
        self._prefix_offset = self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :]

    def _decode(self, start: int, end: int) -> str:
        if start >= end:
            return ""
        return self._tokenizer.decode(self._ids[start:end], skip_special_tokens=self._skip)
