"""Paged attention over the block-structured KV cache: metadata, KV store, and the attention op.

Layout (one pool per layer, owned by the engine):

    k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]   contiguous

A request's token at absolute position p lives in block ``block_table[p // block_size]`` at
offset ``p % block_size``; its flat slot is ``block_id * block_size + offset``.

One step carries T new tokens from R requests, flattened request-major. Request r contributes
``query_len`` new tokens that occupy the last positions of its context:

    positions  0 ............ context_len - query_len ......... context_len - 1
               |<-- cached (already in KV) -->|<-- new this step (stored, then attended) -->|

:func:`store_kv` and :func:`paged_attention` are typed wrappers: they check shapes, dtypes and
devices once, then hand raw pointers to the compiled kernels -- ``trillium._core`` for CPU tensors
(cpp/include/trillium/kernels/), ``trillium._cuda`` for CUDA tensors (cuda/). The torch
gather + SDPA version is :mod:`trillium.ops.attention_ref`, the oracle in tests.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

from trillium import _core
from trillium.ops.kernel_specs import DTYPE_CODES, BatchSpec, CacheSpec, RowsSpec


@dataclass
class AttentionMetadata:
    """One step's batch: T new tokens from R requests, flattened request-major."""

    query_start_loc: torch.Tensor  # [R+1] int32, request r's new tokens are rows [r]:[r+1]
    context_lens: torch.Tensor  # [R] int32, tokens in KV for request r after this step's store
    block_tables: torch.Tensor  # [R, max_blocks_per_request] int32 block ids, padded with 0
    slot_mapping: torch.Tensor  # [T] int64, block_id * block_size + offset of each new token
    block_size: int
    max_query_len: int  # python ints precomputed so the op never syncs on .item()
    max_context_len: int
    query_lens: list[int]
    context_lens_list: list[int]
    # Layer-independent derived values (the kernels' BatchSpec, reference gather plans), filled on
    # first use in a step and reused by every layer.
    _plans: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def is_decode_only(self) -> bool:
        """True when every request brings exactly one new token."""
        return self.max_query_len == 1

    @classmethod
    def build(
        cls,
        query_lens: list[int],
        context_lens: list[int],
        block_tables: list[list[int]],
        block_size: int,
        device: torch.device | str = "cpu",
    ) -> AttentionMetadata:
        """Compute every field from per-request python lists.

        ``block_tables[r]`` must cover positions ``0 .. context_lens[r] - 1``; the new tokens of
        request r are stored at positions ``context_lens[r] - query_lens[r] .. context_lens[r] - 1``.
        Raises ValueError on inconsistent lengths (a scheduler bug, but cheap to catch here).
        """
        num_requests = len(query_lens)
        slots = slot_mapping(query_lens, context_lens, block_tables, block_size)
        starts = list(itertools.accumulate(query_lens, initial=0))
        max_blocks = max((len(t) for t in block_tables), default=0)
        padded = [list(t) + [0] * (max_blocks - len(t)) for t in block_tables]
        return cls(
            query_start_loc=host_to_device(torch.tensor(starts, dtype=torch.int32), device),
            context_lens=host_to_device(torch.tensor(context_lens, dtype=torch.int32), device),
            block_tables=host_to_device(torch.tensor(padded, dtype=torch.int32).view(num_requests, max_blocks), device),
            slot_mapping=host_to_device(torch.tensor(slots, dtype=torch.int64), device),
            block_size=block_size,
            max_query_len=max(query_lens, default=0),
            max_context_len=max(context_lens, default=0),
            query_lens=list(query_lens),
            context_lens_list=list(context_lens),
        )


