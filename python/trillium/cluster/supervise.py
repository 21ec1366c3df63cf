"""``trillium cluster``'s supervisor: start the replicas, then the router in front of them; keep
them running; stop everything in order.

- Start: every replica at once; each must answer ``/health/ready`` (a replica that exits or
  times out fails the start, its last output printed). Then vllm-router with the replicas' URLs
  (plan.router_argv); once it answers ``/v1/models`` through a replica (200, or 401 from replicas
  that want keys: ``--config``), the one URL is printed.
- A replica that exits, or whose liveness probe (``/health``) fails LIVENESS_FAILURES times in a
  row, is taken out of the router (``POST /remove_worker``), killed if still there, started again
  and, once ready, put back (``POST /add_worker``). Restarts back off from 1 s to 30 s while the
  replica keeps failing within STABLE_S of its start (a crash loop never stops the others).
  Requests it held fail with an error at the client; the router sends new ones to the survivors
  meanwhile (its own readiness checks would too, a second later).
- The router, if it exits (or never becomes ready: killed), is started again: with the ready
  replicas (the others are added back as they become ready), or with all of them for ``kv_aware``,
  whose static event sources must all be listed at start.
- SIGINT/SIGTERM, also during the start: supervision stops, the replicas are sent SIGTERM first --
  each stops taking requests and finishes what it runs (up to its own drain limit; the router
  keeps proxying those streams) -- then, once they have exited or ``drain_timeout_s`` passed
  (SIGKILL), the router stops. A second signal skips the drain.
"""

from __future__ import annotations

import importlib.util
import logging
import signal
import sys

import httpx
import trio

from trillium.cluster.children import Child
from trillium.cluster.plan import ClusterConfig, ReplicaSpec, plan_replicas, router_argv

log = logging.getLogger("trillium.cluster")

READY_TIMEOUT_S = 600.0  # model load, and CUDA graph capture on a GPU
POLL_S = 0.25
LIVENESS_EVERY_S = 2.0
LIVENESS_FAILURES = 3
BACKOFF_S = (1.0, 30.0)  # first and longest wait before restarting a replica that keeps failing
STABLE_S = 30.0  # a replica up this long before it failed restarts at the first backoff again
ROUTER_GRACE_S = 10.0


class Replica:
    def __init__(self, spec: ReplicaSpec) -> None:
        self.spec = spec
        self.child = Child(spec.name, spec.argv, spec.cores)
        self.ready = False  # answered /health/ready since its last start
        self.ready_since = 0.0  # trio.current_time() when it last became ready


