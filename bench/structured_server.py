"""JSONSchemaBench schemas on the real server, sampled: how outputs end, and whether the value
checks ever hold up the server.

    python bench/structured_server.py                          # Handwritten, 1 seed, temperature 1
    python bench/structured_server.py --subset Synthesized --seeds 2
    python bench/structured_server.py --quick                  # smoke mode: 6 schemas
    python bench/structured_server.py --url http://host:8000   # an already running server
    python bench/structured_server.py --dump out.jsonl         # + one line per request: why it failed

Starts ``trillium serve`` (default model and flags) on a free port unless ``--url`` is given,
sends every schema of ``--subset`` once per seed as a chat completion with
``structured_outputs.json`` (the schema also in the prompt), ``--concurrency`` at a time, and
validates each answer with ``jsonschema``. Meanwhile a thread asks ``/health`` every 0.2 s: its
latency is how long the event loop was held (the update of a step with schema checks, closing
searches included, runs on a worker thread; a held GIL still shows here).
Prints one JSON line: outputs by how they ended (``stop``/``length``, closed early or not,
flagged -- the response names a check its closing fails -- or not, valid / invalid / unparsable;
errors; 400s), /health latency p50 / p99 / max, wall seconds.
A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema

from metering_overhead import Server  # bench/ is on the path when a script of it runs

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "jsonschemabench")


def poll_health(url: str, stop: threading.Event, latencies: list[float]) -> None:
    with httpx.Client(base_url=url, timeout=120) as client:
        while not stop.is_set():
            start = time.perf_counter()
            try:
                client.get("/health")
            except httpx.HTTPError:
                pass
            latencies.append(time.perf_counter() - start)
            stop.wait(0.2)


def outcome(response: httpx.Response | None, schema: dict) -> tuple[str, str]:
    """How a request ended, and why (the error, or the failing keyword, its path and the output)."""
    if response is None:
        return "timeout", ""
    if response.status_code != 200:
        why = response.text[:300]
        return ("refused (400)" if response.status_code == 400 else f"error {response.status_code}"), why
    body = response.json()
    choice = body["choices"][0]
    how = choice["finish_reason"] + (" closed" if body.get("closed_early") or choice.get("closed_early") else "")
    how += " flagged" if choice.get("unsatisfied_check") else ""  # the server says the closing fails a check
    try:
        jsonschema.validate(json.loads(choice["message"]["content"]), schema)
        return how + " valid", ""
    except json.JSONDecodeError as e:
        return how + " unparsable", str(e)
    except jsonschema.ValidationError as e:
        where = "/".join(map(str, e.absolute_path))
        return how + " invalid", f"{e.validator} at /{where}: {choice['message']['content'][:2000]}"
    except jsonschema.SchemaError:
        return "schema the validator rejects", ""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--subset", default="Handwritten")
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument(
        "--timeout", type=float, default=300.0, help="seconds a request may take before it counts as a timeout"
    )
    p.add_argument("--url", help="a running server (default: start one)")
    p.add_argument("--quick", action="store_true", help="smoke mode: the first 6 schemas")
    p.add_argument("--dump", help="write one JSON line per request (schema file, seed, outcome, why) here")
    args = p.parse_args()
    files = sorted(glob.glob(os.path.join(DATA, f"{args.subset}---*.json")))[: 6 if args.quick else None]
    if not files:
        raise SystemExit(f"no {args.subset} schemas under {DATA}")
    cases = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            cases.append((os.path.basename(path), json.load(f)["schema"]))
    log_path = os.path.join(tempfile.gettempdir(), f"structured_server-{os.getpid()}.log")  # the server's log
    server = None if args.url else Server("trillium", [], log_path)
    url = args.url or server.base_url
    stop, latencies = threading.Event(), []
    poller = threading.Thread(target=poll_health, args=(url, stop, latencies), daemon=True)
    try:
        client = httpx.Client(base_url=url, timeout=args.timeout)

        def one(case: tuple[tuple[str, dict], int]) -> dict:
            (name, schema), seed = case
            body = {
                "messages": [{"role": "user", "content": f"Reply with JSON for this schema: {json.dumps(schema)}"}],
                "max_tokens": args.max_tokens,
                "temperature": args.temperature,
                "seed": seed,
                "structured_outputs": {"json": schema},
            }
            try:
                how, why = outcome(client.post("/v1/chat/completions", json=body), schema)
            except httpx.TimeoutException:
                how, why = outcome(None, schema)
            return {"schema": name, "seed": seed, "outcome": how, "why": why}

        poller.start()
        start = time.perf_counter()
        with ThreadPoolExecutor(args.concurrency) as pool:
            results = list(pool.map(one, [(c, seed) for c in cases for seed in range(args.seeds)]))
        counts = collections.Counter(r["outcome"] for r in results)
        seconds = time.perf_counter() - start
    finally:
        stop.set()
        if server is not None:
            server.stop()
            os.unlink(log_path)
    if args.dump:
        with open(args.dump, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in results)
    latencies.sort()
    valid = sum(n for k, n in counts.items() if k.endswith(" valid"))
    print(
        json.dumps(
            {
                "subset": args.subset,
                "requests": sum(counts.values()),
                "valid": valid,
                "outcomes": dict(sorted(counts.items())),
                "health_ms": {
                    "p50": round(1e3 * latencies[len(latencies) // 2]) if latencies else None,
                    "p99": round(1e3 * latencies[int(0.99 * (len(latencies) - 1))]) if latencies else None,
                    "max": round(1e3 * latencies[-1]) if latencies else None,
                },
                "seconds": round(seconds, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
