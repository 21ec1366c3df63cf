"""Fault injection, for tests: make a named actor raise or hang at a named point.

Actors call :func:`hit` at a few points (``"tokenizer.message"``, ``"grammar.message"``,
``"metering.write"``, ``"scheduler.step"``, ``"runner.execute"``). Nothing is armed in
production, where a hit costs one truthiness check of an empty dict. Tests arm points in-process
with :func:`arm`, or -- against a live server started with ``TRILLIUM_FAULT_INJECTION=1`` -- through
``POST /debug/faults`` (see ``trillium.server.app``).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Literal

import trio

Action = Literal["raise", "hang"]

# The one environment variable that turns the ``/debug/faults`` route on.
ENABLE_ENV = "TRILLIUM_FAULT_INJECTION"


class InjectedFault(RuntimeError):
    """What an armed ``raise`` point raises."""


@dataclasses.dataclass
class _Fault:
    action: Action
    times: int  # hits left
    hang_s: float


_armed: dict[str, _Fault] = {}
_lock = threading.Lock()  # points are hit from the event loop and from worker threads
_release = threading.Event()  # set by :func:`clear`: ends every hang now


def arm(point: str, action: Action = "raise", *, times: int = 1, hang_s: float = 3600.0) -> None:
    """The next ``times`` hits of ``point`` raise :class:`InjectedFault` or block for ``hang_s``
    seconds (the calling thread: the event loop or a worker) until :func:`clear`."""
    if action not in ("raise", "hang"):
        raise ValueError(f"unknown fault action {action!r}")
    with _lock:
        _release.clear()
        _armed[point] = _Fault(action, times, hang_s)


def clear() -> None:
    """Disarm every point and end every hang."""
    with _lock:
        _armed.clear()
        _release.set()


def hit(point: str) -> None:
    """A fault point in a worker thread: does nothing unless ``point`` is armed; a hang blocks
    the thread."""
    fault = _take(point)
    if fault is not None and fault.action == "hang":
        _release.wait(fault.hang_s)


async def ahit(point: str) -> None:
    """A fault point on the event loop: a hang blocks only the calling task."""
    fault = _take(point)
    if fault is not None and fault.action == "hang":
        await trio.to_thread.run_sync(_release.wait, fault.hang_s, abandon_on_cancel=True)


def _take(point: str) -> _Fault | None:
    """Count one hit of ``point``; raises for an armed ``raise``, returns an armed hang."""
    if not _armed:
        return None
    with _lock:
        fault = _armed.get(point)
        if fault is None:
            return None
        fault.times -= 1
        if fault.times <= 0:
            del _armed[point]
    if fault.action == "raise":
        raise InjectedFault(f"injected fault at {point}")
    return fault
