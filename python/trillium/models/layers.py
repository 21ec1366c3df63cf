"""Building blocks shared by Llama-family models: RMSNorm and rotary position embeddings."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import nn

from trillium.ops.layer_ops import fused_ok, rms_norm, rotary_inplace


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in fp32 and cast back before the weight (HF Llama order)."""

    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)
        self.eps = eps

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``norm(x)`` -- or, with ``residual``, ``(norm(x + residual), x + residual)``: the residual
        add of the decoder layer folded in (the sum is written into ``residual`` on the fused path)."""
        if fused_ok(x) and self.weight.dtype == torch.float32:
            out = rms_norm(x, self.weight, self.eps, residual)
            return out if residual is None else (out, residual)
        if residual is not None:
            x = x + residual
            residual = x
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        out = self.weight * x32.to(x.dtype)
        return out if residual is None else (out, residual)


def rope_inv_freq(head_dim: int, theta: float, rope_scaling: dict[str, Any] | None) -> torch.Tensor:  # [D/2] fp32
    """Inverse frequencies for rotate-half RoPE, with HF's "linear", "llama3" and "yarn" scaling rules."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if not rope_scaling:
        return inv_freq
    kind = rope_scaling.get("rope_type", rope_scaling.get("type"))
    if kind == "linear":
        return inv_freq / float(rope_scaling["factor"])
    if kind == "yarn":
        return _yarn_inv_freq(head_dim, theta, rope_scaling)
    if kind != "llama3":
        return inv_freq
    factor = float(rope_scaling["factor"])
    low = float(rope_scaling.get("low_freq_factor", 1.0))
    high = float(rope_scaling.get("high_freq_factor", 4.0))
    old_len = float(rope_scaling.get("original_max_position_embeddings", 8192))
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(medium, smoothed, scaled)


def rope_attention_factor(rope_scaling: dict[str, Any] | None) -> float:
    """The factor YaRN multiplies cos and sin by (so q.k by its square); 1.0 for other scalings.

    As transformers' ``_compute_yarn_parameters``: ``attention_factor`` when given, else
    ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)`` when both are set (DeepSeek), else
    ``0.1 * ln(factor) + 1`` (1.0 for factor <= 1)."""
    if not rope_scaling or rope_scaling.get("rope_type", rope_scaling.get("type")) != "yarn":
        return 1.0
    if rope_scaling.get("attention_factor") is not None:
        return float(rope_scaling["attention_factor"])
    factor = float(rope_scaling["factor"])

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    m, m_all = rope_scaling.get("mscale"), rope_scaling.get("mscale_all_dim")
    if m and m_all:
        return mscale(factor, float(m)) / mscale(factor, float(m_all))
    return mscale(factor)


def _yarn_inv_freq(head_dim: int, theta: float, rope_scaling: dict[str, Any]) -> torch.Tensor:  # [D/2] fp32
    """YaRN's frequencies: each one blended between extrapolation (the trained frequency, kept for
    dimensions that turn more than ``beta_fast`` times over the original context) and interpolation
    (divided by ``factor``, for those turning fewer than ``beta_slow`` times), by a linear ramp over
    the dimensions between -- transformers' arithmetic, in its order and precision."""
    factor = float(rope_scaling["factor"])
    old_len = float(rope_scaling["original_max_position_embeddings"])
    beta_fast = float(rope_scaling.get("beta_fast") or 32)
    beta_slow = float(rope_scaling.get("beta_slow") or 1)

    def correction_dim(rotations: float) -> float:  # the dimension that turns `rotations` times
        return (head_dim * math.log(old_len / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rope_scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # a ramp of zero width would divide by zero
    ramp = torch.clamp((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    extrapolation = 1 - ramp  # the weight of the trained frequency
    return (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation


class RotaryEmbedding(nn.Module):
    """Rotate-half (NeoX / HF) RoPE with a cos/sin table precomputed once for every position.

    The table is fp32 (as HF computes it) and cast to the activation dtype per step, so bf16
    results round exactly like HF's ``q * cos + rotate_half(q) * sin``.
    """

    def __init__(self, head_dim: int, max_positions: int, theta: float, rope_scaling: dict[str, Any] | None) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.max_positions = max_positions
        self.theta = theta
        self.rope_scaling = rope_scaling
        self.cos: torch.Tensor  # [max_positions, D/2] fp32
        self.sin: torch.Tensor
        self.register_buffer("cos", torch.empty(0), persistent=False)
        self.register_buffer("sin", torch.empty(0), persistent=False)
        self.build(inv_freq=None)

    def build(self, inv_freq: torch.Tensor | None, device: torch.device | str | None = None) -> None:
        """(Re)compute the table; ``inv_freq`` overrides the config-derived frequencies (GGUF rope_freqs)."""
        device = device if device is not None else self.cos.device
        if torch.device(device).type == "meta":
            # Built on meta while the model skeleton is created; rebuilt once memory exists.
            # (Nothing computed on meta: torch's meta kernels import torch._dynamo on first use,
            # seconds of every start-up.)
            self.cos = torch.empty(self.max_positions, self.head_dim // 2, device="meta")
            self.sin = torch.empty(self.max_positions, self.head_dim // 2, device="meta")
            return
        if inv_freq is None:
            inv_freq = rope_inv_freq(self.head_dim, self.theta, self.rope_scaling)
        positions = torch.arange(self.max_positions, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq.float().cpu())  # [P, D/2]
        # YaRN's attention factor lives in the table (as in transformers), so every path that
        # rotates from it -- torch, the core's kernels and one-call stack, CUDA -- applies it.
        scale = rope_attention_factor(self.rope_scaling)
        self.cos = (freqs.cos() * scale).to(device)
        self.sin = (freqs.sin() * scale).to(device)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, 1, D/2] in ``dtype`` for one step (computed once, shared by every layer)."""
        return self.cos[positions].to(dtype).unsqueeze(1), self.sin[positions].to(dtype).unsqueeze(1)

    def for_step(self, positions: torch.Tensor, dtype: torch.dtype) -> RopeStep:
        """What every layer of one step needs to rotate its q/k (see :func:`rotate_`)."""
        if dtype == torch.float32 and positions.device.type == "cpu":
            return RopeStep(None, None, positions.contiguous(), self.cos, self.sin)
        cos, sin = self.cos_sin(positions, dtype)
        return RopeStep(cos, sin, positions, self.cos, self.sin)


class RopeStep(NamedTuple):
    cos: torch.Tensor | None  # [T, 1, D/2] gathered (torch path only)
    sin: torch.Tensor | None
    positions: torch.Tensor  # [T] int64
    table_cos: torch.Tensor  # [max_positions, D/2] fp32
    table_sin: torch.Tensor


def rotate_(x: torch.Tensor, rope: RopeStep) -> None:
    """Rotate x [T, H, D] (a view of the fused qkv output) in place."""
    if rope.cos is None or rope.sin is None:
        rotary_inplace(x, rope.table_cos, rope.table_sin, rope.positions)
    else:
        x.copy_(apply_rotary(x, rope.cos, rope.sin))


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, H, D] by cos/sin [T, 1, D/2]: ``x * cos + rotate_half(x) * sin``, computed per
    half with the same rounding steps as HF in low precision. Returns a new contiguous tensor."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
