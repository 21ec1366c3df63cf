"""Actor base: an object with private state, an inbox, and one ``run`` coroutine.

The :class:`~trillium.runtime.supervisor.Supervisor` starts actors with ``nursery.start`` in
dependency order, so ``run`` reports readiness through ``task_status.started()`` only once it can
take messages. Each actor declares what the supervisor does when ``run`` raises
(:class:`RestartPolicy`) and how the watchdog tells that it is stuck (:meth:`Actor.liveness`).
An actor cleans up after its own failure before the exception leaves ``run``: it answers (or
closes) whatever was waiting on it and leaves state that a new ``run`` can start from.
"""

from __future__ import annotations

import abc
import dataclasses
import time
from typing import Any, ClassVar

import trio


@dataclasses.dataclass(frozen=True)
class RestartPolicy:
    """What happens when an actor's ``run`` raises after it started.

    ``restart``: run it again after a back-off (``backoff_s``, doubling per failure in a row, at
    most ``max_backoff_s``), as long as it failed at most ``max_restarts`` times within the last
    ``window_s`` seconds; past that budget -- or with ``restart=False`` -- the supervisor stops the
    server with a non-zero exit code, so that an orchestrator restarts the process.
    """

    restart: bool = True
    max_restarts: int = 5
    window_s: float = 60.0
    backoff_s: float = 0.05
    max_backoff_s: float = 2.0


NEVER_RESTART = RestartPolicy(restart=False)


class Actor(abc.ABC):
    """Subclasses implement :meth:`run`; they share nothing with other actors but messages.

    Subclasses call ``super().__init__(inbox)`` and :meth:`took_message` whenever they take a
    message from ``inbox``; the watchdog reports an actor whose inbox holds messages that it has
    not taken for ``stall_after_s`` seconds.
    """

    name: ClassVar[str] = "actor"
    restart_policy: ClassVar[RestartPolicy] = RestartPolicy()
    # Whether ``run`` returns by itself once the server drains (the HTTP frontend): the supervisor
    # waits for it (up to its drain timeout) before cancelling the rest.
    finishes_on_drain: ClassVar[bool] = False
    stall_after_s: ClassVar[float] = 30.0

    def __init__(self, inbox: trio.MemoryReceiveChannel[Any] | None = None) -> None:
        self.inbox = inbox
        self.done = trio.Event()  # set by the supervisor once ``run`` has returned for good
        self.last_take = time.monotonic()

    @abc.abstractmethod
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; call ``task_status.started()`` once ready for messages.

        After a failure the supervisor calls ``run`` again on the same object (same inbox): what
        was queued meanwhile is served then."""

    def stop(self) -> None:
        """Ask :meth:`run` to return soon (the supervisor cancels it otherwise). Synchronous;
        idempotent. The base does nothing: cancellation is how most actors end."""
        return None

    def took_message(self) -> None:
        self.last_take = time.monotonic()

    def liveness(self, now: float) -> str | None:
        """Why this actor cannot make progress (the watchdog's reason for a 503), or None.
        The base checks nothing; the watchdog itself checks the inbox (see :meth:`took_message`)."""
        return None

    def inbox_backlog(self) -> int:
        """Messages waiting in the inbox (0 without one)."""
        return 0 if self.inbox is None else self.inbox.statistics().current_buffer_used


class Sink(Actor):
    """An actor that only receives (the metering actor): the supervisor starts it first and, once
    nothing can send to it any more, calls :meth:`stop` so that it flushes what is queued."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Make :meth:`run` write what is queued and return. Synchronous; idempotent."""
