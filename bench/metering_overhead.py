"""Per-request cost of API keys, quotas and the usage ledger: requests/s on a tiny request, with
and without ``trillium serve --config``, in the same run.

    python bench/metering_overhead.py                       # 10 rounds x 200 requests, 8 clients
    python bench/metering_overhead.py --rounds 5 --concurrency 16 --num-requests 800
    python bench/metering_overhead.py --aa                  # control: two open servers (noise floor)
    python bench/metering_overhead.py --quick               # smoke mode, well under a minute

Both servers are started one after the other and stay up; the rounds then alternate between
them in ABBA order (open, metered, metered, open, ...), so that drift on a shared machine
(warm-up, neighbours, clock boost) hits both alike. The metered server has one tenant whose
every limit is set so high that it never refuses a request: each request still pays for the
key hash, the quota checks and token reservation, its usage record, the ledger write (SQLite
WAL, batched in the metering actor's thread) and the Prometheus updates. The load is a closed
loop of ``--concurrency`` clients on keep-alive connections, each sending
``POST /v1/completions`` with a short prompt, ``max_tokens=1``, non-streamed. The idle server
does no work while the other is measured. ``bench/metering_micro.py`` measures the same cost
in process, without a server's noise.

Prints one JSON line per round, a summary line (median requests/s of each server; ``ratio``: the
median over rounds of each round's metered / open ratio, the headline; the rounds' ratios, whose
spread shows the noise) and a Markdown table; ``--result-file`` writes all of it as one JSON
document. ``--aa`` starts two open servers instead: an A/A control whose ratio would be 1 on a
quiet machine, so its distance from 1 is the noise floor of the comparison. Exits 1 unless every
request succeeded and the metered server's ledger holds one completed record per request sent
to it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import httpx
import trio

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import wait_healthy
from trillium.metering.tenants import hash_key, new_key

UNLIMITED = 10**9  # every limit of the benchmark tenant: checked on each request, never reached
PROMPT = "Hello"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(directory: str, tenant_key: str, admin_key: str) -> str:
    path = os.path.join(directory, "trillium.toml")
    with open(path, "w") as f:
        f.write(
            f'[ledger]\npath = "usage.sqlite"\n[admin]\nkeys = ["{hash_key(admin_key)}"]\n'
            f'[tenants.bench]\nkeys = ["{hash_key(tenant_key)}"]\n'
            f"requests_per_minute = {UNLIMITED}\ntokens_per_minute = {UNLIMITED}\n"
            f"max_concurrent_requests = {UNLIMITED}\nmax_tokens_per_request = {UNLIMITED}\n"
        )
    return path


class Server:
    """``trillium serve`` in its own process group, logging to ``log_path``."""

    def __init__(self, label: str, extra_args: list[str], log_path: str) -> None:
        self.label = label
        self.base_url = f"http://127.0.0.1:{free_port()}"
        cmd = [sys.executable, "-m", "trillium.cli", "serve", "--port", self.base_url.rsplit(":", 1)[1], *extra_args]
        print(f"== {label}: {' '.join(cmd)}", file=sys.stderr, flush=True)
        self.log_path = log_path
        self._log = open(log_path, "w")  # noqa: SIM115  # the server's log for its lifetime; closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_healthy(self.base_url, self.proc, timeout_s=300)
        except BaseException:
            self.stop()
            with open(log_path) as f:
                print(f.read()[-3000:], file=sys.stderr)
            raise

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()


async def load(base_url: str, headers: dict, num_requests: int, concurrency: int, max_tokens: int) -> dict:
    """A closed loop of ``concurrency`` clients sending ``num_requests`` tiny completions."""
    latencies: list[float] = []
    failures: list[str] = []
    remaining = num_requests
    payload = {"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base_url, headers=headers, limits=limits, timeout=300) as client:

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                start = time.perf_counter()
                r = await client.post("/v1/completions", json=payload)
                latencies.append(time.perf_counter() - start)
                if r.status_code != 200:
                    failures.append(f"HTTP {r.status_code}: {r.text[:200]}")

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(worker)
        wall = time.perf_counter() - start
    latencies.sort()
    return {
        "requests": num_requests,
        "failed": len(failures),
        "wall_s": round(wall, 3),
        "requests_per_s": round(num_requests / wall, 2),
        "latency_p50_ms": round(1000 * latencies[len(latencies) // 2], 2),
        "latency_p99_ms": round(1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 2),
        **({"first_error": failures[0]} if failures else {}),
    }


def ledger_totals(base_url: str, admin_key: str) -> dict:
    r = httpx.get(base_url + "/v1/usage", headers={"Authorization": f"Bearer {admin_key}"}, timeout=60)
    r.raise_for_status()
    (row,) = r.json()["data"]
    return row


def run(args) -> dict:
    tenant_key, admin_key = new_key(), new_key()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="trillium-metering-bench-") as tmp:
        config = write_config(tmp, tenant_key, admin_key)
        servers = {}
        try:
            servers["open"] = Server("open", args.server_args, os.path.join(tmp, "open.log"))
            # --aa: the "metered" server is a second open one, so the ratio shows the noise floor.
            metered_args = args.server_args if args.aa else [*args.server_args, "--config", config]
            servers["metered"] = Server("metered", metered_args, os.path.join(tmp, "metered.log"))
            headers = {"open": {}, "metered": {} if args.aa else {"Authorization": f"Bearer {tenant_key}"}}
            for label, server in servers.items():  # warm-up: first-request costs, caches, pools
                trio.run(load, server.base_url, headers[label], args.warmup, args.concurrency, args.max_tokens)
            for i in range(args.rounds):
                # ABBA order: a steady drift (warming up, a neighbour starting) favours neither.
                order = list(servers.items()) if i % 2 == 0 else list(servers.items())[::-1]
                for label, server in order:
                    row = {
                        "server": label,
                        "round": i,
                        **trio.run(
                            load, server.base_url, headers[label], args.num_requests, args.concurrency, args.max_tokens
                        ),
                    }
                    print(json.dumps(row), flush=True)
                    rows.append(row)
            ledger = {} if args.aa else ledger_totals(servers["metered"].base_url, admin_key)
        finally:
            for server in servers.values():
                server.stop()
    rate = {
        label: statistics.median(r["requests_per_s"] for r in rows if r["server"] == label)
        for label in ("open", "metered")
    }
    by = {(r["server"], r["round"]): r["requests_per_s"] for r in rows}
    pairs = [round(by[("metered", i)] / by[("open", i)], 3) for i in range(args.rounds)]
    # The headline is the median of the rounds' own ratios: each compares two measurements a few
    # seconds apart, so a neighbour that comes or goes mid-run skews one round, not the result.
    return {
        "rows": rows,
        "open_requests_per_s": rate["open"],
        "metered_requests_per_s": rate["metered"],
        "ratio": round(statistics.median(pairs), 4),
        "round_ratios": pairs,
        "ratio_of_medians": round(rate["metered"] / rate["open"], 4),
        "ledger_records": ledger.get("requests"),
        "ledger_completed": ledger.get("completed"),
        "expected_ledger_records": None if args.aa else args.warmup + args.rounds * args.num_requests,
        "failed": sum(r["failed"] for r in rows),
    }


def markdown(summary: dict) -> str:
    lines = [
        "| round | open req/s | metered req/s | metered / open | open p50 ms | metered p50 ms |",
        "|---|---|---|---|---|---|",
    ]
    by = {(r["server"], r["round"]): r for r in summary["rows"]}
    for i in sorted({r["round"] for r in summary["rows"]}):
        o, m = by[("open", i)], by[("metered", i)]
        lines.append(
            f"| {i} | {o['requests_per_s']:.1f} | {m['requests_per_s']:.1f} | "
            f"{summary['round_ratios'][i]:.3f} | {o['latency_p50_ms']:.1f} | {m['latency_p50_ms']:.1f} |"
        )
    lines.append(
        f"| median | {summary['open_requests_per_s']:.1f} | {summary['metered_requests_per_s']:.1f} | "
        f"{summary['ratio']:.3f} | | |"
    )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=10, help="measurements per server, alternating")
    p.add_argument("--num-requests", type=int, default=200, help="requests per round")
    p.add_argument("--warmup", type=int, default=100, help="requests per server before the first round")
    p.add_argument("--concurrency", type=int, default=8, help="clients in the closed loop")
    p.add_argument("--max-tokens", type=int, default=1)
    p.add_argument(
        "--server-args",
        nargs=argparse.REMAINDER,
        default=None,
        help="arguments for both `trillium serve`s (last; default: --kv-cache-gib 0.25 --log-level warning)",
    )
    p.add_argument("--result-file", default=None, help="write the run as one JSON document")
    p.add_argument("--quick", action="store_true", help="smoke mode: 1 round of 16 requests, 2 clients")
    p.add_argument(
        "--aa",
        action="store_true",
        help="control run: both servers without --config (their ratio is this machine's noise floor)",
    )
    args = p.parse_args()
    if args.server_args is None:
        args.server_args = ["--kv-cache-gib", "0.25", "--log-level", "warning"]
    if args.quick:
        args.rounds, args.num_requests, args.warmup, args.concurrency = 1, 16, 4, 2
    summary = run(args)
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"}), flush=True)
    print()
    print(markdown(summary))
    if args.result_file:
        doc = {
            "command": " ".join(sys.argv),
            "settings": dict(vars(args).items()),
            "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
            **summary,
        }
        with open(args.result_file, "w") as f:
            json.dump(doc, f, indent=2)
    ok = summary["failed"] == 0 and summary["ledger_completed"] == summary["expected_ledger_records"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
