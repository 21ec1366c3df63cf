"""Paged attention kernels vs torch gather + SDPA (trillium.ops.attention_ref), on this machine.

Prints one JSON line per configuration:
  {"op", "batch", "context", "dtype", "trillium_us", "torch_us", "speedup", "gbps"}
where gbps is the KV bytes one call must read divided by trillium's time (median of repeated
calls), and first one line with the machine's read bandwidth ("op": "read_bandwidth": the best of
a few large multi-threaded torch sums) to compare it with.

  paged_attention_decode   batch {1, 8, 32} x context {512, 2048, 8192}, bf16 and fp32
  paged_attention_extend   (full run only) one request's prefill chunk of "new_tokens" tokens on
                           a cached prefix of context - new_tokens tokens; adds "gflops"

Shapes are SmolLM2-135M's (9 query heads, 3 KV heads, head_dim 64, block_size 16); every
request's blocks are scattered through the pool, like a pool that has been in use for a while.
Threads: torch's (``OMP_NUM_THREADS`` / ``torch.set_num_threads``), shared by both sides.

    python bench/kernels/paged_attention.py            # everything (~1 minute on 2 cores)
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


def read_bandwidth_gbps(megabytes: int, reps: int, trials: int) -> float:
    """Read bandwidth of a large float32 sum (all threads), GB/s: about the bound a decode kernel can
    reach. The best of a few trials, so that a burst of other load on the machine does not lower it."""
    x = torch.ones(megabytes * (1 << 20) // 4)
    best_us = min(timed_us(lambda: x.sum(), reps, 0.2) for _ in range(trials))
    return x.numel() * 4 / best_us / 1e3


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


def bench_extend(context: int, new_tokens: int, dtype: torch.dtype, reps: int, gen) -> dict:
    cached = context - new_tokens
    blocks = -(-context // BLOCK_SIZE)
    table = (torch.randperm(blocks, generator=gen) + 1).tolist()
    meta = attention.AttentionMetadata.build([new_tokens], [context], [table], BLOCK_SIZE)
    shape = (blocks + 1, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    query = torch.randn(new_tokens, NUM_Q_HEADS, HEAD_DIM, generator=gen).to(dtype)
    scale = HEAD_DIM**-0.5
    ours = timed_us(lambda: attention.paged_attention(query, k_cache, v_cache, meta, scale), reps, 0.5)
    ref = timed_us(lambda: attention_ref.paged_attention(query, k_cache, v_cache, meta, scale), reps, 0.5)
    kv_bytes = 2 * context * NUM_KV_HEADS * HEAD_DIM * k_cache.element_size()
    flops = 4 * new_tokens * (cached + (new_tokens + 1) / 2) * NUM_Q_HEADS * HEAD_DIM  # QK and PV, causal
    return {
        "op": "paged_attention_extend",
        "batch": 1,
        "context": context,
        "new_tokens": new_tokens,
        "dtype": "bf16" if dtype == torch.bfloat16 else "fp32",
        "trillium_us": round(ours, 1),
        "torch_us": round(ref, 1),
        "speedup": round(ref / ours, 2),
        "gbps": round(kv_bytes / ours / 1e3, 1),
        "gflops": round(flops / ours / 1e3, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few small configurations, few repetitions")
    args = parser.parse_args()
    if args.quick:
        batches, contexts, reps, min_time_s, bw_mb, bw_trials = [1, 8], [512], 3, 0.0, 64, 1
    else:
        batches, contexts, reps, min_time_s, bw_mb, bw_trials = [1, 8, 32], [512, 2048, 8192], 10, 0.5, 1024, 3
    gen = torch.Generator().manual_seed(0)
    bandwidth = read_bandwidth_gbps(bw_mb, reps, bw_trials)
    print(
        json.dumps({"op": "read_bandwidth", "gbps": round(bandwidth, 1), "threads": torch.get_num_threads()}),
        flush=True,
    )
    for dtype_name in ("bf16", "fp32"):
        for batch in batches:
            for context in contexts:
                row = bench_decode(batch, context, DTYPES[dtype_name], reps, min_time_s, gen)
                print(json.dumps(row), flush=True)
    if not args.quick:
        for dtype_name in ("bf16", "fp32"):
            for context, new_tokens in ((2048, 2048), (2048, 512), (512, 512)):
                print(json.dumps(bench_extend(context, new_tokens, DTYPES[dtype_name], 5, gen)), flush=True)


if __name__ == "__main__":
    main()
