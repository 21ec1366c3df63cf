"""The core's CPU kernels as torch custom operators (``torch.ops.trillium.*``), so ``torch.compile``
can trace a whole decode step through them instead of breaking its graph at every kernel.

Each operator takes only tensors, ints, floats and bools -- the dataclasses the typed wrappers take
(:class:`~trillium.ops.quant_linear.QuantWeight`, :class:`~trillium.ops.attention.AttentionMetadata`)
are passed as their fields -- and runs the same typed wrapper (same checks, same ValueErrors) on
real tensors. The ``register_fake`` rules give shapes and dtypes only, for tracing.

    op                                   mutates              returns
    quant_linear(x, codes, ...)          --                   [..., N]  fp32
    store_kv(k, v, k_cache, v_cache, s)  k_cache, v_cache     --
    paged_attention(q, k_cache, ...)     --                   [T, Hq, D] in the cache dtype
    rms_norm(x, weight, eps)             --                   [rows, hidden]
    add_rms_norm(x, residual, w, eps)    residual (+= x)      [rows, hidden]
    silu_and_mul(gate_up)                --                   [rows, inter]
    rotary_inplace(x, cos, sin, pos)     x                    --

CPU tensors only (the registrations are for the CPU dispatch key). Importing this module registers
the operators; it is imported by :mod:`trillium.models.compiled`, not by the plain eager path,
which calls the wrappers directly (a custom operator costs a dispatcher round trip per call).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch

from trillium import _core
from trillium.ops import attention, layer_ops
from trillium.ops import quant_linear as ql
from trillium.ops.kernel_specs import BatchSpec

F = TypeVar("F", bound=Callable[..., Any])

# Defined through torch.library.Library rather than the @torch.library.custom_op decorator: the
# decorator wraps every call of the kernel in Python (a dynamo-disable guard, a dispatch on device,
# an aliasing check), ~5 us a call -- 1.5 ms on a 300-operator decode step. Here the dispatcher
# calls the function itself (~1.3 us over a direct call, measured).
_LIB = torch.library.Library("trillium", "DEF")  # type: ignore[no-untyped-call]


def _operator(mutates_args: tuple[str, ...] = ()) -> Callable[[F], F]:
    """Define ``trillium::<function name>`` with the schema inferred from the function's annotations
    (``mutates_args`` marks the arguments it writes) and the function as its CPU kernel. The
    function itself is returned unchanged; the operator is ``torch.ops.trillium.<name>``."""

    def register(fn: F) -> F:
        _LIB.define(fn.__name__ + torch.library.infer_schema(fn, mutates_args=mutates_args))  # type: ignore[no-untyped-call]
        _LIB.impl(fn.__name__, fn, "CPU")  # type: ignore[no-untyped-call]
        return fn

    return register


def _fake(name: str) -> Callable[[F], F]:
    """Register the function as the shape-and-dtype rule of ``trillium::<name>`` (for tracing)."""
    return torch.library.register_fake(f"trillium::{name}", lib=_LIB)  # type: ignore[no-any-return]


# ----------------------------------------------------------------------------------- quant_linear
@_operator()
def quant_linear(
    x: torch.Tensor,  # [..., K] fp32
    codes: torch.Tensor,  # QuantWeight.codes
    scales: torch.Tensor,  # QuantWeight.scales
    mins: torch.Tensor,  # QuantWeight.mins
    bias: torch.Tensor | None,  # [N] or None
    out_features: int,
    in_features: int,
    bits: int,
    activations: int,
) -> torch.Tensor:  # [..., N] fp32
    """:func:`trillium.ops.quant_linear.quant_linear` with the weight passed field by field (per-block
    scales: a two-level K-quant weight is not taken here): the same result and ValueErrors, plus
    one if the fields do not describe a packed weight (the kernel reads ``codes`` by the ints, so
    they must agree)."""
    num_bytes, num_scales = _core.quant_linear_sizes(out_features, in_features, bits)
    if codes.numel() != num_bytes or scales.numel() != num_scales or mins.numel() not in (0, num_scales):
        raise ValueError(f"codes/scales/mins are not a packed {out_features}x{in_features} {bits}-bit weight")
    if x.dim() != 2 or x.dtype != torch.float32 or not x.is_contiguous() or not x.is_cpu:
        weight = ql.QuantWeight(out_features, in_features, bits, codes, scales, mins)
        return ql.quant_linear(x, weight, bias, activations=activations)
    # Every step's case, checked as BoundQuantLinear does, without building a QuantWeight (~4 us
    # of the ~10 us the general path costs on a decode row).
    if x.shape[1] != in_features:
        raise ValueError(f"x has {x.shape[1]} features, the weight expects {in_features}")
    bias = ql._checked_bias(bias, out_features)
    args = (out_features, in_features, bits, codes.data_ptr(), scales.data_ptr(),
            mins.data_ptr() if mins.numel() else 0, 0, 0 if bias is None else bias.data_ptr())  # fmt: skip
    out = torch.empty(x.shape[0], out_features, dtype=torch.float32)
    ql._run(x, in_features, args, out, activations)
    return out


@_fake("quant_linear")
def _(
    x: torch.Tensor,
    codes: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor,
    bias: torch.Tensor | None,
    out_features: int,
    in_features: int,
    bits: int,
    activations: int,
) -> torch.Tensor:
    torch._check(x.shape[-1] == in_features, lambda: f"x has {x.shape[-1]} features, expected {in_features}")  # type: ignore[no-untyped-call]
    return x.new_empty((*x.shape[:-1], out_features), dtype=torch.float32)


# --------------------------------------------------------------------------------------- attention
@_operator(mutates_args=("k_cache", "v_cache"))
def store_kv(
    key: torch.Tensor,  # [T, Hkv, D]
    value: torch.Tensor,  # [T, Hkv, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [T] int64; a negative slot skips its token
) -> None:
    """:func:`trillium.ops.attention.store_kv`: writes the T named slots of both caches in place."""
    attention.store_kv(key, value, k_cache, v_cache, slot_mapping)


@_fake("store_kv")
def _(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    return None


@_operator()
def paged_attention(
    query: torch.Tensor,  # [T, Hq, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,
    query_start_loc: torch.Tensor,  # [R+1] int32   AttentionMetadata's tensors
    context_lens: torch.Tensor,  # [R] int32
    block_tables: torch.Tensor,  # [R, W] int32
    max_query_len: int,  # 1 selects the decode kernel
    scale: float,
) -> torch.Tensor:  # [T, Hq, D] in the cache dtype
    """:func:`trillium.ops.attention.paged_attention` with the metadata passed as its tensors.

    The metadata's Python lists are not needed: R is ``context_lens``' length and T ``query``'s
    (so T must equal the sum of the query lengths, as the metadata guarantees). A block table may
    be wider than any request needs (a compiled graph pads it to a fixed width); the kernel reads
    only the blocks covering ``context_lens``. ValueError as the wrapper's, nothing written then.
    """
    num_tokens, num_heads, _ = query.shape
    batch = _batch_spec(num_tokens, query_start_loc, context_lens, block_tables)
    cache = attention._cache_spec(k_cache, v_cache)
    out = query.new_empty(query.shape, dtype=k_cache.dtype)
    query_spec = attention._rows_spec(query, "query", num_heads, cache.head_dim)
    out_spec = attention._rows_spec(out, "out", num_heads, cache.head_dim)
    if attention._same_device(k_cache, query, block_tables):
        raise ValueError("trillium::paged_attention runs on CPU tensors only")
    if num_tokens:
        decode = max_query_len == 1
        _core.paged_attention(query_spec, out_spec, cache, batch, float(scale), torch.get_num_threads(), decode)
    return out


@_fake("paged_attention")
def _(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    max_query_len: int,
    scale: float,
) -> torch.Tensor:
    return query.new_empty(query.shape, dtype=k_cache.dtype)


def _batch_spec(
    num_tokens: int, query_start_loc: torch.Tensor, context_lens: torch.Tensor, block_tables: torch.Tensor
) -> BatchSpec:
    """The kernel's BatchSpec of checked metadata tensors (ValueError naming the bad one)."""
    num_requests = context_lens.shape[0]
    for name, t, shape in (
        ("query_start_loc", query_start_loc, (num_requests + 1,)),
        ("context_lens", context_lens, (num_requests,)),
        ("block_tables", block_tables, (num_requests, block_tables.shape[-1])),
    ):
        if t.dtype != torch.int32 or not t.is_contiguous() or tuple(t.shape) != shape:
            raise ValueError(f"{name} must be a contiguous int32 {shape} tensor, got {t.dtype} {tuple(t.shape)}")
    return BatchSpec(
        num_requests=num_requests,
        num_tokens=num_tokens,
        query_start_loc_ptr=query_start_loc.data_ptr(),
        context_lens_ptr=context_lens.data_ptr(),
        block_tables_ptr=block_tables.data_ptr(),
        block_table_stride=block_tables.shape[1],
    )


