"""Fused decoder-layer operations on fp32 CPU tensors: typed wrappers over ``_core``.

``rms_norm`` (with the residual add folded in), ``silu_and_mul`` (or GELU-tanh) and ``rotary_inplace`` each
replace several torch operations and their temporaries; at decode batch sizes the per-operation
overhead, not the arithmetic, is what they save. :func:`fused_ok` says when a tensor can take
them (fp32, CPU, last dimension contiguous); callers keep the torch formula for everything else.
"""

from __future__ import annotations

import torch

from trillium import _core


def fused_ok(x: torch.Tensor) -> bool:
    """True when ``x`` (rows in its last dimension) can go through the fused CPU kernels."""
    return x.dtype == torch.float32 and x.device.type == "cpu" and x.dim() == 2 and x.stride(-1) == 1


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None) -> torch.Tensor:
    """``weight * x' * rsqrt(mean(x'^2) + eps)`` per row, ``x' = x + residual`` when given, in which
    case ``residual`` is updated in place to ``x'``. Returns a new [rows, hidden] tensor."""
    rows, hidden = x.shape
    out = torch.empty(rows, hidden, dtype=torch.float32)
    if residual is not None and (residual.shape != x.shape or not fused_ok(residual)):
        raise ValueError(f"residual must be fp32 {tuple(x.shape)} with contiguous rows")
    _core.rms_norm(
        x.data_ptr(),
        x.stride(0),
        0 if residual is None else residual.data_ptr(),
        0 if residual is None else residual.stride(0),
        weight.data_ptr(),
        out.data_ptr(),
        hidden,
        rows,
        hidden,
        eps,
    )
    return out


SILU, GELU_TANH = 0, 1  # the gate's activation (the core's GatedActivation)


def silu_and_mul(gate_up: torch.Tensor, activation: int = SILU) -> torch.Tensor:
    """``silu(gate) * up`` of [rows, 2 * inter] rows laid out ``[gate | up]`` -> [rows, inter];
    with ``GELU_TANH``, ``gelu(gate, approximate="tanh") * up`` (Gemma) to fp32 rounding."""
    rows, width = gate_up.shape
    inter = width // 2
    out = torch.empty(rows, inter, dtype=torch.float32)
    _core.silu_and_mul(gate_up.data_ptr(), gate_up.stride(0), out.data_ptr(), inter, rows, inter, activation)
    return out


def rotary_inplace(x: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor, positions: torch.Tensor) -> None:
    """Rotate-half RoPE in place on fp32 x [T, H, D] (a view of a fused projection is fine) with
    the [max_positions, D/2] fp32 tables at int64 ``positions`` [T]."""
    tokens, heads, head_dim = x.shape
    if x.stride(2) != 1 or positions.dtype != torch.int64 or not positions.is_contiguous():
        raise ValueError("rotary_inplace needs a contiguous last dimension and contiguous int64 positions")
    _core.rotary_inplace(
        x.data_ptr(),
        x.stride(0),
        x.stride(1),
        tokens,
        heads,
        head_dim,
        cos_table.data_ptr(),
        sin_table.data_ptr(),
        cos_table.shape[0],
        positions.data_ptr(),
    )
