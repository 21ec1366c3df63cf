"""Decode paged attention: trillium's kernels vs torch gather + SDPA (the reference path).

Prints one JSON line per configuration:
  {"op", "batch", "context", "dtype", "trillium_us", "torch_us", "speedup", "gbps"}
where gbps is the KV bytes one call must read divided by trillium's time, plus one line with the
machine's measured read bandwidth ("op": "read_bandwidth") to compare it with.

Shapes are SmolLM2-135M's (9 query heads, 3 KV heads, head_dim 64, block_size 16); every
request's blocks are scattered through the pool, like a pool that has been in use for a while.

    python bench/kernels/paged_attention.py            # batch {1, 8, 32} x context {512, 2048, 8192}
    python bench/kernels/paged_attention.py --quick    # a smoke run of a few small configurations
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from trillium.ops import attention, attention_ref

NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 9, 3, 64, 16
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def timed_us(fn, reps: int, min_time_s: float) -> float:
    """Median wall time of fn() in microseconds, over >= reps calls and >= min_time_s."""
    fn()  # warm-up (plans, thread pools, page faults)
    times = []
    start = time.perf_counter()
    while len(times) < reps or time.perf_counter() - start < min_time_s:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def read_bandwidth_gbps(megabytes: int, reps: int) -> float:
    """Read bandwidth of a large float32 sum (all threads), GB/s: the bound a decode kernel can reach."""
    x = torch.ones(megabytes * (1 << 20) // 4)
    us = timed_us(lambda: x.sum(), reps, 0.2)
    return x.numel() * 4 / us / 1e3


def bench_decode(batch: int, context: int, dtype: torch.dtype, reps: int, min_time_s: float, gen) -> dict:
    blocks_per_request = -(-context // BLOCK_SIZE)
    num_blocks = batch * blocks_per_request + 1
    perm = torch.randperm(num_blocks - 1, generator=gen) + 1  # block 0 unused: padding target
    tables = perm[: batch * blocks_per_request].view(batch, blocks_per_request).tolist()
    meta = attention.AttentionMetadata.build([1] * batch, [context] * batch, tables, BLOCK_SIZE)
    shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    query = torch.randn(batch, NUM_Q_HEADS, HEAD_DIM, generator=gen).to(dtype)
    scale = HEAD_DIM**-0.5

    ours = timed_us(lambda: attention.paged_attention(query, k_cache, v_cache, meta, scale), reps, min_time_s)
    ref = timed_us(lambda: attention_ref.paged_attention(query, k_cache, v_cache, meta, scale), reps, min_time_s)
    kv_bytes = 2 * batch * context * NUM_KV_HEADS * HEAD_DIM * k_cache.element_size()
    return {
        "op": "paged_attention_decode",
        "batch": batch,
        "context": context,
        "dtype": "bf16" if dtype == torch.bfloat16 else "fp32",
        "trillium_us": round(ours, 1),
        "torch_us": round(ref, 1),
        "speedup": round(ref / ours, 2),
        "gbps": round(kv_bytes / ours / 1e3, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few small configurations, few repetitions")
    args = parser.parse_args()
    if args.quick:
        batches, contexts, reps, min_time_s, bw_mb = [1, 8], [512], 3, 0.0, 64
    else:
        batches, contexts, reps, min_time_s, bw_mb = [1, 8, 32], [512, 2048, 8192], 10, 0.5, 1024
    gen = torch.Generator().manual_seed(0)
    print(json.dumps({"op": "read_bandwidth", "gbps": round(read_bandwidth_gbps(bw_mb, reps), 1),
                      "threads": torch.get_num_threads()}), flush=True)
    for dtype_name in ("bf16", "fp32"):
        for batch in batches:
            for context in contexts:
                row = bench_decode(batch, context, DTYPES[dtype_name], reps, min_time_s, gen)
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
