"""Serving metrics with vLLM ``benchmark_serving``'s definitions, from per-request records.

A record (one streamed request) has ``start``, ``chunk_times`` (arrival time of every streamed
chunk that carried text), ``end``, ``output_tokens``, ``prompt_tokens``, ``ok``. Definitions:

- TTFT: first text chunk - request start.
- TPOT: (end-to-end - TTFT) / (output tokens - 1), per request (requests with one token excluded).
- ITL: gaps between consecutive text chunks, pooled over requests (a chunk may carry several tokens
  when the server coalesces; vLLM counts chunks the same way).
- E2E: end - start.
- Throughputs: completed requests, output tokens and prompt+output tokens per second of wall time.
- Goodput: completed requests per second that met every given SLO (ttft / tpot / e2e, in ms).
"""

from __future__ import annotations

import itertools
import statistics

PERCENTILES = (50, 90, 99)


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), 0.0 for no values."""
    if not values:
        return 0.0
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def per_request(rec: dict) -> dict:
    """TTFT, TPOT, E2E (seconds) and ITL gaps of one record."""
    times = rec["chunk_times"]
    e2e = rec["end"] - rec["start"]
    ttft = (times[0] - rec["start"]) if times else e2e
    n = rec["output_tokens"]
    tpot = (e2e - ttft) / (n - 1) if n > 1 else None
    itl = [b - a for a, b in itertools.pairwise(times)]
    return {"ttft": ttft, "tpot": tpot, "e2e": e2e, "itl": itl}


def meets(slo: dict[str, float], m: dict) -> bool:
    for key, limit_ms in slo.items():
        value = m[key]
        if value is not None and value * 1000.0 > limit_ms:
            return False
    return True


def summarize(records: list[dict], wall_s: float, slo: dict[str, float] | None = None) -> dict:
    """One result row: counts, throughputs, and mean / p50 / p90 / p99 of TTFT, TPOT, ITL, E2E (ms)."""
    done = [r for r in records if r["ok"]]
    per = [per_request(r) for r in done]
    out_tokens = sum(r["output_tokens"] for r in done)
    in_tokens = sum(r["prompt_tokens"] for r in done)
    row = {
        "completed": len(done),
        "failed": len(records) - len(done),
        "wall_s": round(wall_s, 3),
        "request_throughput": round(len(done) / wall_s, 3) if wall_s else 0.0,
        "output_throughput": round(out_tokens / wall_s, 2) if wall_s else 0.0,
        "total_token_throughput": round((in_tokens + out_tokens) / wall_s, 2) if wall_s else 0.0,
        "mean_prompt_tokens": round(in_tokens / len(done), 1) if done else 0.0,
        "mean_output_tokens": round(out_tokens / len(done), 1) if done else 0.0,
    }
    series = {
        "ttft": [m["ttft"] for m in per],
        "tpot": [m["tpot"] for m in per if m["tpot"] is not None],
        "itl": [gap for m in per for gap in m["itl"]],
        "e2e": [m["e2e"] for m in per],
    }
    for name, values in series.items():
        row[f"{name}_mean_ms"] = round(1000 * statistics.fmean(values), 2) if values else 0.0
        for q in PERCENTILES:
            row[f"{name}_p{q}_ms"] = round(1000 * percentile(values, q), 2)
    if slo:
        good = sum(1 for m in per if meets(slo, m))
        row["goodput"] = round(good / wall_s, 3) if wall_s else 0.0
        row["slo"] = dict(slo)
    return row


def parse_slo(items: list[str] | None) -> dict[str, float] | None:
    """``["ttft:500", "tpot:100"]`` -> ``{"ttft": 500.0, "tpot": 100.0}`` (milliseconds)."""
    if not items:
        return None
    slo = {}
    for item in items:
        key, _, value = item.partition(":")
        if key not in ("ttft", "tpot", "e2e") or not value:
            raise ValueError(f"SLO {item!r}: expected ttft:MS, tpot:MS or e2e:MS")
        slo[key] = float(value)
    return slo
