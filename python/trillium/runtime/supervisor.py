"""Supervisor: starts actors in dependency order, restarts the ones that fail, watches that they
make progress, and shuts them down gracefully.

Failure (``run`` raised after it started; the actor has already answered what was waiting on it):
the actor runs again after a back-off, as its :class:`RestartPolicy` allows. Past the restart budget (or for an actor that never restarts) the
supervisor stops everything and :attr:`Supervisor.exit_code` becomes 1, so that the process exits
non-zero and an orchestrator restarts it. A failure while starting is not restarted: it propagates.

Watchdog: every ``watch_interval`` seconds the supervisor publishes a :class:`Health` snapshot --
live unless an actor reports a reason (:meth:`Actor.liveness`: a model step running far too long)
or holds messages in its inbox that it has not taken for ``stall_after_s``; ready once every actor
started, while none is down and the server is not draining (``/health`` and ``/health/ready``).

Shutdown (SIGINT/SIGTERM or :meth:`Supervisor.request_shutdown`): the ``draining`` event is set
first, so the frontend stops accepting work and in-flight streams may finish; after
``drain_timeout`` seconds (or at a second signal) everything left is cancelled. *Sinks* (actors
that only receive, such as the metering actor) start first and stop last: once every other actor
has returned, so that nothing can send to them any more, each sink's ``stop()`` makes it flush and
return.

SIGHUP (with ``on_hangup``): the callback runs in its own task (a config reload, as daemons do);
what it raises is logged, and the server runs on.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from trillium.runtime.actor import Actor, Sink
from trillium.runtime.snapshot import Snapshot

log = logging.getLogger("trillium.runtime")


@dataclasses.dataclass(frozen=True)
class Health:
    """What ``/health`` (liveness) and ``/health/ready`` (readiness) answer."""

    live: bool = True
    ready: bool = False
    reasons: tuple[str, ...] = ()  # why not live, or not ready
    restarts: int = 0  # actor restarts since start


class _Started:
    """A ``task_status`` that remembers whether ``started()`` was called (a restart passes none)."""

    def __init__(self, inner: trio.TaskStatus[Any]) -> None:
        self._inner = inner
        self.called = False

    def started(self, value: Any = None) -> None:
        if not self.called:
            self.called = True
            self._inner.started(value)


class Supervisor:
    """Owns the nursery that all actors live in."""

    def __init__(
        self,
        actors: list[Actor],
        *,
        draining: trio.Event | None = None,
        drain_timeout: float = 10.0,
        sinks: list[Sink] | None = None,
        watch_interval: float = 1.0,
        health: Snapshot[Health] | None = None,
        on_hangup: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.actors = actors
        self.on_hangup = on_hangup
        self.sinks = sinks or []
        self.drain_timeout = drain_timeout
        self.draining = draining if draining is not None else trio.Event()
        self.watch_interval = watch_interval
        self.health = health if health is not None else Snapshot(Health())
        self.exit_code = 0
        self.num_restarts = 0
        self.fatal: str | None = None  # why the server gave up
        self._down: set[str] = set()  # actors between a failure and their restart
        self._started = False
        self._actors_scope: trio.CancelScope | None = None
        self._sinks_scope: trio.CancelScope | None = None
        self._stuck_since: dict[str, float] = {}
        self._last_seen_take: dict[str, float] = {}

    def request_shutdown(self) -> None:
        self.draining.set()

    async def run(
        self, *, handle_signals: bool = True, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run every actor until shutdown is requested (or one fails past its budget), then drain
        and cancel; then stop the sinks."""
        async with trio.open_nursery() as sink_nursery:
            self._sinks_scope = sink_nursery.cancel_scope
            for sink in self.sinks:
                log.debug("starting %s", sink.name)
                await sink_nursery.start(self._supervise, sink)
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
                await nursery.start(self._supervise, actor)
            if handle_signals:
                # Started (its receiver installed) before we report started: a signal sent right
                # after start-up must not meet the default handler (SIGHUP's ends the process).
                await nursery.start(self._watch_signals, nursery)
            self._started = True
            nursery.start_soon(self._watch)
            task_status.started()
            await self.draining.wait()
            if self.fatal is None:
                log.info("shutting down: draining in-flight requests for up to %.0fs", self.drain_timeout)
                # The frontend returns once its streams are done; give it the drain window, then
                # cancel whatever is still running.
                with trio.move_on_after(self.drain_timeout):
                    for actor in self.actors:
                        if actor.finishes_on_drain:
                            await actor.done.wait()
            nursery.cancel_scope.cancel()

    # ---- supervision -----------------------------------------------------------------------------

    async def _supervise(self, actor: Actor, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run ``actor`` and restart it after failures, as its policy allows."""
        policy = actor.restart_policy
        failures: collections.deque[float] = collections.deque()
        status = _Started(task_status)
        try:
            while True:
                try:
                    await actor.run(task_status=status)
                    return
                except Exception as exc:
                    if not status.called:
                        raise  # it never started: the server cannot run without it
                    log.exception("%s failed", actor.name)
                    self._down.add(actor.name)
                    self._publish_health()
                    now = time.monotonic()
                    failures.append(now)
                    while failures and failures[0] < now - policy.window_s:
                        failures.popleft()
                    if not policy.restart or len(failures) > policy.max_restarts:
                        self._give_up(
                            f"{actor.name} failed {len(failures)} times in {policy.window_s:g} s: "
                            f"{type(exc).__name__}: {exc}"
                            if policy.restart
                            else f"{actor.name} failed: {type(exc).__name__}: {exc}"
                        )
                        return
                    # Back-off doubles with each failure inside the window.
                    await trio.sleep(min(policy.backoff_s * 2 ** (len(failures) - 1), policy.max_backoff_s))
                    self.num_restarts += 1
                    log.warning("restarting %s (restart %d)", actor.name, self.num_restarts)
                    actor.last_take = time.monotonic()
                    self._down.discard(actor.name)
                    self._publish_health()
        finally:
            actor.done.set()

    def _give_up(self, reason: str) -> None:
        """Stop the server with a non-zero exit code (an orchestrator restarts the process)."""
        log.critical("giving up: %s", reason)
        self.fatal = reason
        self.exit_code = 1
        self._publish_health()
        self.draining.set()
        if self._actors_scope is not None:
            self._actors_scope.cancel()

    # ---- watchdog --------------------------------------------------------------------------------

    async def _watch(self) -> None:
        while True:
            self._publish_health()
            await trio.sleep(self.watch_interval)

    def _publish_health(self) -> None:
        now = time.monotonic()
        reasons = [] if self.fatal is None else [self.fatal]
        for actor in [*self.sinks, *self.actors]:
            reason = actor.liveness(now) or self._stalled(actor, now)
            if reason is not None:
                reasons.append(reason)
        live = not reasons
        not_ready = [f"{name} is restarting after a failure" for name in sorted(self._down)]
        if not self._started:
            not_ready.append("starting")
        if self.draining.is_set():
            not_ready.append("draining")
        self.health.publish(Health(live, live and not not_ready, tuple(reasons + not_ready), self.num_restarts))

    def _stalled(self, actor: Actor, now: float) -> str | None:
        """An inbox that holds messages while the actor has taken none since the last look, for
        ``stall_after_s`` seconds."""
        name = actor.name
        progressed = self._last_seen_take.get(name) != actor.last_take
        self._last_seen_take[name] = actor.last_take
        if actor.inbox_backlog() == 0 or progressed or name in self._down:
            self._stuck_since.pop(name, None)
            return None
        since = self._stuck_since.setdefault(name, now)
        if now - since < actor.stall_after_s:
            return None
        return f"{name} has not taken a message for {now - since:.0f} s ({actor.inbox_backlog()} waiting)"

    async def _watch_signals(
        self, nursery: trio.Nursery, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        watched = [signal.SIGINT, signal.SIGTERM]
        if self.on_hangup is not None and hasattr(signal, "SIGHUP"):
            watched.append(signal.SIGHUP)
        with trio.open_signal_receiver(*watched) as signals:
            task_status.started()
            async for signum in signals:
                log.info("received %s", signal.Signals(signum).name)
                if signum == getattr(signal, "SIGHUP", None):
                    nursery.start_soon(self._hangup)
                    continue
                if self.draining.is_set():
                    # A second signal: skip the rest of the drain. Cancelling (rather than
                    # raising KeyboardInterrupt) runs the same cleanup, sinks included, and
                    # ends the server normally instead of with an exception group.
                    log.info("stopping now")
                    if self._actors_scope is not None:
                        self._actors_scope.cancel()
                    return
                self.request_shutdown()

    async def _hangup(self) -> None:
        assert self.on_hangup is not None
        try:
            await self.on_hangup()
        except Exception:
            log.exception("the SIGHUP handler failed; serving on")
