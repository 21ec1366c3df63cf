"""Actor base: an object with private state, an inbox, and one ``run`` coroutine.

Actors are started with ``await nursery.start(actor.run)`` in dependency order, so that
``run`` reports readiness through ``task_status.started()`` only once it can take messages.
"""

from __future__ import annotations

import abc

import trio


class Actor(abc.ABC):
    """Subclasses implement :meth:`run`; they share nothing with other actors but messages."""

    name: str = "actor"

    @abc.abstractmethod
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; call ``task_status.started()`` once ready for messages."""


class Sink(Actor):
    """An actor that only receives (the metering actor): the supervisor starts it first and, once
    nothing can send to it any more, calls :meth:`stop` so that it flushes what is queued."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Make :meth:`run` write what is queued and return. Synchronous; idempotent."""
