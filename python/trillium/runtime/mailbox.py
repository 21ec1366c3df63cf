"""A single-consumer mailbox that coalesces deliveries.

The producer (the scheduler, once per step) must never block on a slow client, and a client
that falls behind should receive several tokens in one SSE event instead of a growing queue.
``put`` therefore merges into whatever the consumer has not taken yet, using a caller-supplied
``merge`` function; memory stays bounded by the request's own output.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

import trio

T = TypeVar("T")


class MailboxClosed(Exception):
    """Raised by :meth:`Mailbox.get` after the producer closed the mailbox and it is drained."""


class Mailbox(Generic[T]):
    """Coalescing one-slot buffer between the event-loop producer and one consumer task.

    Not thread-safe: both sides run on the Trio event loop.
    """

    def __init__(self, merge: Callable[[T, T], T]) -> None:
        self._merge = merge
        self._item: T | None = None
        self._event = trio.Event()
        self._producer_closed = False
        self.consumer_closed = False  # set when the consumer went away (client disconnect)

    def put(self, item: T) -> None:
        """Deliver ``item`` without blocking, merging it into an undelivered item if any."""
        if self.consumer_closed:
            return
        self._item = item if self._item is None else self._merge(self._item, item)
        self._event.set()

    def close(self) -> None:
        """Producer side: no more items will follow."""
        self._producer_closed = True
        self._event.set()

    def close_consumer(self) -> None:
        """Consumer side: stop accepting items; the producer should abort the work behind it."""
        self.consumer_closed = True
        self._item = None

    async def get(self) -> T:
        """Wait for the next (possibly merged) item; raises :class:`MailboxClosed` when done."""
        while self._item is None:
            if self._producer_closed:
                raise MailboxClosed
            await self._event.wait()
            self._event = trio.Event()
        item, self._item = self._item, None
        return item
