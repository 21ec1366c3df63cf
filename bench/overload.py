"""Fair admission under overload: ``/health`` latency while flooded, and whether a flooding tenant
delays a steady one.

    python bench/overload.py                          # starts a server; 2 phases of 30 s
    python bench/overload.py --phase-s 60 --max-running 16 --max-waiting 64
    python bench/overload.py --base-url http://127.0.0.1:8000 --tenants-by key --keys KEY_A KEY_B
    python bench/overload.py --quick                  # smoke mode, well under a minute

Two tenants, each a closed loop of streamed completions (random words, ``ignore_eos``), told apart
by the request's ``user`` field (an open server's tenant) or, with ``--tenants-by key``, by two API
keys of a ``--config`` server. The fair share of a tenant is half the server's running slots:
``--fair-concurrency`` (default ``max_running / 2``) clients.

- Phase 1 (``fair``): both tenants send at their fair share.
- Phase 2 (``flood``): the flooding tenant sends at ``--flood-factor`` (10) times its share,
  retrying a 503 after its ``Retry-After`` (or ``--retry-s``); the steady tenant keeps its share.

Throughout, ``/health`` is polled every 50 ms. Prints one JSON line per phase (per tenant:
completed, rejected with 503/429, TTFT p50/p99; ``/health`` p50/p99/max), then a summary line:
``steady_ttft_p99_ratio`` (steady tenant's TTFT p99, flood / fair; the target is <= 2) and
``health_p99_ms`` (the worse phase; the target is < 50 ms). Timings are reported, never asserted;
exits 1 only if a request failed other than by a 503/429 with ``Retry-After``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import sys
import time

import httpx
import trio

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from metering_overhead import Server
from serving_client import load_prompts, stream_request
from serving_metrics import per_request, percentile

HEALTH_INTERVAL_S = 0.05


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 1)


async def tenant_loop(client, args, model, tenant, extra, concurrency, deadline, records) -> None:
    """``concurrency`` clients, each sending its next request when the last ends, until ``deadline``."""
    prompts = load_prompts(None, 1000, args.input_words, seed=sum(map(ord, tenant)))

    async def worker(w: int) -> None:
        i = w
        while time.perf_counter() < deadline:
            i += concurrency
            rec = await stream_request(
                client, "completions", model, prompts[i % len(prompts)], args.max_tokens, True, extra
            )
            records.append(rec)
            if not rec["ok"] and "retry_after" in rec:
                await trio.sleep(args.retry_s if args.retry_s is not None else float(rec["retry_after"] or 1))

    async with trio.open_nursery() as nursery:
        for w in range(concurrency):
            nursery.start_soon(worker, w)


async def poll_health(client, deadline, latencies) -> None:
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        r = await client.get("/health")
        latencies.append(time.perf_counter() - start)
        if r.status_code != 200:
            raise RuntimeError(f"/health answered {r.status_code}")
        await trio.sleep(max(0.0, HEALTH_INTERVAL_S - (time.perf_counter() - start)))


def tenant_row(records: list[dict]) -> dict:
    ok = [r for r in records if r["ok"]]
    rejected = [r for r in records if not r["ok"] and r.get("retry_after")]  # 503/429 with Retry-After
    ttft = [per_request(r)["ttft"] for r in ok]
    errors = collections.Counter(r["error"][:120] for r in records if not r["ok"])
    return {
        "completed": len(ok),
        "rejected": len(rejected),
        "failed": len(records) - len(ok) - len(rejected),
        "ttft_p50_ms": _ms(percentile(ttft, 50)),
        "ttft_p99_ms": _ms(percentile(ttft, 99)),
        "errors": dict(errors.most_common(3)),
    }


async def phase(args, base_url, model, name, flood_concurrency) -> dict:
    tenants = {"steady": args.fair_concurrency, "flood": flood_concurrency}
    records: dict[str, list[dict]] = {t: [] for t in tenants}
    health: list[float] = []
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)

    def tenant_client(i: int) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {args.keys[i]}"} if args.tenants_by == "key" else None
        return httpx.AsyncClient(base_url=base_url, timeout=600, limits=limits, headers=headers)

    async with (
        tenant_client(0) as steady,
        tenant_client(1) as flood,
        httpx.AsyncClient(base_url=base_url, timeout=60) as prober,
    ):
        deadline = time.perf_counter() + args.phase_s
        async with trio.open_nursery() as nursery:
            nursery.start_soon(poll_health, prober, deadline, health)
            for client, (tenant, concurrency) in zip((steady, flood), tenants.items()):
                extra = {"temperature": 0} if args.tenants_by == "key" else {"temperature": 0, "user": tenant}
                nursery.start_soon(
                    tenant_loop, client, args, model, tenant, extra, concurrency, deadline, records[tenant]
                )
    row: dict = {"phase": name, **{f"{t}_concurrency": c for t, c in tenants.items()}}
    for tenant, recs in records.items():
        row.update({f"{tenant}_{k}": v for k, v in tenant_row(recs).items()})
    row.update(
        health_n=len(health),
        health_p50_ms=_ms(percentile(health, 50)),
        health_p99_ms=_ms(percentile(health, 99)),
        health_max_ms=_ms(max(health, default=0.0)),
    )
    return row


def server_args(args) -> list[str]:
    return [
        "--max-running",
        str(args.max_running),
        "--max-waiting",
        str(args.max_waiting),
        "--max-model-len",
        "2048",
        "--kv-cache-gib",
        "0.5",
    ]


async def warm_up(base_url: str, model: str, args) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
        for prompt in load_prompts(None, 2, args.input_words, seed=99):
            await stream_request(client, "completions", model, prompt, args.max_tokens, True, {"temperature": 0})


async def run(args, base_url: str) -> list[dict]:
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
    await warm_up(base_url, model, args)
    rows = [
        await phase(args, base_url, model, "fair", args.fair_concurrency),
        await phase(args, base_url, model, "flood", args.flood_factor * args.fair_concurrency),
    ]
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default=None, help="an existing server (default: start one)")
    p.add_argument("--max-running", type=int, default=16, help="the started server's --max-running")
    p.add_argument("--max-waiting", type=int, default=64, help="the started server's --max-waiting")
    p.add_argument("--fair-concurrency", type=int, default=None, help="a tenant's fair share (default max_running/2)")
    p.add_argument("--flood-factor", type=int, default=10)
    p.add_argument("--phase-s", type=float, default=30.0, help="seconds per phase")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--input-words", type=int, default=32)
    p.add_argument("--retry-s", type=float, default=None, help="pause after a 503 or 429 (default: its Retry-After)")
    p.add_argument("--tenants-by", choices=["user", "key"], default="user")
    p.add_argument("--keys", nargs=2, default=None, metavar="KEY", help="--tenants-by key: steady's and flood's")
    p.add_argument("--result-file", default=None, help="write the run (settings + rows) as one JSON document")
    p.add_argument("--quick", action="store_true", help="smoke mode: 2 phases of 3 s, tiny requests")
    args = p.parse_args()
    if args.quick:
        args.max_running, args.max_waiting, args.phase_s, args.max_tokens, args.input_words = 4, 8, 3.0, 4, 8
    if args.fair_concurrency is None:
        args.fair_concurrency = max(1, args.max_running // 2)
    if args.tenants_by == "key" and (args.keys is None or args.base_url is None):
        p.error("--tenants-by key needs --keys and --base-url (a server started with --config)")

    server = None
    if args.base_url is None:
        log_path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "trillium-overload-bench.log")
        server = Server("trillium", server_args(args), log_path)
    try:
        rows = trio.run(run, args, args.base_url or server.base_url)
    finally:
        if server is not None:
            server.stop()
    for row in rows:
        print(json.dumps(row), flush=True)
    fair, flood = rows
    summary = {
        "steady_ttft_p99_ratio": round(flood["steady_ttft_p99_ms"] / max(fair["steady_ttft_p99_ms"], 1e-9), 2),
        "health_p99_ms": max(fair["health_p99_ms"], flood["health_p99_ms"]),
        "failed": sum(r[f"{t}_failed"] for r in rows for t in ("steady", "flood")),
    }
    summary["targets_met"] = summary["steady_ttft_p99_ratio"] <= 2.0 and summary["health_p99_ms"] < 50.0
    print(json.dumps(summary), flush=True)
    if args.result_file:
        settings = {k: v for k, v in vars(args).items() if k != "keys"}
        doc = {"settings": settings, "machine": platform.platform(), "rows": rows, "summary": summary}
        with open(args.result_file, "w") as f:
            json.dump(doc, f, indent=2)
    sys.exit(1 if summary["failed"] else 0)


if __name__ == "__main__":
    main()
