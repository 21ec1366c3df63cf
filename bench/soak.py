"""Soak: thousands of mixed requests against one server, then check that nothing leaked.

    python bench/soak.py                        # 3000 requests, 32 clients, at most 15 minutes
    python bench/soak.py --requests 10000 --concurrency 64
    python bench/soak.py --smoke                # 80 requests, 8 clients: that it runs (tests)

The server runs in this process (``serve_engine`` on a loopback port, the real default model, a
KV pool small enough that requests are preempted), so that at the end the allocator's and the
radix tree's own invariant checks can run on it. Clients are httpx on the same event loop. Each
request is drawn at random: chat or legacy completions, streamed or not, ``n`` of 1 to 3, one of
four shared system prompts (prefix-cache hits), sometimes structured output (``json_object`` or
a ``choice``), and about one in four is cut off by its client at a random point (before the
answer, or after some SSE chunks) -- some of those while preempted. The first ``--warmup``
requests are not counted for memory.

At the end, once the server is idle, it checks: every request got an answer (2xx, 4xx, 429 or
503 with Retry-After; no other 5xx, no SSE error event, no transport error other than our own
disconnects), zero requests running or waiting, zero KV blocks held (cached blocks are free to
evict), ``check_invariants`` of the allocator and the radix tree, and resident memory grown by at
most ``--max-rss-growth-mb`` (64) since warm-up. Prints a JSON summary and a Markdown table;
exits 1 if a check failed. Bounded in count (``--requests``) and time (``--max-seconds``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import sys
import time
from typing import Any

import httpx
import trio

from trillium.config import EngineConfig
from trillium.launch import Engine
from trillium.serve import serve_engine

SYSTEM_PROMPTS = [
    "You are a helpful assistant. Answer briefly and precisely. " * 4,
    "You are a pirate. Answer every question as a pirate would, with gusto. " * 3,
    "You are a careful proofreader: quote the user's text back with every typo fixed. " * 3,
    "You translate English into French. Keep names and numbers unchanged. " * 3,
]
QUESTIONS = ["What is 2 + 2?", "Name a colour.", "Write a haiku about rain.", "Count to ten.", "Say hello."]


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def random_request(rng: random.Random) -> tuple[str, dict[str, Any], float | None]:
    """(path, body, seconds after which the client hangs up or None)."""
    system = rng.choice(SYSTEM_PROMPTS)
    question = rng.choice(QUESTIONS)
    body: dict[str, Any] = {
        "max_tokens": rng.randint(1, 48),
        "temperature": rng.choice([0.0, 0.7, 1.0]),
        "n": rng.choice([1, 1, 1, 2, 3]),
        "stream": rng.random() < 0.5,
    }
    if rng.random() < 0.7:
        path = "/v1/chat/completions"
        body["messages"] = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        roll = rng.random()
        if roll < 0.08:
            body["response_format"] = {"type": "json_object"}
        elif roll < 0.14:
            body["structured_outputs"] = {"choice": ["yes", "no", "maybe"]}
    else:
        path = "/v1/completions"
        body["prompt"] = system + "\nQ: " + question + "\nA:"
    if rng.random() < 0.1:
        body["max_tokens"] = rng.randint(100, 300)  # long ones: they hold blocks and get preempted
        body["ignore_eos"] = True
    hang_up = rng.uniform(0.0, 1.5) if rng.random() < 0.25 else None
    return path, body, hang_up


class Tally:
    def __init__(self) -> None:
        self.status: dict[str, int] = {}
        self.problems: list[str] = []
        self.disconnects = 0

    def count(self, key: str) -> None:
        self.status[key] = self.status.get(key, 0) + 1


async def one_request(client: httpx.AsyncClient, rng: random.Random, tally: Tally) -> None:
    path, body, hang_up = random_request(rng)
    with trio.move_on_after(hang_up if hang_up is not None else 1e9) as scope:
        try:
            if body["stream"]:
                async with client.stream("POST", path, json=body) as r:
                    tally.count(str(r.status_code))
                    async for line in r.aiter_lines():
                        if line.startswith("data: {") and '"error"' in line and json.loads(line[6:]).get("error"):
                            tally.problems.append(f"SSE error event: {line[:300]}")
            else:
                r = await client.post(path, json=body)
                tally.count(str(r.status_code))
                check_status(r, tally)
        except httpx.TransportError as exc:
            tally.problems.append(f"transport error: {type(exc).__name__}: {exc}")
    if scope.cancelled_caught:
        tally.disconnects += 1


def check_status(r: httpx.Response, tally: Tally) -> None:
    if r.status_code in (429, 503) and "retry-after" not in r.headers:
        tally.problems.append(f"{r.status_code} without Retry-After")
    elif r.status_code >= 500 and r.status_code != 503:
        tally.problems.append(f"{r.status_code}: {r.text[:300]}")


async def wait_idle(client: httpx.AsyncClient, within_s: float) -> dict[str, Any]:
    """The server's stats once it is idle with no block held, or after ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while True:
        stats: dict[str, Any] = (await client.get("/stats")).json()
        idle = stats["num_requests_running"] == 0 and stats["num_requests_waiting"] == 0
        if (idle and stats["num_blocks_in_use"] == 0) or time.monotonic() > deadline:
            return stats
        await trio.sleep(0.1)


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    config = EngineConfig(
        dtype="fp32",
        max_model_len=1024,
        kv_cache_gib=args.kv_cache_gib,
        max_running=args.max_running,
        num_threads=args.num_threads,
    )
    engine = Engine(config, progress=False)
    rng = random.Random(args.seed)
    tally = Tally()
    result: dict[str, Any] = {}
    async with trio.open_nursery() as server:
        urls = await server.start(
            lambda task_status: serve_engine(
                engine, host="127.0.0.1", port=0, handle_signals=False, task_status=task_status
            )
        )
        limits = httpx.Limits(max_connections=args.concurrency + 4, max_keepalive_connections=args.concurrency)
        async with httpx.AsyncClient(base_url=urls[0], timeout=300, limits=limits) as client:
            started = time.monotonic()
            next_index = 0
            rss_after_warmup: float | None = None
            warmed = trio.Event()

            async def worker() -> None:
                nonlocal next_index, rss_after_warmup
                while next_index < args.requests and time.monotonic() - started < args.max_seconds:
                    index = next_index
                    next_index += 1
                    if index == args.warmup:
                        await wait_idle(client, 60)  # sample memory with nothing in flight
                        gc.collect()
                        rss_after_warmup = rss_mb()
                        warmed.set()
                    await one_request(client, rng, tally)

            async with trio.open_nursery() as workers:
                for _ in range(args.concurrency):
                    workers.start_soon(worker)
            elapsed = time.monotonic() - started
            stats = await wait_idle(client, 30)
            gc.collect()
            rss_end = rss_mb()
        kv = engine.scheduler.policy.kv
        invariants = "ok"
        try:
            kv.check_invariants()
        except Exception as exc:  # the check raises on a broken invariant
            invariants = f"{type(exc).__name__}: {exc}"
        server.cancel_scope.cancel()
    growth = rss_end - (rss_after_warmup if rss_after_warmup is not None else rss_end)
    result = {
        "requests": next_index,
        "concurrency": args.concurrency,
        "seconds": round(elapsed, 1),
        "status": dict(sorted(tally.status.items())),
        "client_disconnects": tally.disconnects,
        "problems": tally.problems[:20],
        "num_problems": len(tally.problems),
        "num_preemptions": stats["num_preemptions"],
        "final_running": stats["num_requests_running"],
        "final_waiting": stats["num_requests_waiting"],
        "final_blocks_in_use": stats["num_blocks_in_use"],
        "cached_blocks": stats["num_cached_blocks"],
        "invariants": invariants,
        "rss_after_warmup_mb": round(rss_after_warmup or 0.0, 1),
        "rss_end_mb": round(rss_end, 1),
        "rss_growth_mb": round(growth, 1),
        "max_rss_growth_mb": args.max_rss_growth_mb,
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
    }
    result["ok"] = (
        not tally.problems
        and stats["num_requests_running"] == 0
        and stats["num_requests_waiting"] == 0
        and stats["num_blocks_in_use"] == 0
        and invariants == "ok"
        and growth <= args.max_rss_growth_mb
    )
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--warmup", type=int, default=None, help="requests before the memory baseline (default: 10%%)")
    p.add_argument("--max-seconds", type=float, default=900)
    p.add_argument("--max-rss-growth-mb", type=float, default=64)
    p.add_argument("--kv-cache-gib", type=float, default=0.03, help="small, so that long requests are preempted")
    p.add_argument("--max-running", type=int, default=24)
    p.add_argument("--num-threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="80 requests, 8 clients")
    args = p.parse_args()
    if args.smoke:
        args.requests, args.concurrency = 80, 8
    if args.warmup is None:
        args.warmup = max(1, args.requests // 10)
    result = trio.run(soak, args)
    print(json.dumps(result))
    print()
    print(
        "| requests | clients | seconds | disconnects | preemptions | problems | blocks held | invariants | RSS growth |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    print(
        f"| {result['requests']} | {result['concurrency']} | {result['seconds']} | {result['client_disconnects']} "
        f"| {result['num_preemptions']} | {result['num_problems']} | {result['final_blocks_in_use']} "
        f"| {result['invariants']} | {result['rss_growth_mb']} MB |"
    )
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
