"""What ``trillium cluster`` starts: the replicas' and the router's command lines, ports and cores.

Pure (no processes, no network), so it is unit-tested on its own. Ports: the router listens on
``router_port``; replica i serves HTTP on ``replica_port + i`` and, with the ``kv_aware`` policy,
publishes its prefix-cache events on ``kv_events_port + i``. Cores: the ``num_threads`` budget
(default: every core this process may use) is split evenly; when the replicas' shares fit the
available cores, replica i is pinned to its own (``taskset``-style affinity), so replicas do not
fight over the same cores' caches.
"""

from __future__ import annotations

import dataclasses
import os
import sys

KV_AWARE_TEMPERATURE = 0.01  # see router_argv
POLICIES = ("cache_aware", "kv_aware", "round_robin", "power_of_two", "consistent_hash", "random")
# Flags `trillium cluster` sets on every replica itself: passing them through would clash.
OWNED_ENGINE_FLAGS = ("--host", "--port", "--num-threads", "--kv-events-endpoint")
# TLS belongs in front of the router, which has no TLS flags of its own (vllm-router 0.1.17) and
# reaches the replicas, as the supervisor's probes do, over plain HTTP.
TLS_FLAGS = ("--ssl-certfile", "--ssl-keyfile", "--ssl-ca-certs")


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    replicas: int = 2
    policy: str = "cache_aware"
    host: str = "127.0.0.1"
    router_port: int = 8000
    replica_port: int = 8001  # replica i: replica_port + i
    kv_events_port: int = 5557  # replica i: kv_events_port + i (kv_aware only)
    router_metrics_port: int = 29000  # the router's own Prometheus exporter
    num_threads: int | None = None  # across all replicas; None = the cores this process may use
    engine_args: tuple[str, ...] = ()  # passed to every `trillium serve` as given
    router_log_level: str = "warning"
    router_args: tuple[str, ...] = ()  # more vllm-router flags, after trillium cluster's own

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"--replicas must be at least 1, got {self.replicas}")
        if self.policy not in POLICIES:
            raise ValueError(f"--policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"--num-threads must be at least 1, got {self.num_threads}")
        for arg in self.engine_args:
            flag = arg.split("=", 1)[0]
            if flag in OWNED_ENGINE_FLAGS:
                raise ValueError(f"{flag} is set per replica by trillium cluster; leave it out")
            if flag in TLS_FLAGS:
                raise ValueError(
                    f"{flag}: trillium cluster serves plain HTTP (vllm-router has no TLS flags); terminate TLS "
                    "in front of the router (a reverse proxy, or a Kubernetes ingress) and keep --host private"
                )
        ports = [self.router_port, self.router_metrics_port, *self.replica_ports()]
        if self.policy == "kv_aware":
            ports += [self.kv_events_port + i for i in range(self.replicas)]
        if not all(0 < port < 65536 for port in ports):
            raise ValueError(f"ports must be in 1..65535: the router, metrics, replica and KV-event ports are {ports}")
        if len(set(ports)) != len(ports):
            raise ValueError(f"the router, metrics, replica and KV-event ports overlap: {sorted(ports)}")

    def replica_ports(self) -> list[int]:
        return [self.replica_port + i for i in range(self.replicas)]

    @property
    def connect_host(self) -> str:
        """Where the router and clients reach what binds ``host`` (a wildcard is not an address)."""
        return "127.0.0.1" if self.host in ("0.0.0.0", "", "*") else "::1" if self.host == "::" else self.host

    @property
    def url(self) -> str:
        return f"http://{_bracketed(self.connect_host)}:{self.router_port}"


def _bracketed(host: str) -> str:
    """A host as it goes before ``:port`` in a URL (IPv6 addresses in brackets)."""
    return f"[{host}]" if ":" in host else host


@dataclasses.dataclass(frozen=True)
class ReplicaSpec:
    index: int
    url: str  # http://host:port
    argv: tuple[str, ...]
    cores: tuple[int, ...] | None  # CPU affinity; None = not pinned
    kv_events: str | None  # tcp://host:port the router subscribes to (kv_aware)

    @property
    def name(self) -> str:
        return f"replica-{self.index}"


def available_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def plan_replicas(config: ClusterConfig, cores: list[int] | None = None) -> list[ReplicaSpec]:
    cores = available_cores() if cores is None else cores
    total = config.num_threads or len(cores)
    per = max(1, total // config.replicas)
    pin = config.replicas * per <= len(cores)
    specs = []
    for i, port in enumerate(config.replica_ports()):
        kv_port = config.kv_events_port + i
        kv_aware = config.policy == "kv_aware"
        argv = [sys.executable, "-m", "trillium", "serve", "--host", config.host, "--port", str(port)]
        argv += ["--num-threads", str(per)]
        if kv_aware:
            argv += ["--kv-events-endpoint", f"tcp://{_bracketed(config.host or '*')}:{kv_port}"]
        argv += list(config.engine_args)
        specs.append(
            ReplicaSpec(
                index=i,
                url=f"http://{_bracketed(config.connect_host)}:{port}",
                argv=tuple(argv),
                cores=tuple(cores[i * per : (i + 1) * per]) if pin else None,
                kv_events=f"tcp://{_bracketed(config.connect_host)}:{kv_port}" if kv_aware else None,
            )
        )
    return specs


def router_argv(config: ClusterConfig, replicas: list[ReplicaSpec], *, model: str, block_size: int) -> list[str]:
    """vllm-router in front of ``replicas``: readiness (not liveness) health checks every second
    so a draining or restarting replica leaves the rotation quickly, and for ``kv_aware`` one
    static KV-event source per replica with trillium's block size and model id."""
    argv = [sys.executable, "-m", "vllm_router.launch_router"]
    argv += ["--host", config.host, "--port", str(config.router_port), "--policy", config.policy]
    argv += ["--worker-urls", *[r.url for r in replicas]]
    argv += ["--health-check-endpoint", "/health/ready", "--health-check-interval-secs", "1"]
    argv += ["--health-failure-threshold", "2", "--health-success-threshold", "1", "--health-check-timeout-secs", "2"]
    argv += ["--worker-startup-check-interval", "1", "--worker-startup-timeout-secs", "600"]
    argv += ["--prometheus-host", config.host, "--prometheus-port", str(config.router_metrics_port)]
    argv += ["--log-level", config.router_log_level]
    if config.policy == "kv_aware":
        for r in replicas:
            argv += ["--kv-event-source", f"{r.url}={r.kv_events}"]
        argv += ["--kv-event-block-size", str(block_size), "--kv-event-model", model]
        # At temperature 0 the router breaks ties (every replica idle, no replica caching the
        # prompt) by list order, so every new prefix lands on the first replica, which thrashes
        # while the others idle (bench/cluster.py --streams 1: all 128 requests on replica 0). A
        # small temperature spreads ties at random and all but always still picks the replica that
        # caches the prompt (its cost is lower by the prefix's whole prefill).
        argv += ["--router-temperature", str(KV_AWARE_TEMPERATURE)]
    return argv + list(config.router_args)
