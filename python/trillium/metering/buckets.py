"""Token buckets: ``capacity`` units that refill continuously at ``capacity`` per ``period``.

A limit of "N per minute" is a bucket of N that refills N/60 per second: a tenant may burst up
to N at once, and sustains N per minute. Not thread-safe (the frontend's event loop owns them).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable


class TokenBucket:
    def __init__(self, capacity: int, period: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self.rate = capacity / period  # units per second
        self._clock = clock
        self._level = float(capacity)  # starts full
        self._stamp = clock()

    @property
    def level(self) -> float:
        """Units available now."""
        now = self._clock()
        self._level = min(self.capacity, self._level + (now - self._stamp) * self.rate)
        self._stamp = now
        return self._level

    def try_take(self, n: int) -> float:
        """Take ``n`` units if available and return 0.0; otherwise take nothing and return the
        seconds until ``n`` will be available (``math.inf`` if ``n`` exceeds the capacity)."""
        if n > self.capacity:
            return math.inf
        level = self.level
        if level >= n:
            self._level = level - n
            return 0.0
        return (n - level) / self.rate

    def refund(self, n: int) -> None:
        """Give back ``n`` units taken earlier and not used (never above the capacity)."""
        self._level = min(self.capacity, self.level + n)