# -------------------------------------------------------------------------------------- layer ops
@_operator()
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:  # [rows, hidden]
    """:func:`trillium.ops.layer_ops.rms_norm` without a residual: a new normed tensor."""
    _check_rows(x, "x")
    _check_norm_weight(weight, x.shape[1])
    return layer_ops.rms_norm(x, weight, eps)


@_fake("rms_norm")
def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@_operator(mutates_args=("residual",))
def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """:func:`trillium.ops.layer_ops.rms_norm` with a residual: ``residual += x`` in place, and
    returns a new ``norm(residual)``."""
    _check_rows(x, "x")
    _check_norm_weight(weight, x.shape[1])
    return layer_ops.rms_norm(x, weight, eps, residual)


@_fake("add_rms_norm")
def _(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@_operator()
def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:  # [rows, 2I] -> [rows, I]
    """:func:`trillium.ops.layer_ops.silu_and_mul`."""
    _check_rows(gate_up, "gate_up")
    return layer_ops.silu_and_mul(gate_up)


@_fake("silu_and_mul")
def _(gate_up: torch.Tensor) -> torch.Tensor:
    return gate_up.new_empty((gate_up.shape[0], gate_up.shape[1] // 2))


@_operator(mutates_args=("x",))
def rotary_inplace(x: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor, positions: torch.Tensor) -> None:
    """:func:`trillium.ops.layer_ops.rotary_inplace`: rotates fp32 x [T, H, D] in place (a view
    with a contiguous last dimension, e.g. the Q and K heads of a fused projection, is fine)."""
    if x.dtype != torch.float32:
        raise ValueError(f"rotary_inplace takes fp32 x, got {x.dtype}")
    layer_ops.rotary_inplace(x, cos_table, sin_table, positions)


@_fake("rotary_inplace")
def _(x: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor, positions: torch.Tensor) -> None:
    return None


def _check_rows(x: torch.Tensor, name: str) -> None:
    """The layer wrappers trust their callers on this; a compiled graph may hand anything."""
    if not layer_ops.fused_ok(x):
        raise ValueError(f"{name} must be a 2-D fp32 CPU tensor with contiguous rows, got {x.dtype} {tuple(x.shape)}")


def _check_norm_weight(weight: torch.Tensor, hidden: int) -> None:
    if weight.dtype != torch.float32 or weight.shape != (hidden,) or not weight.is_contiguous():
        raise ValueError(
            f"weight must be a contiguous fp32 [{hidden}] tensor, got {weight.dtype} {tuple(weight.shape)}"
        )
