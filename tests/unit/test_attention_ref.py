"""paged_attention / store_kv against dense causal attention, for both implementations: the torch
reference (trillium.ops.attention_ref) and the compiled kernels (trillium.ops.attention).

The kernels are tested at length in tests/kernels; here both implementations meet the same
independent dense oracle on small fixed batches."""

from __future__ import annotations

import math
import random

import pytest
import torch

from trillium.ops import attention, attention_ref
from trillium.ops.attention import AttentionMetadata

IMPLEMENTATIONS = [pytest.param(attention_ref, id="ref"), pytest.param(attention, id="kernel")]

NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM = 9, 3, 64  # GQA group of 3, like SmolLM2
NUM_BLOCKS = 64

# (cached_len, query_len) per request: pure prefill, prefill on a cached prefix, decode, mixes.
BATCHES = {
    "prefill": [(0, 7)],
    "prefill_ragged": [(0, 5), (0, 33), (0, 1)],
    "cached_prefix": [(16, 9), (31, 2)],
    "decode": [(0, 1), (15, 1), (16, 1), (40, 1), (70, 1)],
    "mixed": [(12, 1), (0, 20), (33, 1), (17, 17), (5, 1)],
}
TOLERANCE = {torch.float32: {"rtol": 1e-4, "atol": 1e-5}, torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2}}


def _block_tables(context_lens: list[int], block_size: int, rng: random.Random) -> list[list[int]]:
    """Disjoint random (non-contiguous) block ids per request; block 0 is left unused on purpose
    so that padding entries (0) point at poison."""
    free = list(range(1, NUM_BLOCKS))
    rng.shuffle(free)
    tables = []
    for n in context_lens:
        count = -(-n // block_size)
        tables.append([free.pop() for _ in range(count)])
    return tables


def _dense_reference(q, k, v, query_len: int, context_len: int, scale: float) -> torch.Tensor:
    """Plain fp32 causal attention for one request: q [n, Hq, D], k/v [ctx, Hkv, D] -> [n, Hq, D]."""
    group = NUM_Q_HEADS // NUM_KV_HEADS
    k = k.float().repeat_interleave(group, dim=1)  # [ctx, Hq, D]
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale  # [Hq, n, ctx]
    q_pos = torch.arange(context_len - query_len, context_len)[:, None]
    k_pos = torch.arange(context_len)[None, :]
    scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("batch", list(BATCHES))
def test_paged_attention_matches_dense(batch: str, block_size: int, dtype: torch.dtype, impl) -> None:
    rng = random.Random(f"{batch}-{block_size}")
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    spec = BATCHES[batch]
    query_lens = [n for _, n in spec]
    context_lens = [c + n for c, n in spec]
    tables = _block_tables(context_lens, block_size, rng)
    meta = AttentionMetadata.build(query_lens, context_lens, tables, block_size, "cpu")
    assert meta.is_decode_only == (batch == "decode")

    shape = (NUM_BLOCKS, block_size, NUM_KV_HEADS, HEAD_DIM)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)  # poison: any stray read shows up
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    full_k = [torch.randn(n, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(dtype) for n in context_lens]
    full_v = [torch.randn(n, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(dtype) for n in context_lens]
    # The cached prefix was stored by earlier steps.
    for table, (cached, _), k, v in zip(tables, spec, full_k, full_v):
        if cached:
            slots = torch.tensor([table[p // block_size] * block_size + p % block_size for p in range(cached)])
            impl.store_kv(k[:cached], v[:cached], k_cache, v_cache, slots)
    # This step: store the new tokens' K/V, then attend.
    new_k = torch.cat([k[c:] for (c, _), k in zip(spec, full_k)])  # [T, Hkv, D]
    new_v = torch.cat([v[c:] for (c, _), v in zip(spec, full_v)])
    impl.store_kv(new_k, new_v, k_cache, v_cache, meta.slot_mapping)
    query = torch.randn(sum(query_lens), NUM_Q_HEADS, HEAD_DIM, generator=gen).to(dtype)  # [T, Hq, D]
    scale = 1 / math.sqrt(HEAD_DIM)

    out = impl.paged_attention(query, k_cache, v_cache, meta, scale)
    assert out.shape == query.shape and out.dtype == dtype
    starts = meta.query_start_loc.tolist()
    for r, (n, ctx) in enumerate(zip(query_lens, context_lens)):
        q = query[starts[r] : starts[r + 1]]
        expected = _dense_reference(q, full_k[r], full_v[r], n, ctx, scale)
        torch.testing.assert_close(out[starts[r] : starts[r + 1]].float(), expected, **TOLERANCE[dtype])


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("block_size", [16, 32])
def test_store_kv_writes_exactly_the_slots(block_size: int, impl) -> None:
    gen = torch.Generator().manual_seed(0)
    shape = (8, block_size, NUM_KV_HEADS, HEAD_DIM)
    k_cache = torch.full(shape, -7.0)
    v_cache = torch.full(shape, -9.0)
    slots = torch.tensor([5, block_size + 1, 3 * block_size + block_size - 1, 7 * block_size])
    key = torch.randn(len(slots), NUM_KV_HEADS, HEAD_DIM, generator=gen)
    value = torch.randn(len(slots), NUM_KV_HEADS, HEAD_DIM, generator=gen)
    impl.store_kv(key, value, k_cache, v_cache, slots)
    flat_k = k_cache.view(-1, NUM_KV_HEADS, HEAD_DIM)
    flat_v = v_cache.view(-1, NUM_KV_HEADS, HEAD_DIM)
    torch.testing.assert_close(flat_k[slots], key, rtol=0, atol=0)
    torch.testing.assert_close(flat_v[slots], value, rtol=0, atol=0)
    untouched = torch.ones(flat_k.shape[0], dtype=torch.bool)
    untouched[slots] = False
    assert bool((flat_k[untouched] == -7.0).all()) and bool((flat_v[untouched] == -9.0).all())


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_store_kv_casts_to_cache_dtype(impl) -> None:
    k_cache = torch.zeros(2, 16, NUM_KV_HEADS, HEAD_DIM, dtype=torch.bfloat16)
    v_cache = torch.zeros_like(k_cache)
    key = torch.randn(1, NUM_KV_HEADS, HEAD_DIM)
    impl.store_kv(key, key, k_cache, v_cache, torch.tensor([17]))
    assert torch.equal(k_cache[1, 1], key[0].to(torch.bfloat16))


def test_build_metadata() -> None:
    meta = AttentionMetadata.build([3, 1], [18, 5], [[4, 9], [2]], 16, "cpu")
    assert (meta.query_start_loc.dtype, meta.context_lens.dtype, meta.block_tables.dtype) == (torch.int32,) * 3
    assert meta.slot_mapping.dtype == torch.int64
    assert meta.query_start_loc.tolist() == [0, 3, 4]
    assert meta.context_lens.tolist() == [18, 5]
    assert meta.block_tables.tolist() == [[4, 9], [2, 0]]
    # request 0: positions 15, 16, 17 -> block 4 offset 15, block 9 offsets 0 and 1
    assert meta.slot_mapping.tolist() == [4 * 16 + 15, 9 * 16, 9 * 16 + 1, 2 * 16 + 4]
    assert (meta.max_query_len, meta.max_context_len, meta.is_decode_only) == (3, 18, False)
    with pytest.raises(ValueError):
        AttentionMetadata.build([1], [40], [[1, 2]], 16, "cpu")  # table too short
