"""Stop strings on streamed text.

Text that might be the start of a stop string is held back until it is known not to be;
the stop string itself is never returned.
"""

from __future__ import annotations


class StopStringMatcher:
    """Feed detokenized text pieces; get back the text that is safe to emit."""

    def __init__(self, stop: list[str]) -> None:
        self.stop = [s for s in stop if s]
        self._held = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string found (the earliest in the text)

    def feed(self, text: str) -> str:
        """Returns the emittable part of ``held + text``; sets ``stopped`` on a match."""
        if self.stopped:
            return ""
        if not self.stop:
            return text
        buf = self._held + text
        first, self.matched = min(((i, s) for s in self.stop if (i := buf.find(s)) >= 0), default=(-1, None))
        if first >= 0:
            self.stopped = True
            self._held = ""
            return buf[:first]
        keep = self._longest_partial_suffix(buf)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """At the end of generation, held text was not a stop string after all."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _longest_partial_suffix(self, buf: str) -> int:
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(buf)), best, -1):
                if buf.endswith(s[:n]):
                    best = n
                    break
        return best
