"""StepThread: the one thread that touches the model -- loading, the KV pool, and every step.

Why one thread for all of it: the compiled kernels and torch parallelise with OpenMP, and libgomp
keeps a separate team of worker threads for every thread that opens a parallel region. With two
teams alive (say, the model loaded on the main thread and steps run on a worker), libgomp counts
more busy threads than cores and cuts its spin-wait to ~100 iterations, so each of the ~300
parallel regions of a decode step pays a futex wake-up: a batch-1 step measured 1.5x slower
(22.7 ms vs 14.5 ms on 2 cores). ``trio.to_thread`` would also hand steps to whichever cached
thread is idle, creating new teams over time. Running everything here keeps exactly one team.

Calls run one at a time, in submission order. ``call`` blocks the calling (non-trio) thread;
``run`` awaits from trio and is shielded from cancellation (a step is never abandoned midway:
its KV writes and the scheduler's bookkeeping must agree).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import outcome
import trio

T = TypeVar("T")

_STOP = object()


class StepThread:
    """A daemon thread running submitted calls in order; :meth:`close` ends it."""

    def __init__(self, name: str = "trillium-step") -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def ident(self) -> int | None:
        """The thread's identifier (tests check that every step ran here)."""
        return self._thread.ident

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the thread and return its result (or raise its exception).
        From the step thread itself it runs inline (a nested call would wait on itself)."""
        if threading.get_ident() == self._thread.ident:
            return fn(*args)
        done = threading.Event()
        box: list[outcome.Outcome[T]] = []

        def job() -> None:
            box.append(outcome.capture(fn, *args))
            done.set()

        self._submit(job)
        done.wait()
        return box[0].unwrap()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``call`` for trio code: the event loop keeps running while ``fn`` runs. Not cancellable
        (the shielded wait returns when ``fn`` has finished)."""
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()
        box: list[outcome.Outcome[T]] = []

        def job() -> None:
            box.append(outcome.capture(fn, *args))
            try:
                token.run_sync_soon(done.set)
            except trio.RunFinishedError:
                pass  # the trio run that asked is gone; nobody waits for the result

        self._submit(job)
        with trio.CancelScope(shield=True):
            await done.wait()
        return box[0].unwrap()

    def close(self, timeout: float = 5.0) -> None:
        """Finish the queued calls, then end the thread, waiting up to ``timeout`` seconds for it
        (a thread still inside a native kernel when the interpreter exits can abort the process).
        Idempotent."""
        if not self._closed:
            self._closed = True
            self._jobs.put(_STOP)
        if threading.get_ident() != self._thread.ident:
            self._thread.join(timeout)

    def _submit(self, job: Callable[[], None]) -> None:
        if self._closed:
            raise RuntimeError("the step thread is closed")
        self._jobs.put(job)

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is _STOP:
                return
            job()
