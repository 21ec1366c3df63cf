"""Supervisor: starts actors in dependency order and shuts them down gracefully.

Shutdown (SIGINT/SIGTERM or :meth:`Supervisor.request_shutdown`): the ``draining`` event is
set first, so the frontend stops accepting work and in-flight streams may finish; after
``drain_timeout`` seconds (or at a second signal) everything left is cancelled. *Sinks* (actors that only receive,
such as the metering actor) start first and stop last: once every other actor has returned,
so that nothing can send to them any more, each sink's ``stop()`` makes it flush and return.
"""

from __future__ import annotations

import logging
import signal

import trio

from trillium.runtime.actor import Actor, Sink

log = logging.getLogger("trillium.runtime")


class Supervisor:
    """Owns the nursery that all actors live in."""

    def __init__(
        self,
        actors: list[Actor],
        *,
        draining: trio.Event | None = None,
        drain_timeout: float = 10.0,
        sinks: list[Sink] | None = None,
    ) -> None:
        self.actors = actors
        self.sinks = sinks or []  # each has a synchronous ``stop()``: flush what is queued, then return
        self.drain_timeout = drain_timeout
        self.draining = draining if draining is not None else trio.Event()
        self._actors_scope: trio.CancelScope | None = None

    def request_shutdown(self) -> None:
        self.draining.set()

    async def run(
        self, *, handle_signals: bool = True, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run every actor until shutdown is requested, then drain and cancel; then stop the sinks."""
        async with trio.open_nursery() as sink_nursery:
            for sink in self.sinks:
                log.debug("starting %s", sink.name)
                await sink_nursery.start(sink.run)
            try:
                await self._run_actors(handle_signals, task_status)
            finally:
                for sink in reversed(self.sinks):
                    sink.stop()

    async def _run_actors(self, handle_signals: bool, task_status: trio.TaskStatus[None]) -> None:
        async with trio.open_nursery() as nursery:
            self._actors_scope = nursery.cancel_scope
            for actor in self.actors:
                log.debug("starting %s", actor.name)
                await nursery.start(actor.run)
            if handle_signals:
                nursery.start_soon(self._watch_signals)
            task_status.started()
            await self.draining.wait()
            log.info("shutting down: draining in-flight requests for up to %.0fs", self.drain_timeout)
            # The frontend watches ``draining`` and returns once its streams are done; give it
            # the drain window, then cancel whatever is still running.
            with trio.move_on_after(self.drain_timeout):
                await self._wait_frontend_done()
            nursery.cancel_scope.cancel()

    async def _wait_frontend_done(self) -> None:
        for actor in self.actors:
            done = getattr(actor, "done", None)
            if done is not None:
                await done.wait()

    async def _watch_signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                log.info("received %s", signal.Signals(signum).name)
                if self.draining.is_set():
                    # A second signal: skip the rest of the drain. Cancelling (rather than
                    # raising KeyboardInterrupt) runs the same cleanup, sinks included, and
                    # ends the server normally instead of with an exception group.
                    log.info("stopping now")
                    if self._actors_scope is not None:
                        self._actors_scope.cancel()
                    return
                self.request_shutdown()
