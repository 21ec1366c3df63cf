"""Prefix-cache benchmark: TTFT of a long shared prefix, cold vs warm, through a streaming client.

    trillium serve --port 8000 &
    python bench/prefix_cache.py --base-url http://127.0.0.1:8000
    # a server with --config: one tenant's key, and another's for the cross-tenant probe
    python bench/prefix_cache.py --api-key sk-example-acme --probe-key sk-example-globex

Each trial builds a fresh ~1,500-token prefix (random words, so it cannot already be cached),
sends prefix + question A (cold: the whole prompt is prefilled), then prefix + question B
(warm: only the question is computed). TTFT is the time to the first streamed token. Prints
one JSON object with the medians and their ratio (target: warm <= 10% of cold), then the
radix-tree operation rates from ``bench/prefix_cache_ops.py`` (C++ tree vs a Python trie).

Also a multi-turn chat (``--turns``, default 6): each turn sends the conversation so far plus a
new question, as a chat client does; ``chat_hit_rate`` is cached / prompt tokens over the turns
after the first (what the prefix cache saves one tenant). With ``--probe-key``, each trial's warm
prompt is sent again with another tenant's key: ``probe_cached_tokens`` must be 0 and
``probe_ttft_ms`` a cold prefill's (tenants' namespaces are apart: the prompt-stealing probe).
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


def chat_hit_rate(client: httpx.Client, model: str, turns: int, rng: random.Random) -> float:
    """Cached / prompt tokens over turns 2..``turns`` of one greedy conversation."""
    topic = " ".join(rng.choice(WORDS) for _ in range(60))
    messages = [{"role": "system", "content": f"You answer questions about these words: {topic}"}]
    prompt = cached = 0
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Question {turn}: which word comes after {rng.choice(WORDS)}?"})
        body = {"model": model, "messages": messages, "max_tokens": 32, "temperature": 0}
        r = client.post("/v1/chat/completions", json=body)
        r.raise_for_status()
        answer = r.json()
        messages.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
        if turn > 0:
            prompt += answer["usage"]["prompt_tokens"]
            cached += answer["usage"]["prompt_tokens_details"]["cached_tokens"]
    return cached / prompt if prompt else 0.0


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
    p.add_argument("--turns", type=int, default=6, help="turns of the multi-turn chat (0: none)")
    p.add_argument("--api-key", help="the tenant's key, on a server with --config")
    p.add_argument("--probe-key", help="another tenant's key: send each warm prompt again with it")
    args = p.parse_args()
    if args.quick:
        args.trials, args.prefix_words, args.turns = 1, 200, 2
    rng = random.Random()
    cold, warm, hits, probe, probe_hits = [], [], [], [], []
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    with (
        httpx.Client(base_url=args.base_url, timeout=600, headers=headers) as client,
        httpx.Client(
            base_url=args.base_url, timeout=600, headers={"Authorization": f"Bearer {args.probe_key}"}
        ) as other,
    ):
        model = client.get("/v1/models").json()["data"][0]["id"]
        for trial in range(args.trials):
            prefix = " ".join(rng.choice(WORDS) for _ in range(args.prefix_words))
            c, _ = ttft(client, model, f"{prefix}\nQuestion: what is the first word?")
            w, cached = ttft(client, model, f"{prefix}\nQuestion: what is the last word?")
            cold.append(c)
            warm.append(w)
            hits.append(cached)
            line = f"trial {trial}: cold {c * 1000:.0f} ms, warm {w * 1000:.0f} ms, cached {cached}"
            if args.probe_key:
                t, n = ttft(other, model, f"{prefix}\nQuestion: what is the last word?")
                probe.append(t)
                probe_hits.append(n)
                line += f"; another tenant: {t * 1000:.0f} ms, cached {n}"
            print(line, file=sys.stderr)
        # The same conversation every run (greedy, a fixed topic): hit rates compare across runs.
        hit_rate = chat_hit_rate(client, model, args.turns, random.Random(0)) if args.turns > 1 else None
    result = {
        "cold_ttft_ms": round(statistics.median(cold) * 1000, 1),
        "warm_ttft_ms": round(statistics.median(warm) * 1000, 1),
        "ratio": round(statistics.median(warm) / statistics.median(cold), 4),
        "cached_tokens": int(statistics.median(hits)),
        "chat_hit_rate": None if hit_rate is None else round(hit_rate, 4),
        "trials": args.trials,
    }
    if probe:
        result["probe_ttft_ms"] = round(statistics.median(probe) * 1000, 1)
        result["probe_cached_tokens"] = max(probe_hits)
    print(json.dumps(result), flush=True)
    ops = os.path.join(os.path.dirname(__file__), "prefix_cache_ops.py")
    if os.path.exists(ops):
        subprocess.run([sys.executable, ops, *(["--quick"] if args.quick else [])], check=True)


if __name__ == "__main__":
    main()
