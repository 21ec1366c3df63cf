"""Scale-out benchmark: replicas behind vllm-router on a prefix-sharing workload, same run.

    python bench/cluster.py                       # 32 streams, the four setups below
    python bench/cluster.py --quick               # smoke: small, two setups (tests/integration)

Setups, each started fresh with ``trillium cluster`` (so no cache carries over): 1 replica with 2
threads (behind the router too, so every setup pays the same proxy hop), then 2 replicas with 1
thread each under ``kv_aware`` (routing on the replicas' published prefix-cache events),
``cache_aware`` (the router's own guess from request history) and ``round_robin``.

Workload ("many users, few long system prompts"): ``--system-prompts`` distinct system prompts of
``--system-words`` random words, each request one of them (uniformly, seeded: the same stream for
every setup) plus a short user question, streamed chat completions, ``--streams`` at a time. Each
replica's KV pool is ``--kv-cache-gib`` (default: about half of the distinct prefixes fit one
replica of two, so where a prefix lands decides whether it stays cached; the single replica gets
twice the pool: every setup has the same memory).

Prints one JSON row per setup and a table: output tokens/s, requests/s, TTFT p50/p90, and the
prefix-cache hit rate over all replicas (cached prompt tokens / prompt tokens, from each replica's
/metrics), then the ratios against round_robin and against the single replica.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import httpx

sys.path.insert(0, os.path.dirname(__file__))
from serving_client import stream_request
from serving_metrics import summarize

WORDS = (
    "harbor lantern keeper storm vessel signal beacon tide reef channel compass anchor rope deck "
    "mast sail cargo ledger voyage island coast current fog bell watch night dawn gull pier wave"
).split()
QUESTIONS = ["What is {}?", "Explain {} briefly.", "Why does {} matter?", "Give one fact about {}."]


def free_ports(n: int) -> int:
    """The first of ``n`` consecutive ports that are free now (below the kernel's ephemeral range,
    so other tests' free_port() picks cannot land inside the block)."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 32000 - n)
        try:
            for port in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError(f"no {n} consecutive free ports")


def shared_prefix_workload(num_requests: int, num_systems: int, system_words: int, seed: int) -> list[list[dict]]:
    """Chat requests: one of ``num_systems`` long system prompts each, plus a short question."""
    rng = random.Random(seed)
    systems = [
        f"You are assistant {i}. " + " ".join(rng.choice(WORDS) for _ in range(system_words))
        for i in range(num_systems)
    ]
    out = []
    for _ in range(num_requests):
        question = rng.choice(QUESTIONS).format(rng.choice(WORDS))
        out.append([{"role": "system", "content": rng.choice(systems)}, {"role": "user", "content": question}])
    return out


@dataclass
class ClusterProcess:
    """``trillium cluster`` in a subprocess on free ports; its printed replica and router pids and
    URL parsed. Every later stdout line lands in ``lines`` (restarts are reported there)."""

    replicas: int
    policy: str
    args: list[str] = field(default_factory=list)
    log_path: str | None = None
    start_timeout: float = 300

    def __post_init__(self) -> None:
        n = self.replicas
        base = free_ports(2 * n + 2)  # router, router metrics, replicas, KV-event sockets
        self.router_port = base
        argv = [sys.executable, "-m", "trillium", "cluster", "--replicas", str(n), "--policy", self.policy]
        argv += ["--router-port", str(base), "--router-metrics-port", str(base + 1)]
        argv += ["--replica-port", str(base + 2), "--kv-events-port", str(base + 2 + n), *self.args]
        self._log = open(self.log_path or os.devnull, "wb")  # noqa: SIM115  # closed in stop()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self._log, text=True)
        self.lines: list[str] = []
        self._new_line = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()
        self.url = ""
        self.replica_urls: list[str] = []
        self.pids: list[int] = []  # the replicas'
        self.router_pid: int | None = None
        if not (m := self.wait_for(r"trillium cluster: (\S+)/v1 ", self.start_timeout)):
            self.stop()
            raise RuntimeError(f"trillium cluster did not start (exit {self.proc.poll()}); see {self.log_path}")
        self.url = m[1]
        for line in self.lines:
            if r := re.match(r"replica-(\d+): (\S+) \(pid (\d+)", line):
                self.replica_urls.append(r[2])
                self.pids.append(int(r[3]))
            elif r := re.match(r"router: \S+ \(pid (\d+)", line):
                self.router_pid = int(r[1])

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._new_line:
                self.lines.append(line)
                self._new_line.notify_all()

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str] | None:
        """The first stdout line (so far or within ``timeout``) matching ``pattern``, or None."""
        deadline = time.monotonic() + timeout
        seen = 0
        with self._new_line:
            while True:
                for line in self.lines[seen:]:
                    if m := re.search(pattern, line):
                        return m
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and seen == len(self.lines)):
                    return None
                self._new_line.wait(min(left, 1.0))

    def stop(self, timeout: float = 90) -> int:
        """SIGTERM once (the cluster drains) and wait; past ``timeout``, SIGKILL the launcher and
        every process group it started (each child leads its own)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                for pid in [*self.pids, self.router_pid]:
                    if pid is not None:
                        try:
                            os.killpg(pid, signal.SIGKILL)
                        except (ProcessLookupError, PermissionError):
                            pass
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def prefix_counters(replica_urls: list[str]) -> tuple[float, float]:
    """(cached prompt tokens, prompt tokens looked up) summed over the replicas' /metrics."""
    hits = queries = 0.0
    for url in replica_urls:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        hits += metric_value(text, "trillium:prefix_cache_hits_total")
        queries += metric_value(text, "trillium:prefix_cache_queries_total")
    return hits, queries


