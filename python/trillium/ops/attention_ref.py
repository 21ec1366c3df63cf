"""Torch reference for paged attention and the KV store: gather the paged KV, call SDPA.

Used by tests (tests/kernels, tests/unit/test_attention_ref.py) and the benchmark as the oracle for
the compiled kernels that :mod:`trillium.ops.attention` dispatches to; never on the serving path.
Same contracts and signatures as :func:`trillium.ops.attention.store_kv` and
:func:`trillium.ops.attention.paged_attention`; see that module for the layout.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trillium.ops.attention import AttentionMetadata


def store_kv(
    key: torch.Tensor,  # [T, Hkv, D]
    value: torch.Tensor,  # [T, Hkv, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    slot_mapping: torch.Tensor,  # [T] int64
) -> None:
    """Write each new token's K/V into its slot, in place, casting to the cache dtype.

    Only the T slots named by ``slot_mapping`` are written; every other slot is untouched.
    """
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    slot_mapping = slot_mapping.long()
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key.to(k_cache.dtype))
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value.to(v_cache.dtype))


def paged_attention(
    query: torch.Tensor,  # [T, Hq, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    meta: AttentionMetadata,
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
) -> torch.Tensor:  # [T, Hq, D] in the cache dtype
    """Causal attention of each new token over its request's KV (this step's K/V already stored).

    New token i of request r sits at absolute position ``context_len - query_len + i`` and sees
    KV positions ``<= `` its own (and, with ``window`` > 0, ``>`` its own minus ``window``); with
    ``softcap`` > 0 each score ``s`` becomes ``softcap * tanh(s / softcap)``. Hq must be a
    multiple of Hkv (grouped-query attention). Computes in the cache dtype.
    """
    query = query.to(k_cache.dtype)
    if window > 0 or softcap > 0:
        return _masked_attention(query, k_cache, v_cache, meta, scale, window, softcap)
    if meta.is_decode_only:
        return _decode_attention(query, k_cache, v_cache, meta, scale)
    return _mixed_attention(query, k_cache, v_cache, meta, scale)


def _gather(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Rows of the flattened cache: [num_blocks, block_size, Hkv, D] at [N] slots -> [N, Hkv, D]."""
    return cache.view(-1, cache.shape[2], cache.shape[3]).index_select(0, slots)