class Cluster:
    def __init__(self, config: ClusterConfig, *, drain_timeout_s: float = 60.0) -> None:
        self.config = config
        self.drain_timeout_s = drain_timeout_s
        self.replicas = [Replica(spec) for spec in plan_replicas(config)]
        self.router: Child | None = None
        self.stopping = trio.Event()
        self.model = ""
        self.block_size = 16
        self.failure: str | None = None  # why the start failed
        self.http: httpx.AsyncClient
        self._start_scope = trio.CancelScope()  # a first signal during the start cancels it

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> int:
        """Serve until a signal; reports the URL once serving. 0, or 1 after a failed start (why:
        ``failure``, also printed)."""
        async with httpx.AsyncClient(timeout=5.0) as http, trio.open_nursery() as nursery:
            self.http = http  # ``nursery`` holds the children's output pumps
            nursery.start_soon(self._watch_signals, nursery.cancel_scope)
            try:
                started = False
                with self._start_scope:
                    started = await self._start(nursery)
                if started and not self.stopping.is_set():
                    task_status.started(self.config.url)
                    async with trio.open_nursery() as supervising:
                        for replica in self.replicas:
                            supervising.start_soon(self._supervise_replica, nursery, replica)
                        supervising.start_soon(self._supervise_router, nursery)
                        await self.stopping.wait()
                        supervising.cancel_scope.cancel()  # no restart once the drain begins
                self.stopping.set()
                await self._drain()
            finally:
                for child in self._children():
                    child.kill()  # nothing outlives the launcher (a no-op for what has exited)
            nursery.cancel_scope.cancel()
        if self.failure is not None:
            print(f"trillium cluster: {self.failure}", file=sys.stderr, flush=True)
            return 1
        return 0

    def _children(self) -> list[Child]:
        return [r.child for r in self.replicas] + ([self.router] if self.router is not None else [])

    # ---- start ---------------------------------------------------------------------------------

    async def _start(self, nursery: trio.Nursery) -> bool:
        for replica in self.replicas:
            await replica.child.start(nursery)
            cores = ",".join(map(str, replica.spec.cores)) if replica.spec.cores else "any"
            print(f"{replica.spec.name}: {replica.spec.url} (pid {replica.child.pid}, cores {cores})", flush=True)
        async with trio.open_nursery() as starting:
            for replica in self.replicas:
                starting.start_soon(self._first_ready, replica, starting.cancel_scope)
        if self.failure is not None:
            return False
        info = (await self.http.get(f"{self.replicas[0].spec.url}/get_server_info")).json()
        self.model, self.block_size = info["model_id"], info["kv_block_size"]
        if not await self._start_router(nursery, self.replicas):
            return False
        assert self.router is not None
        print(f"router: {self.config.url} (pid {self.router.pid}, policy {self.config.policy})", flush=True)
        print(
            f"trillium cluster: {self.config.url}/v1 ({len(self.replicas)} replicas, policy {self.config.policy})",
            flush=True,
        )
        return True

    async def _first_ready(self, replica: Replica, scope: trio.CancelScope) -> None:
        if not await self._ready(replica):
            self.failure = f"{replica.spec.name} did not become ready:\n" + replica.child.last_lines(15)
            scope.cancel()

    async def _ready(self, replica: Replica) -> bool:
        """Wait for ``/health/ready``; False if the replica exits or READY_TIMEOUT_S passes."""
        with trio.move_on_after(READY_TIMEOUT_S):
            while replica.child.returncode is None:
                if await self._get_ok(f"{replica.spec.url}/health/ready"):
                    replica.ready, replica.ready_since = True, trio.current_time()
                    return True
                await trio.sleep(POLL_S)
        return False

    async def _start_router(self, nursery: trio.Nursery, replicas: list[Replica]) -> bool:
        """Start the router in front of ``replicas``; False (and the router killed) if it exits or
        does not answer within READY_TIMEOUT_S."""
        specs = [r.spec for r in replicas]
        argv = router_argv(self.config, specs, model=self.model, block_size=self.block_size)
        self.router = Child("router", argv)
        await self.router.start(nursery)
        with trio.move_on_after(READY_TIMEOUT_S):
            while self.router.returncode is None:
                # Without a key: a 401 from replicas with --config went through the router all the same.
                if await self._get_ok(f"{self.config.url}/v1/models", ok=(200, 401)):
                    return True
                await trio.sleep(POLL_S)
        self.failure = "the router did not start:\n" + self.router.last_lines(15)
        self.router.kill()
        return False

    # ---- supervision ---------------------------------------------------------------------------

    async def _supervise_replica(self, nursery: trio.Nursery, replica: Replica) -> None:
        backoff = BACKOFF_S[0]
        while True:
            async with trio.open_nursery() as watching:
                watching.start_soon(self._watch_liveness, replica)
                code = await replica.child.wait()
                watching.cancel_scope.cancel()
            replica.ready = False
            if trio.current_time() - replica.ready_since >= STABLE_S:
                backoff = BACKOFF_S[0]
            log.warning("%s exited (code %s): restarting it in %.0f s", replica.spec.name, code, backoff)
            await self._router_call("remove_worker", replica.spec.url)
            while True:
                await trio.sleep(backoff)
                backoff = min(2 * backoff, BACKOFF_S[1])
                replica.child = Child(replica.spec.name, replica.spec.argv, replica.spec.cores)
                await replica.child.start(nursery)
                if await self._ready(replica):
                    break
                replica.child.kill()
                await replica.child.wait()
            await self._router_call("add_worker", replica.spec.url)
            print(f"{replica.spec.name}: restarted and back in the router (pid {replica.child.pid})", flush=True)

    async def _watch_liveness(self, replica: Replica) -> None:
        """A replica that is up but hung (``/health`` failing) is killed; its supervisor restarts it."""
        failures = 0
        while True:
            await trio.sleep(LIVENESS_EVERY_S)
            failures = 0 if await self._get_ok(f"{replica.spec.url}/health") else failures + 1
            if failures >= LIVENESS_FAILURES:
                log.warning("%s failed its liveness probe %d times: killing it", replica.spec.name, failures)
                replica.child.kill()
                return

    async def _supervise_router(self, nursery: trio.Nursery) -> None:
        while True:
            assert self.router is not None
            code = await self.router.wait()
            log.warning("the router exited (code %s): restarting it", code)
            await trio.sleep(BACKOFF_S[0])
            # kv_aware's static event sources must all be listed at start (the router refuses a
            # source whose worker is not): all replicas, waiting for any that is restarting.
            ready = [r for r in self.replicas if r.ready]
            front = self.replicas if self.config.policy == "kv_aware" or not ready else ready
            if await self._start_router(nursery, front):
                self.failure = None
                print(f"router: restarted (pid {self.router.pid})", flush=True)
                for replica in self.replicas:  # ready while the router was down: put back now
                    if replica not in front and replica.ready:
                        await self._router_call("add_worker", replica.spec.url)
            else:
                log.error("%s", self.failure)
                self.failure = None  # try again: the replicas still serve on their own URLs

    async def _router_call(self, action: str, url: str) -> None:
        """Tell the router a replica left or came back (best effort: its health checks agree)."""
        try:
            await self.http.post(f"{self.config.url}/{action}", params={"url": url})
        except httpx.HTTPError as exc:
            log.warning("router %s %s: %s", action, url, exc)

    async def _get_ok(self, url: str, ok: tuple[int, ...] = (200,)) -> bool:
        try:
            return (await self.http.get(url, timeout=2.0)).status_code in ok
        except httpx.HTTPError:
            return False

    # ---- stop ----------------------------------------------------------------------------------

    async def _watch_signals(self, scope: trio.CancelScope) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                if self.stopping.is_set():
                    log.warning("second %s: stopping now", signal.Signals(signum).name)
                    scope.cancel()
                    return
                log.info("%s: draining the replicas, then stopping the router", signal.Signals(signum).name)
                self.stopping.set()
                self._start_scope.cancel()  # a no-op once started

    async def _drain(self) -> None:
        async with trio.open_nursery() as stopping:
            for replica in self.replicas:
                stopping.start_soon(replica.child.stop, self.drain_timeout_s)
        if self.router is not None:
            await self.router.stop(ROUTER_GRACE_S)
        print("trillium cluster: stopped", flush=True)


def run_cluster(config: ClusterConfig, *, drain_timeout_s: float = 60.0) -> int:
    if importlib.util.find_spec("vllm_router") is None:
        print("trillium cluster needs vllm-router: pip install 'trillium[cluster]'", file=sys.stderr)
        return 1
    return trio.run(lambda: Cluster(config, drain_timeout_s=drain_timeout_s).run())