def metric_value(text: str, name: str) -> float:
    """The value of the one sample of ``name`` in a Prometheus text page (0 when absent)."""
    m = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.M)
    return float(m[1]) if m else 0.0


async def run_load(
    base_url: str, model: str, workload: list[list[dict]], streams: int, max_tokens: int, timeout: float = 600
) -> tuple[list[dict], float]:
    """Closed loop: ``streams`` clients take the workload's requests in order. (records, wall s)."""
    queue = list(reversed(workload))
    records: list[dict] = []

    async def client_loop(client: httpx.AsyncClient) -> None:
        while queue:
            messages = queue.pop()
            records.append(await stream_request(client, "chat", model, "", max_tokens, False, None, messages))

    t0 = time.perf_counter()
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(streams)))
    return records, time.perf_counter() - t0


def run_setup(name: str, replicas: int, policy: str, threads: int, args: argparse.Namespace) -> dict:
    workload = shared_prefix_workload(args.requests, args.system_prompts, args.system_words, args.seed)
    # The same memory in every setup: one replica gets the pool two would share.
    pool = args.kv_cache_gib * (2 if replicas == 1 else 1)
    engine = ["--kv-cache-gib", str(pool), "--max-running", str(args.max_running)]
    engine += ["--router-log-level", args.router_log_level, "--router-args", args.router_args]
    cluster = ClusterProcess(replicas, policy, ["--num-threads", str(threads), *engine], log_path=args.log)
    try:
        model = httpx.get(f"{cluster.url}/v1/models", timeout=30).json()["data"][0]["id"]
        records, wall = asyncio.run(run_load(cluster.url, model, workload, args.streams, args.max_tokens))
        hits, queries = prefix_counters(cluster.replica_urls)
    finally:
        cluster.stop()
    row = {"setup": name, "replicas": replicas, "policy": policy, "threads_per_replica": threads // replicas}
    row.update(summarize(records, wall))
    row["prefix_hit_rate"] = round(hits / queries, 4) if queries else 0.0
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--system-prompts", type=int, default=16)
    p.add_argument("--system-words", type=int, default=300)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument(
        "--kv-cache-gib", type=float, default=0.2, help="per replica of two (the single replica gets twice this)"
    )
    p.add_argument("--max-running", type=int, default=32, help="per replica")
    p.add_argument("--threads", type=int, default=2, help="cores in all, split between the replicas")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--setups", default="single,kv_aware,cache_aware,round_robin", help="which, in order")
    p.add_argument("--quick", action="store_true", help="smoke run: few requests, two setups")
    p.add_argument("--log", default=None, help="append the clusters' logs here")
    p.add_argument("--router-log-level", default="warning")
    p.add_argument("--router-args", default="", help="more vllm-router flags for every setup")
    p.add_argument("--result-file", default=None)
    args = p.parse_args()
    known = {
        "single": ("1 replica x 2 threads", 1, "round_robin"),
        "kv_aware": ("2 x 1, kv_aware", 2, "kv_aware"),
        "cache_aware": ("2 x 1, cache_aware", 2, "cache_aware"),
        "round_robin": ("2 x 1, round_robin", 2, "round_robin"),
    }
    if args.quick:
        args.requests, args.streams, args.system_words, args.max_tokens = 12, 4, 60, 4
        args.setups = "kv_aware,round_robin"
    setups = [known[name] for name in args.setups.split(",")]
    rows = []
    for name, replicas, policy in setups:
        row = run_setup(name, replicas, policy, args.threads, args)
        print(json.dumps(row), flush=True)
        rows.append(row)
    by_setup = {r["setup"]: r for r in rows}
    rr = by_setup.get(known["round_robin"][0])
    single = by_setup.get(known["single"][0])
    print(f"\n{'setup':24} {'out tok/s':>10} {'req/s':>7} {'TTFT p50':>9} {'TTFT p90':>9} {'hit rate':>8}")
    for r in rows:
        print(
            f"{r['setup']:24} {r['output_throughput']:>10.1f} {r['request_throughput']:>7.2f} "
            f"{r['ttft_p50_ms']:>8.0f}ms {r['ttft_p90_ms']:>8.0f}ms {r['prefix_hit_rate']:>8.3f}"
        )
    for r in rows:
        ratios = []
        if rr and r is not rr and rr["prefix_hit_rate"]:
            ratios.append(f"hit rate {r['prefix_hit_rate'] / rr['prefix_hit_rate']:.2f}x round_robin")
        if single and r is not single and single["output_throughput"]:
            ratios.append(f"throughput {r['output_throughput'] / single['output_throughput']:.2f}x one replica")
        if ratios:
            print(f"{r['setup']:24} " + ", ".join(ratios))
    if args.result_file:
        settings = {k: v for k, v in vars(args).items() if k not in ("result_file", "log")}  # no paths
        with open(args.result_file, "w") as f:
            json.dump({"args": settings, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
