"""A Python host using trillium's compiled core directly: no server, no actors, no model.

``trillium._core`` is the pybind11 module over the C++ core (installed with the ``trillium``
wheel). Here it allocates KV blocks for two requests, writes their K/V into a paged pool with
``store_kv`` and runs one decode step of ``paged_attention`` on the host's own numpy arrays,
checked against a naive numpy attention. Tensors cross as addresses plus sizes, in the named
specs of ``trillium.ops.kernel_specs`` (the fields the C++ side reads).

    python examples/embed/python/host.py      # prints one line; exit status 1 on a mismatch
"""

from __future__ import annotations

import sys

import numpy as np

from trillium import _core
from trillium.ops.kernel_specs import BatchSpec, CacheSpec, RowsSpec

BLOCK_SIZE, KV_HEADS, Q_HEADS, HEAD_DIM, NUM_BLOCKS = 16, 2, 4, 32, 16
FP32 = 0  # trillium::DType::kF32


def rows(x: np.ndarray) -> RowsSpec:
    """The spec of a C-contiguous float32 [T, heads, head_dim] array."""
    _, h, d = x.shape
    return RowsSpec(data_ptr=x.ctypes.data, num_heads=h, stride_token=h * d, stride_head=d, dtype=FP32)


def main() -> int:
    rng = np.random.default_rng(0)
    alloc = _core.BlockAllocator(NUM_BLOCKS)
    k_cache = np.zeros((NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM), dtype=np.float32)
    v_cache = np.zeros_like(k_cache)
    cache = CacheSpec(k_cache.ctypes.data, v_cache.ctypes.data, FP32, NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM)

    context = [37, 9]
    tables, keys, values = [], [], []
    for n in context:
        table = alloc.allocate(-(-n // BLOCK_SIZE))
        slots = np.array([table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(n)], dtype=np.int64)
        k = rng.standard_normal((n, KV_HEADS, HEAD_DIM), dtype=np.float32)
        v = rng.standard_normal((n, KV_HEADS, HEAD_DIM), dtype=np.float32)
        _core.store_kv(rows(k), rows(v), cache, slots.ctypes.data, n, 1)
        tables.append(table)
        keys.append(k)
        values.append(v)

    width = max(len(t) for t in tables)
    block_tables = np.zeros((2, width), dtype=np.int32)
    for r, t in enumerate(tables):
        block_tables[r, : len(t)] = t
    context_lens = np.array(context, dtype=np.int32)
    starts = np.arange(3, dtype=np.int32)
    batch = BatchSpec(2, 2, starts.ctypes.data, context_lens.ctypes.data, block_tables.ctypes.data, width)
    query = rng.standard_normal((2, Q_HEADS, HEAD_DIM), dtype=np.float32)
    out = np.full_like(query, np.nan)
    scale = HEAD_DIM**-0.5
    _core.paged_attention(rows(query), rows(out), cache, batch, scale, 1, True, 0, 0.0)

    worst = 0.0
    group = Q_HEADS // KV_HEADS
    for r in range(2):
        for h in range(Q_HEADS):
            scores = keys[r][:, h // group] @ query[r, h] * scale  # [n]
            weights = np.exp(scores - scores.max())
            expected = (weights / weights.sum()) @ values[r][:, h // group]
            worst = max(worst, float(np.abs(expected - out[r, h]).max()))
    for t in tables:
        alloc.free(t)
    print(f"python host: decode attention over trillium._core, max |error| {worst:.2e}")
    return 0 if worst < 1e-4 and alloc.num_free_blocks == NUM_BLOCKS else 1


if __name__ == "__main__":
    sys.exit(main())
