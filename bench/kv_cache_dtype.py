"""Decode-step time with the KV cache in fp32 and in bf16 (``--kv-cache-dtype``), same model, same
arithmetic otherwise (the default model's weights as ``--weights auto`` serves them, fp32
activations).

    python bench/kv_cache_dtype.py            # batch x context: 1 x 512, 32 x 384, 32 x 1024
    python bench/kv_cache_dtype.py --quick    # a smoke run

One decode step of B requests at context C (one new token each; every request's blocks its own),
the whole forward and the output head, timed alternately for the two pools (median of the steps
after a warm-up). Prints one JSON line per shape: step milliseconds per dtype and fp32 / bf16.
A bf16 pool reads half the bytes per cached token; the attention kernels widen it in registers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import describe
from trillium.models import default_model_path, load_model
from trillium.ops.attention import AttentionMetadata

BLOCK_SIZE = 16
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--steps", type=int, default=16)
    args = p.parse_args()
    shapes = [(2, 64)] if args.quick else [(1, 512), (32, 384), (32, 1024)]
    steps = 4 if args.quick else args.steps
    model, _ = load_model(default_model_path(), torch.float32, progress=False, quantized=True)
    print(json.dumps({"machine": describe()}), flush=True)
    for batch, context in shapes:
        per_request = context // BLOCK_SIZE + 1
        pools = {}
        for name, dtype in DTYPES.items():
            pool = model.allocate_kv_caches(batch * per_request + 1, BLOCK_SIZE, dtype=dtype)
            for k, v in pool:
                k.normal_()
                v.normal_()
            pools[name] = pool
        tables = [list(range(1 + r * per_request, 1 + (r + 1) * per_request)) for r in range(batch)]
        meta = AttentionMetadata.build([1] * batch, [context] * batch, tables, BLOCK_SIZE)
        tokens = torch.randint(0, 1000, (batch,))
        positions = torch.full((batch,), context - 1)
        times: dict[str, list[float]] = {name: [] for name in pools}
        with torch.inference_mode():
            for _ in range(steps):
                for name, pool in pools.items():  # alternately: drifts in the machine hit both
                    started = time.perf_counter()
                    model.compute_logits(model(tokens, positions, pool, meta))
                    times[name].append(time.perf_counter() - started)
        ms = {name: statistics.median(t[min(3, steps - 1) :]) * 1000 for name, t in times.items()}
        print(
            json.dumps(
                {
                    "batch": batch,
                    "context": context,
                    "fp32_ms": round(ms["fp32"], 2),
                    "bf16_ms": round(ms["bf16"], 2),
                    "fp32_over_bf16": round(ms["fp32"] / ms["bf16"], 3),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
