"""Snapshot: the latest value one actor publishes, for anyone to read.

A one-slot "watch" channel: the owning actor replaces the value (an immutable message) whenever
it changes; readers (``/stats``, Prometheus scrapes) take whatever is latest without calling
into the actor or waiting for it. Publishing never blocks and readers never see a half-written
value, because the value is replaced whole. Single event loop: no lock needed.
"""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")


class Snapshot(Generic[T]):
    """Holds the last published value; starts with ``initial``."""

    __slots__ = ("_value",)

    def __init__(self, initial: T) -> None:
        self._value = initial

    def publish(self, value: T) -> None:
        """Replace the value (the owner only). ``value`` must not be mutated afterwards."""
        self._value = value

    @property
    def latest(self) -> T:
        return self._value
