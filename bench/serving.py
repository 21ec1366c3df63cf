"""Closed-loop serving benchmark for any OpenAI-compatible endpoint (streaming completions).

    python bench/serving.py --base-url http://127.0.0.1:8000 --concurrency 1 16 --num-requests 32

Each of ``concurrency`` clients sends requests back to back (prompts from the ShareGPT file
or synthetic), streams the answer, and records TTFT, TPOT and end-to-end latency with
vLLM's ``benchmark_serving`` definitions; output-token throughput is total output tokens
divided by wall time. Prints one JSON line per concurrency level and a Markdown table.
``--quick`` is a smoke mode that finishes in seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import httpx
import trio

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "sharegpt_first_turns_500.json")


def load_prompts(path: str | None, n: int, synthetic_len: int) -> list[str]:
    if path and os.path.exists(path):
        with open(path) as f:
            items = json.load(f)
        texts = [it["conversations"][0]["value"] for it in items]
        return [texts[i % len(texts)][:4000] for i in range(n)]
    return [("hello " * synthetic_len).strip() for _ in range(n)]


async def one_request(client: httpx.AsyncClient, model: str, prompt: str, max_tokens: int) -> dict:
    payload = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
               "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    token_times: list[float] = []
    usage = None
    async with client.stream("POST", "/v1/completions", json=payload) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                token_times.append(time.perf_counter())
    end = time.perf_counter()
    n_out = usage["completion_tokens"] if usage else len(token_times)
    ttft = (token_times[0] - t0) if token_times else end - t0
    tpot = (end - t0 - ttft) / (n_out - 1) if n_out > 1 else 0.0
    return {"ttft": ttft, "tpot": tpot, "e2e": end - t0, "output_tokens": n_out,
            "prompt_tokens": usage["prompt_tokens"] if usage else 0}


async def run_level(base_url: str, model: str, prompts: list[str], concurrency: int, max_tokens: int) -> dict:
    results: list[dict] = []
    queue = list(prompts)
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
        async def worker():
            while queue:
                prompt = queue.pop()
                results.append(await one_request(client, model, prompt, max_tokens))
                print(f"\r  concurrency {concurrency}: {len(results)}/{len(prompts)} requests", end="", file=sys.stderr)

        t0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(worker)
        wall = time.perf_counter() - t0
    print(file=sys.stderr)
    pct = lambda xs, q: statistics.quantiles(xs, n=100)[q - 1] if len(xs) > 1 else xs[0]  # noqa: E731
    out_tokens = sum(r["output_tokens"] for r in results)
    return {
        "concurrency": concurrency, "num_requests": len(results), "wall_s": round(wall, 2),
        "output_throughput": round(out_tokens / wall, 1),
        "request_throughput": round(len(results) / wall, 3),
        "ttft_p50_ms": round(1000 * statistics.median(r["ttft"] for r in results), 1),
        "ttft_p99_ms": round(1000 * pct([r["ttft"] for r in results], 99), 1),
        "tpot_p50_ms": round(1000 * statistics.median(r["tpot"] for r in results), 1),
        "e2e_p50_s": round(statistics.median(r["e2e"] for r in results), 2),
        "mean_prompt_tokens": round(statistics.mean(r["prompt_tokens"] for r in results), 1),
    }


async def main_async(args) -> list[dict]:
    async with httpx.AsyncClient(base_url=args.base_url, timeout=30) as client:
        model = args.model or (await client.get("/v1/models")).json()["data"][0]["id"]
    rows = []
    for c in args.concurrency:
        n = max(args.num_requests, c)
        prompts = load_prompts(None if args.synthetic else args.prompts, n, args.input_len)
        row = await run_level(args.base_url, model, prompts, c, args.max_tokens)
        row["model"] = model
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default=None)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--prompts", default=DATA, help="ShareGPT-style JSON list of prompts")
    p.add_argument("--synthetic", action="store_true", help="fixed-length synthetic prompts instead")
    p.add_argument("--input-len", type=int, default=128, help="synthetic prompt length (words)")
    p.add_argument("--quick", action="store_true", help="smoke mode: a few short requests")
    args = p.parse_args()
    if args.quick:
        args.concurrency, args.num_requests, args.max_tokens = [2], 4, 8
    rows = trio.run(main_async, args)
    print("\n| concurrency | output tok/s | req/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['concurrency']} | {r['output_throughput']} | {r['request_throughput']} | "
              f"{r['ttft_p50_ms']} | {r['ttft_p99_ms']} | {r['tpot_p50_ms']} |")


if __name__ == "__main__":
    main()