def slot_mapping(
    query_lens: list[int], context_lens: list[int], block_tables: list[list[int]], block_size: int
) -> list[int]:
    """The pool slot (``block_id * block_size + offset``) of every new token of a step, request by
    request: request r's new tokens sit at positions ``context_lens[r] - query_lens[r] ..
    context_lens[r] - 1``. ValueError on inconsistent lengths (a scheduler bug, but cheap to
    catch here): lists of different lengths, ``query_len`` not in 1..context_len, or a block table
    too short for its context."""
    num_requests = len(query_lens)
    if len(context_lens) != num_requests or len(block_tables) != num_requests:
        raise ValueError(
            f"query_lens ({num_requests}), context_lens ({len(context_lens)}) and "
            f"block_tables ({len(block_tables)}) must have one entry per request"
        )
    slots: list[int] = []
    for query_len, context_len, table in zip(query_lens, context_lens, block_tables):
        if not 0 < query_len <= context_len:
            raise ValueError(f"need 0 < query_len <= context_len, got {query_len}, {context_len}")
        if len(table) * block_size < context_len:
            raise ValueError(
                f"block table of {len(table)} blocks cannot hold {context_len} tokens with block_size {block_size}"
            )
        for pos in range(context_len - query_len, context_len):
            slots.append(table[pos // block_size] * block_size + pos % block_size)
    return slots


def fresh_prefill_attention(
    query: torch.Tensor,  # [T, Hq, D]
    key: torch.Tensor,  # [T, Hkv, D]: this step's own keys
    value: torch.Tensor,  # [T, Hkv, D]
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor | None:  # [T, Hq, D] in the query's dtype
    """Causal attention of a GPU step in which every request starts from nothing (each context is
    this step's own tokens), through flash attention over variable-length sequences; None where
    that does not apply (CPU, fp32, a decode step, a cached prefix, no working flash kernel): use
    :func:`paged_attention` then. Windows and soft-capping are the caller's to exclude. The K/V
    still go to the pool (:func:`store_kv`) for the steps after this one."""
    if query.is_cpu or query.dtype != torch.bfloat16 or meta.max_query_len <= 1:
        return None
    if meta.context_lens_list != meta.query_lens or not _flash_works(query.device):
        return None
    out: torch.Tensor = torch.ops.aten._flash_attention_forward(
        query, key, value, meta.query_start_loc, meta.query_start_loc, meta.max_query_len, meta.max_query_len,
        0.0, True, False, scale=scale,
    )[0]  # fmt: skip
    return out


_FLASH: dict[torch.device, bool] = {}


def _flash_works(device: torch.device) -> bool:
    """Whether this torch's flash attention runs here on strided bf16 views (as the fused QKV's
    are) and agrees with SDPA: probed once per device on a small grouped-query case; a torch
    or GPU without it keeps the paged kernel (logged)."""
    if device not in _FLASH:
        try:
            lens = torch.tensor([0, 5, 12], dtype=torch.int32, device=device)
            fused = torch.randn(12, 4 + 2 * 2, 64, dtype=torch.bfloat16, device=device)
            q, k, v = fused[:, :4], fused[:, 4:6], fused[:, 6:]
            out = torch.ops.aten._flash_attention_forward(q, k, v, lens, lens, 7, 7, 0.0, True, False, scale=0.125)[0]
            ok = True
            for a, b in ((0, 5), (5, 12)):
                qa, ka, va = (
                    x[a:b].transpose(0, 1).float() for x in (q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1))
                )
                ref = torch.nn.functional.scaled_dot_product_attention(qa, ka, va, is_causal=True, scale=0.125)
                ok = ok and bool((out[a:b].float() - ref.transpose(0, 1)).abs().max() < 2e-2)
            _FLASH[device] = ok
        except (RuntimeError, TypeError, AttributeError) as exc:
            logging.getLogger("trillium").info("flash attention unavailable, prefill uses the paged kernel: %s", exc)
            _FLASH[device] = False
    return _FLASH[device]


def host_to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """CPU tensor ``t`` on ``device``: ``t`` itself for the CPU; for a GPU a copy made through
    pinned memory and queued on the current stream, so the host never waits for the GPU (a copy
    from pageable memory would first synchronize the stream)."""
    if torch.device(device).type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def store_kv(
    key: torch.Tensor,  # [T, Hkv, D]
    value: torch.Tensor,  # [T, Hkv, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    slot_mapping: torch.Tensor,  # [T] int64
) -> None:
    """Write each new token's K/V into its slot, in place, casting to the cache dtype.

    Only the T slots named by ``slot_mapping`` are written (a negative slot skips its token);
    every other slot is untouched. ValueError on mismatched shapes, dtypes or devices, or (CPU) a
    slot outside the pool, in which case nothing is written; on CUDA such slots are skipped.
    """
    cache = _cache_spec(k_cache, v_cache)
    num_tokens = key.shape[0]
    key_spec = _rows_spec(key, "key", cache.num_kv_heads, cache.head_dim)
    value_spec = _rows_spec(value, "value", cache.num_kv_heads, cache.head_dim)
    if value.shape[0] != num_tokens or key_spec.dtype != value_spec.dtype:
        raise ValueError(f"key {tuple(key.shape)} {key.dtype} and value {tuple(value.shape)} {value.dtype} differ")
    if slot_mapping.dtype != torch.int64 or slot_mapping.shape != (num_tokens,) or not slot_mapping.is_contiguous():
        raise ValueError(
            f"slot_mapping must be a contiguous int64 [{num_tokens}] tensor, got "
            f"{slot_mapping.dtype} {tuple(slot_mapping.shape)}"
        )
    on_cuda = _same_device(k_cache, key, value, slot_mapping)
    if num_tokens == 0:
        return
    if on_cuda:
        _cuda_module().store_kv(key_spec, value_spec, cache, slot_mapping.data_ptr(), num_tokens, _cuda_stream(key))
    else:
        _core.store_kv(key_spec, value_spec, cache, slot_mapping.data_ptr(), num_tokens, torch.get_num_threads())


def paged_attention(
    query: torch.Tensor,  # [T, Hq, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    meta: AttentionMetadata,
    scale: float,
    out: torch.Tensor | None = None,  # [T, Hq, D], written in full
    window: int = 0,
    softcap: float = 0.0,
) -> torch.Tensor:  # [T, Hq, D] in the cache dtype (or out's dtype)
    """Causal attention of each new token over its request's KV (this step's K/V already stored).

    New token i of request r sits at absolute position ``context_len - query_len + i`` and sees
    KV positions ``<=`` its own -- and with ``window`` > 0 (sliding-window attention; CPU only)
    positions ``>`` its own minus ``window``. ``softcap`` > 0 (Gemma 2; CPU only) caps each score
    ``s = scale * q.k`` to ``softcap * tanh(s / softcap)`` before the softmax. Hq must be a multiple of Hkv (grouped-query attention) and
    head_dim a multiple of 16 (CUDA: 64, 128 or 256). Softmax and accumulation in fp32; the result
    is in the cache dtype, or written into ``out`` (float32 or bfloat16, last dimension
    contiguous) and returned. ValueError on mismatched shapes, dtypes or devices, or (CPU)
    metadata inconsistent with the pool; nothing is written then.
    """
    cache = _cache_spec(k_cache, v_cache)
    batch = meta._plans.get("kernel_batch")
    if batch is None:
        batch = meta._plans["kernel_batch"] = _batch_spec(meta)
    num_tokens = batch.num_tokens
    shape = query.shape
    if len(shape) != 3 or shape[0] != num_tokens:
        raise ValueError(f"query must be [{num_tokens}, num_q_heads, head_dim] for this metadata, got {tuple(shape)}")
    query_spec = _rows_spec(query, "query", shape[1], cache.head_dim)
    if out is None:
        out = query.new_empty(shape, dtype=k_cache.dtype)
    elif out.shape[0] != num_tokens:
        raise ValueError(f"out has {out.shape[0]} tokens, query {num_tokens}")
    out_spec = _rows_spec(out, "out", shape[1], cache.head_dim)
    on_cuda = _same_device(k_cache, query, out, meta.block_tables)
    if num_tokens == 0:
        return out
    decode = meta.max_query_len == 1
    if on_cuda:
        if (window and meta.max_context_len > window) or softcap:
            # Inside the window sliding attention is full attention; past it the CUDA kernels lack it.
            raise ValueError("sliding-window attention and soft-capping run on the CPU kernels only")
        cuda = _cuda_module()
        plan = _cuda_decode_plan(cuda, meta, query_spec, out_spec, cache, batch, query.device) if decode else None
        if plan is not None:
            split, splits, workspace = plan
            cuda.paged_attention_decode(
                query_spec, out_spec, cache, batch, float(scale), split, splits, workspace.data_ptr(),
                workspace.numel(), _cuda_stream(query),
            )  # fmt: skip
        else:
            cuda.paged_attention(
                query_spec, out_spec, cache, batch, float(scale), decode, meta.max_query_len, _cuda_stream(query)
            )
    else:
        _core.paged_attention(
            query_spec,
            out_spec,
            cache,
            batch,
            float(scale),
            torch.get_num_threads(),
            decode,
            int(window),
            float(softcap),
        )
    return out


# ------------------------------------------------------------------------------------------ checks
# Called for every layer of every step: the common path is one combined condition; the detailed
# message is built only on failure.
def _cache_spec(k_cache: torch.Tensor, v_cache: torch.Tensor) -> CacheSpec:
    """The spec of a checked pool."""
    shape = k_cache.shape
    code = DTYPE_CODES.get(k_cache.dtype)
    if (
        code is None
        or len(shape) != 4
        or v_cache.shape != shape
        or v_cache.dtype != k_cache.dtype
        or not k_cache.is_contiguous()
        or not v_cache.is_contiguous()
    ):
        raise ValueError(
            f"k_cache {tuple(k_cache.shape)} {k_cache.dtype} and v_cache {tuple(v_cache.shape)} {v_cache.dtype} "
            "must be equal, contiguous [num_blocks, block_size, num_kv_heads, head_dim] pools of dtype float32 "
            "or bfloat16"
        )
    return CacheSpec(
        k_ptr=k_cache.data_ptr(),
        v_ptr=v_cache.data_ptr(),
        dtype=code,
        num_blocks=shape[0],
        block_size=shape[1],
        num_kv_heads=shape[2],
        head_dim=shape[3],
    )


def _rows_spec(x: torch.Tensor, name: str, num_heads: int, head_dim: int) -> RowsSpec:
    """The spec of a [T, num_heads, head_dim] tensor whose last dimension is contiguous (token and
    head strides are free: views of a fused QKV work)."""
    shape = x.shape
    stride = x.stride()
    code = DTYPE_CODES.get(x.dtype)
    if code is None or len(shape) != 3 or shape[1] != num_heads or shape[2] != head_dim or stride[2] != 1:
        raise ValueError(
            f"{name} must be a [T, {num_heads}, {head_dim}] tensor of dtype float32 or bfloat16 with a contiguous "
            f"last dimension, got {x.dtype} {tuple(shape)} strides {stride}"
        )
    return RowsSpec(
        data_ptr=x.data_ptr(), num_heads=num_heads, stride_token=stride[0], stride_head=stride[1], dtype=code
    )


def _same_device(cache: torch.Tensor, *tensors: torch.Tensor) -> bool:
    """True for CUDA, False for CPU; ValueError unless every tensor is on the cache's device."""
    if cache.is_cuda:
        device = cache.device
        if any(t.device != device for t in tensors):
            raise ValueError(f"all tensors must be on the KV cache's device {device}")
        return True
    if any(t.is_cuda for t in tensors) or cache.device.type != "cpu":
        raise ValueError(f"all tensors must be on the KV cache's device {cache.device} (cpu or cuda)")
    return False


def _batch_spec(meta: AttentionMetadata) -> BatchSpec:
    """The spec of a step's checked metadata."""
    tensors = (meta.query_start_loc, meta.context_lens, meta.block_tables)
    if any(t.dtype != torch.int32 or not t.is_contiguous() for t in tensors):
        raise ValueError(
            "query_start_loc, context_lens and block_tables must be contiguous int32 (use AttentionMetadata.build)"
        )
    num_requests = len(meta.context_lens_list)
    return BatchSpec(
        num_requests=num_requests,
        num_tokens=sum(meta.query_lens),
        query_start_loc_ptr=meta.query_start_loc.data_ptr(),
        context_lens_ptr=meta.context_lens.data_ptr(),
        block_tables_ptr=meta.block_tables.data_ptr(),
        block_table_stride=meta.block_tables.shape[1] if meta.block_tables.dim() == 2 else 0,
    )


# ------------------------------------------------------------------------------------------ CUDA
_CUDA: ModuleType | None = None


def _cuda_module() -> ModuleType:
    """trillium._cuda, imported on first use; RuntimeError naming the cause when it is absent."""
    global _CUDA
    if _CUDA is None:
        try:
            from trillium import _cuda
        except ImportError as exc:
            raise RuntimeError(f"CUDA tensors need trillium._cuda, which is not built here: {exc}") from exc
        _CUDA = _cuda
    return _CUDA


_NUM_SMS: dict[int, int] = {}


def _cuda_decode_plan(
    cuda: ModuleType,
    meta: AttentionMetadata,
    query: RowsSpec,
    out: RowsSpec,
    cache: CacheSpec,
    batch: BatchSpec,
    device: torch.device,
) -> tuple[int, int, torch.Tensor] | None:
    """(split, splits, workspace) of the split-KV decode kernel for this step, or None where it
    does not apply (fp32 KV, ...). Made once per step: every layer has the same sizes, and runs
    after the last on the same stream, so they share one workspace (scratch for the splits'
    partial results from torch's allocator -- a captured graph's pool when capturing)."""
    key = "cuda_decode_plan"
    if key not in meta._plans:
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in _NUM_SMS:
            _NUM_SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
        supported, split, splits, workspace_bytes = cuda.plan_paged_attention_decode(
            query, out, cache, batch, int(meta.max_context_len), _NUM_SMS[index]
        )
        meta._plans[key] = None
        if supported and splits > 0:
            workspace = torch.empty(max(workspace_bytes, 1), dtype=torch.uint8, device=device)
            meta._plans[key] = (split, splits, workspace)
    plan: tuple[int, int, torch.Tensor] | None = meta._plans[key]
    return plan


def _cuda_stream(t: torch.Tensor) -> int:
    return torch.cuda.current_stream(t.device).cuda_stream