def _context_slots(meta: AttentionMetadata, request: int, context_len: int) -> torch.Tensor:
    """[context_len] slots holding positions 0 .. context_len - 1 of one request."""
    num_blocks = -(-context_len // meta.block_size)
    table = meta.block_tables[request, :num_blocks].long()
    offsets = torch.arange(meta.block_size, device=table.device)
    return (table[:, None] * meta.block_size + offsets).view(-1)[:context_len]


def _decode_plan(meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-step, layer-independent part of decode attention (computed once, reused by every layer):
    slots [R * L] of each request's positions 0 .. L-1 (L = max_context_len), and the key-padding
    mask [R, 1, 1, L] (None when all requests have the same length).

    Padding positions (past a request's context_len) point at that request's own last slot, so the
    gathered rows are finite K/V the mask hides, never stale or NaN memory of another request.
    """
    plan = meta._plans.get("ref_decode")
    if plan is None:
        num_requests, max_len, bs = len(meta.context_lens_list), meta.max_context_len, meta.block_size
        context_lens = meta.context_lens.long()
        positions = torch.arange(max_len, device=context_lens.device)[None, :]  # [1, L]
        clamped = torch.minimum(positions, (context_lens - 1)[:, None])  # [R, L]
        slots = meta.block_tables.long().gather(1, clamped // bs) * bs + clamped % bs  # [R, L]
        mask = None
        if min(meta.context_lens_list) < max_len:
            mask = (positions < context_lens[:, None]).view(num_requests, 1, 1, max_len)
        plan = meta._plans["ref_decode"] = (slots.view(-1), mask)
    return plan


def _decode_attention(
    query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float
) -> torch.Tensor:
    """One new token per request: one padded gather and one SDPA call for the whole batch.

    The G = Hq / Hkv query heads sharing a KV head are laid out as G query rows of that head,
    so GQA needs no K/V repeat, and a key-padding mask hides positions past each context_len.
    """
    num_requests, num_q_heads, head_dim = query.shape
    num_kv_heads = k_cache.shape[2]
    max_len = meta.max_context_len
    slots, mask = _decode_plan(meta)
    k = _gather(k_cache, slots).view(num_requests, max_len, num_kv_heads, head_dim).transpose(1, 2)  # [R, Hkv, L, D]
    v = _gather(v_cache, slots).view(num_requests, max_len, num_kv_heads, head_dim).transpose(1, 2)  # [R, Hkv, L, D]
    q = query.view(num_requests, num_kv_heads, num_q_heads // num_kv_heads, head_dim)  # [R, Hkv, G, D]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)  # [R, Hkv, G, D]
    return out.reshape(num_requests, num_q_heads, head_dim)


def _mixed_plan(meta: AttentionMetadata) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """Per request: context slots [ctx] and the causal mask [n, ctx] (None when SDPA's own
    top-left ``is_causal`` or no mask at all is exact). Computed once per step."""
    plan = meta._plans.get("ref_mixed")
    if plan is None:
        plan = []
        for r, (query_len, context_len) in enumerate(zip(meta.query_lens, meta.context_lens_list)):
            mask = None
            if 1 < query_len < context_len:
                # Bottom-right alignment: new token i (absolute position ctx - n + i) sees keys <= it.
                rows = torch.arange(context_len - query_len, context_len, device=meta.context_lens.device)
                mask = torch.arange(context_len, device=rows.device)[None, :] <= rows[:, None]  # [n, ctx]
            plan.append((_context_slots(meta, r, context_len), mask))
        meta._plans["ref_mixed"] = plan
    return plan


def _mixed_attention(
    query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float
) -> torch.Tensor:
    """Prefill or mixed batches: one SDPA call per request."""
    out = torch.empty_like(query)
    start = 0
    for (slots, mask), query_len, _context_len in zip(_mixed_plan(meta), meta.query_lens, meta.context_lens_list):
        k = _gather(k_cache, slots).transpose(0, 1)  # [Hkv, ctx, D]
        v = _gather(v_cache, slots).transpose(0, 1)  # [Hkv, ctx, D]
        q = query[start : start + query_len].transpose(0, 1)  # [Hq, n, D]
        # query_len == context_len: no cached prefix, SDPA's top-left causal alignment is ours;
        # query_len == 1: the one new token sees every key.
        causal = mask is None and query_len > 1
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True)
        out[start : start + query_len] = o.transpose(0, 1)  # [n, Hq, D]
        start += query_len
    return out


def _masked_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    window: int,
    softcap: float,
) -> torch.Tensor:
    """Sliding windows and soft-capped scores: per request, the scores written out (SDPA has no
    soft-capping), an explicit [n, ctx] mask, softmax, times V."""
    out = torch.empty_like(query)
    group = query.shape[1] // k_cache.shape[2]
    start = 0
    for r, (query_len, context_len) in enumerate(zip(meta.query_lens, meta.context_lens_list)):
        rows = torch.arange(context_len - query_len, context_len)[:, None]  # absolute positions [n, 1]
        keys = torch.arange(context_len)[None, :]
        mask = keys <= rows
        if window > 0:
            mask &= keys > rows - window  # [n, ctx]
        slots = _context_slots(meta, r, context_len)
        k = _gather(k_cache, slots).transpose(0, 1).repeat_interleave(group, 0)  # [Hq, ctx, D]
        v = _gather(v_cache, slots).transpose(0, 1).repeat_interleave(group, 0)
        q = query[start : start + query_len].transpose(0, 1)  # [Hq, n, D]
        scores = (q @ k.transpose(1, 2)) * scale  # [Hq, n, ctx]
        if softcap > 0:
            scores = softcap * torch.tanh(scores / softcap)
        probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        out[start : start + query_len] = (probs @ v).transpose(0, 1)
        start += query_len
    return out
