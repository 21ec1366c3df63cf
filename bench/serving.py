"""Serving benchmark for any OpenAI-compatible endpoint: streamed requests, vLLM's metrics.

    python bench/serving.py --base-url http://127.0.0.1:8000 --concurrency 1 16 32 --num-requests 64
    python bench/serving.py --request-rate 2 4 inf --num-requests 100 --goodput ttft:1000 tpot:100
    python bench/serving.py --quick                 # smoke mode, well under a minute

Two load shapes:
- ``--concurrency N ...``: closed loop, N clients each sending its next request when the last ends.
- ``--request-rate R ...``: open loop, requests arrive as a Poisson process of R per second (``inf``:
  all at once), optionally capped by ``--max-concurrency``.

Prompts are ShareGPT first turns (``../shared/data/sharegpt_first_turns_500.json``) or, with
``--synthetic``, fixed-length text; every request asks for ``--max-tokens`` tokens with
``ignore_eos`` (servers that do not know the field ignore it), streamed, greedy unless
``--temperature`` / ``--top-p`` say otherwise. Metrics
(bench/serving_metrics.py): TTFT, TPOT, ITL, E2E mean/p50/p90/p99, request / output / total token
throughput, goodput under ``--goodput`` SLOs. Prints one JSON line per level and a Markdown table;
``--result-file`` writes the whole run (settings + rows) as one JSON document.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time

import httpx
import trio
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine
from serving_client import DATA, load_prompts, stream_request
from serving_metrics import parse_slo, summarize


def _sampling(args) -> dict:
    """The OpenAI sampling fields every request carries (greedy unless asked otherwise)."""
    out = {"temperature": args.temperature}
    if args.top_p < 1.0:
        out["top_p"] = args.top_p
    return out


async def closed_loop(client, args, model, prompts, concurrency, bar) -> list[dict]:
    records: list[dict] = []
    queue = list(prompts)

    async def worker() -> None:
        while queue:
            prompt = queue.pop()
            records.append(
                await stream_request(
                    client, args.endpoint, model, prompt, args.max_tokens, args.ignore_eos, _sampling(args)
                )
            )
            bar.update(1)

    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    return records


async def open_loop(client, args, model, prompts, rate, bar) -> list[dict]:
    records: list[dict] = []
    limiter = trio.CapacityLimiter(args.max_concurrency) if args.max_concurrency else None
    rng = random.Random(args.seed)

    async def one(prompt: str) -> None:
        if limiter is None:
            rec = await stream_request(
                client, args.endpoint, model, prompt, args.max_tokens, args.ignore_eos, _sampling(args)
            )
        else:
            async with limiter:
                rec = await stream_request(
                    client, args.endpoint, model, prompt, args.max_tokens, args.ignore_eos, _sampling(args)
                )
        records.append(rec)
        bar.update(1)

    async with trio.open_nursery() as nursery:
        for prompt in prompts:
            nursery.start_soon(one, prompt)
            if math.isfinite(rate):
                await trio.sleep(rng.expovariate(rate))
    return records


async def run(args) -> list[dict]:
    # A fresh connection per request: llama-server closes idle keep-alive connections, and a reused
    # one it has just closed fails the request ("Server disconnected") through no fault of the load.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(
        base_url=args.base_url, timeout=httpx.Timeout(1800, connect=30), limits=limits
    ) as client:
        model = args.model or (await client.get("/v1/models")).json()["data"][0]["id"]
        levels = [("concurrency", c) for c in args.concurrency or []] + [
            ("request_rate", r) for r in args.request_rate or []
        ]
        rows = []
        for kind, value in levels:
            n = max(args.num_requests, int(value) if kind == "concurrency" else 1)
            prompts = load_prompts(None if args.synthetic else args.prompts, n, args.input_len, args.seed)
            label = f"{kind.replace('_', ' ')} {value:g}"
            with tqdm(total=n, desc=label, unit="req", file=sys.stderr, disable=args.no_progress) as bar:
                start = time.perf_counter()
                if kind == "concurrency":
                    records = await closed_loop(client, args, model, prompts, int(value), bar)
                else:
                    records = await open_loop(client, args, model, prompts, value, bar)
                wall = time.perf_counter() - start
            row = {
                "model": model,
                kind: value if kind == "request_rate" else int(value),
                **summarize(records, wall, args.slo),
            }
            errors = [r["error"] for r in records if not r["ok"]]
            if errors:
                row["first_error"] = errors[0]
            print(json.dumps(row), flush=True)
            rows.append(row)
        return rows


def markdown(rows: list[dict]) -> str:
    head = (
        "| load | done | output tok/s | req/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms | ITL p50 / p99 ms |"
        " E2E p50 s |" + (" goodput req/s |" if any("goodput" in r for r in rows) else "")
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        load = f"{r['concurrency']} streams" if "concurrency" in r else f"{r['request_rate']:g} req/s"
        line = (
            f"| {load} | {r['completed']} | {r['output_throughput']:.1f} | {r['request_throughput']:.2f} | "
            f"{r['ttft_p50_ms']:.0f} / {r['ttft_p99_ms']:.0f} | {r['tpot_p50_ms']:.1f} / {r['tpot_p99_ms']:.1f} | "
            f"{r['itl_p50_ms']:.1f} / {r['itl_p99_ms']:.1f} | {r['e2e_p50_ms'] / 1000:.2f} |"
        )
        if "goodput" in r:
            line += f" {r['goodput']:.2f} |"
        lines.append(line)
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="model id (default: the server's first)")
    p.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    p.add_argument("--concurrency", type=int, nargs="*", help="closed-loop client counts")
    p.add_argument("--request-rate", type=float, nargs="*", help="open-loop Poisson rates (req/s; inf = all at once)")
    p.add_argument("--max-concurrency", type=int, default=None, help="cap on in-flight requests (open loop)")
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false", help="let requests stop at EOS")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (the default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--prompts", default=DATA, help="ShareGPT-style JSON list of conversations")
    p.add_argument("--synthetic", action="store_true", help="fixed-length synthetic prompts instead")
    p.add_argument("--input-len", type=int, default=128, help="synthetic prompt length (words)")
    p.add_argument("--goodput", nargs="*", metavar="SLO", help="SLOs in ms, e.g. ttft:1000 tpot:100 e2e:20000")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--result-file", default=None, help="write the run (settings + rows) as one JSON document")
    p.add_argument("--label", default=None, help="engine name recorded in the result file")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--quick", action="store_true", help="smoke mode: a few short requests, both load shapes")
    args = p.parse_args()
    if args.quick:
        args.concurrency, args.request_rate, args.num_requests, args.max_tokens = [2], [8.0], 4, 8
    elif not args.concurrency and not args.request_rate:
        args.concurrency = [1, 16]
    args.slo = parse_slo(args.goodput)
    rows = trio.run(run, args)
    print()
    print(markdown(rows))
    if args.result_file:
        doc = {
            "label": args.label,
            "base_url": args.base_url,
            "endpoint": args.endpoint,
            "max_tokens": args.max_tokens,
            "num_requests": args.num_requests,
            "ignore_eos": args.ignore_eos,
            "sampling": _sampling(args),
            "prompts": "synthetic" if args.synthetic else os.path.basename(args.prompts),
            "seed": args.seed,
            "machine": machine.describe(),
            "command": machine.without_root(" ".join(sys.argv)),  # the repository path is no result
            "rows": rows,
        }
        with open(args.result_file, "w") as f:
            json.dump(doc, f, indent=2)


if __name__ == "__main__":
    main()
