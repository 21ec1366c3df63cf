"""Prefix-cache benchmark: TTFT of a long shared prefix, cold vs warm, through a streaming client.

    trillium serve --port 8000 &
    python bench/prefix_cache.py --base-url http://127.0.0.1:8000

Each trial builds a fresh ~1,500-token prefix (random words, so it cannot already be cached),
sends prefix + question A (cold: the whole prompt is prefilled), then prefix + question B
(warm: only the question is computed). TTFT is the time to the first streamed token. Prints
one JSON object with the medians and their ratio (target: warm <= 10% of cold), then the
radix-tree operation rates from ``bench/prefix_cache_ops.py`` (C++ tree vs a Python trie).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

import httpx

WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
    "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu"
).split()


def ttft(client: httpx.Client, model: str, prompt: str) -> tuple[float, int]:
    payload = {
        "model": model,
        "prompt": prompt,
        "max_tokens": 2,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    first = None
    cached = 0
    with client.stream("POST", "/v1/completions", json=payload) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk.get("choices"):
                first = time.perf_counter() - t0
            if chunk.get("usage"):
                cached = chunk["usage"]["prompt_tokens_details"]["cached_tokens"]
    return first if first is not None else time.perf_counter() - t0, cached


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--prefix-words", type=int, default=750, help="about two tokens per word")
    p.add_argument("--quick", action="store_true", help="smoke mode: 1 trial, short prefix")
    args = p.parse_args()
    if args.quick:
        args.trials, args.prefix_words = 1, 200
    rng = random.Random()
    cold, warm, hits = [], [], []
    with httpx.Client(base_url=args.base_url, timeout=600) as client:
        model = client.get("/v1/models").json()["data"][0]["id"]
        for trial in range(args.trials):
            prefix = " ".join(rng.choice(WORDS) for _ in range(args.prefix_words))
            c, _ = ttft(client, model, f"{prefix}\nQuestion: what is the first word?")
            w, cached = ttft(client, model, f"{prefix}\nQuestion: what is the last word?")
            cold.append(c)
            warm.append(w)
            hits.append(cached)
            print(f"trial {trial}: cold {c * 1000:.0f} ms, warm {w * 1000:.0f} ms, cached {cached}", file=sys.stderr)
    result = {
        "cold_ttft_ms": round(statistics.median(cold) * 1000, 1),
        "warm_ttft_ms": round(statistics.median(warm) * 1000, 1),
        "ratio": round(statistics.median(warm) / statistics.median(cold), 4),
        "cached_tokens": int(statistics.median(hits)),
        "trials": args.trials,
    }
    print(json.dumps(result), flush=True)
    ops = os.path.join(os.path.dirname(__file__), "prefix_cache_ops.py")
    if os.path.exists(ops):
        subprocess.run([sys.executable, ops, *(["--quick"] if args.quick else [])], check=True)


if __name__ == "__main__":
    main()
