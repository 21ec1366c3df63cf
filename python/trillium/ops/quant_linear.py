"""Block-quantized linear layers: typed wrappers over ``_core.quant_linear`` (CPU only).

A weight ``W[N, K]`` is stored as integer codes in blocks of 32 along K with one fp32 scale and
one fp32 min per block: ``W[n, k] = scale[n, k // 32] * codes[n, k] + min[n, k // 32]`` -- exactly
GGUF's Q4_0 / Q4_1 / Q8_0, so a quantized file is served without dequantizing it. By default the
activations stay fp32 and the result is ``x @ dequantize(W).T`` up to summation order; with
``int8_activations`` they are rounded to int8 per row and 32-block (as llama.cpp does) and the
integer dot products are exact; :func:`reference_quant_linear` computes that in float64.

The only caller of ``_core.quant_linear``: models go through :func:`quant_linear` (any leading
shape) or, for a layer that runs every step, :class:`BoundQuantLinear` (arguments resolved once).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trillium import _core

BLOCK = _core.QUANT_BLOCK  # 32


@dataclass(frozen=True)
class QuantWeight:
    """A packed weight (opaque layout, see cpp/include/trillium/kernels/quant_linear.h)."""

    out_features: int
    in_features: int
    bits: int
    codes: torch.Tensor  # uint8, packed
    scales: torch.Tensor  # float32, packed
    mins: torch.Tensor  # float32, packed; empty when every min is 0 (Q8_0): the kernels then read none

    @classmethod
    def pack(cls, codes: torch.Tensor, scale: torch.Tensor, min: torch.Tensor, bits: int) -> QuantWeight:
        """Pack row-major ``codes`` int8 [N, K] (4-bit codes in [0, 15]; 8-bit in [-128, 127]) with
        ``scale`` and ``min`` fp32 [N, K/32]. Raises ValueError on bad sizes or codes. An all-zero
        ``min`` is not packed (``mins`` empty): a decode step reads its weights from memory, and
        the mins were 1/10 of a Q8_0 weight's bytes."""
        if codes.dtype != torch.int8 or codes.dim() != 2:
            raise ValueError(f"codes must be a 2-D int8 tensor, got {codes.dtype} {tuple(codes.shape)}")
        n, k = codes.shape
        if k % BLOCK:
            raise ValueError(f"in_features must be a multiple of {BLOCK}, got {k}")
        codes = codes.contiguous()
        scale = scale.to(torch.float32).contiguous()
        min = min.to(torch.float32).contiguous()
        if tuple(scale.shape) != (n, k // BLOCK) or tuple(min.shape) != (n, k // BLOCK):
            raise ValueError(f"scale and min must be [{n}, {k // BLOCK}], got {tuple(scale.shape)}, {tuple(min.shape)}")
        num_bytes, num_scales = _core.quant_linear_sizes(n, k, bits)
        packed = torch.empty(num_bytes, dtype=torch.uint8)
        scales = torch.empty(num_scales, dtype=torch.float32)
        mins = torch.empty(num_scales if bool(min.any()) else 0, dtype=torch.float32)
        _core.quant_linear_pack(
            codes.data_ptr(),
            scale.data_ptr(),
            min.data_ptr(),
            n,
            k,
            bits,
            packed.data_ptr(),
            scales.data_ptr(),
            mins.data_ptr() if mins.numel() else 0,
        )
        return cls(n, k, bits, packed, scales, mins)

    @property
    def nbytes(self) -> int:
        return self.codes.numel() + 4 * (self.scales.numel() + self.mins.numel())


def quant_linear(
    x: torch.Tensor,
    weight: QuantWeight,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    int8_activations: bool = False,
) -> torch.Tensor:
    """``x [..., K] -> [..., N]``: ``x @ W.T (+ bias)`` on fp32 CPU tensors, W block-quantized.

    Exact by default (fp32 activations times the dequantized weights); ``int8_activations`` rounds
    x to int8 per 32-block first (llama.cpp's way: faster at large batches, approximate).
    ValueError on a dtype, device or shape mismatch (nothing written)."""
    if x.dtype != torch.float32 or x.device.type != "cpu":
        raise ValueError(f"quant_linear takes fp32 CPU activations, got {x.dtype} on {x.device}")
    if x.shape[-1] != weight.in_features:
        raise ValueError(f"x has {x.shape[-1]} features, the weight expects {weight.in_features}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, weight.in_features)
    if x2.stride(-1) != 1 or x2.stride(0) < weight.in_features:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    if out is None:
        out = torch.empty(rows, weight.out_features, dtype=torch.float32)
    elif out.shape != (rows, weight.out_features) or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous fp32 [{rows}, {weight.out_features}] tensor")
    bias = _checked_bias(bias, weight.out_features)
    _run(x2, x2.stride(0), _weight_args(weight, bias), out, int8_activations)
    return out.view(*lead, weight.out_features)


class BoundQuantLinear:
    """:func:`quant_linear` for one weight, bias and activation mode, with the kernel's weight
    arguments resolved (and the bias checked) once -- for projections that run every step.

    Holds references to ``weight`` and ``bias``, whose storage must not be replaced afterwards (the
    kernel keeps their addresses). ValueError at construction for a bias that is not [N].
    """

    __slots__ = ("weight", "bias", "int8_activations", "_args")

    def __init__(self, weight: QuantWeight, bias: torch.Tensor | None = None, int8_activations: bool = False) -> None:
        self.weight = weight
        self.bias = _checked_bias(bias, weight.out_features)
        self.int8_activations = int8_activations
        self._args = _weight_args(weight, self.bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [T, K] -> [T, N]; [..., K] -> [..., N]
        """Same contract as :func:`quant_linear`. A contiguous fp32 CPU [T, K] input (every step's
        case) costs one feature-count check; anything else takes the fully checked path."""
        if x.dim() != 2 or x.dtype != torch.float32 or not x.is_cpu or not x.is_contiguous():
            return quant_linear(x, self.weight, self.bias, int8_activations=self.int8_activations)
        in_features = self.weight.in_features
        if x.shape[1] != in_features:
            raise ValueError(f"x has {x.shape[1]} features, the weight expects {in_features}")
        out = torch.empty(x.shape[0], self.weight.out_features, dtype=torch.float32)
        _run(x, in_features, self._args, out, self.int8_activations)
        return out


def _checked_bias(bias: torch.Tensor | None, out_features: int) -> torch.Tensor | None:
    """``bias`` as a contiguous fp32 [out_features] tensor (itself when it already is one)."""
    if bias is None:
        return None
    bias = bias.to(torch.float32).contiguous()
    if bias.shape != (out_features,):
        raise ValueError(f"bias must be [{out_features}], got {tuple(bias.shape)}")
    return bias


# (out_features, in_features, bits, codes, scales, mins, bias): the kernel's flat weight arguments,
# addresses for the tensors (bias 0 when absent), in ``_core.quant_linear``'s order.
_WeightArgs = tuple[int, int, int, int, int, int, int]


def _weight_args(weight: QuantWeight, bias: torch.Tensor | None) -> _WeightArgs:
    """The kernel's weight and bias arguments of ``weight`` and a checked ``bias``."""
    return (
        weight.out_features,
        weight.in_features,
        weight.bits,
        weight.codes.data_ptr(),
        weight.scales.data_ptr(),
        weight.mins.data_ptr() if weight.mins.numel() else 0,
        0 if bias is None else bias.data_ptr(),
    )


def _run(x: torch.Tensor, x_stride: int, weight_args: _WeightArgs, out: torch.Tensor, int8_activations: bool) -> None:
    """The kernel on checked tensors: fp32 CPU x [M, K] (row stride x_stride), out [M, N] contiguous."""
    _core.quant_linear(
        x.data_ptr(),
        x.shape[0],
        x_stride,
        *weight_args,
        out.data_ptr(),
        out.stride(0),
        torch.get_num_threads(),
        int8_activations,
    )


def dequantize_blocks(codes: torch.Tensor, scale: torch.Tensor, min: torch.Tensor) -> torch.Tensor:
    """fp32 ``W[N, K]`` from row-major codes and per-block scale/min (what the codes stand for)."""
    n, k = codes.shape
    w = codes.to(torch.float32).view(n, k // BLOCK, BLOCK) * scale.unsqueeze(-1) + min.unsqueeze(-1)
    return w.view(n, k)


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's activation rounding in torch: int codes and per-block scales of fp32 x [M, K]."""
    m, k = x.shape
    blocks = x.view(m, k // BLOCK, BLOCK)
    scale = blocks.abs().amax(-1) / 127.0  # [M, K/32], fp32 as in the kernel
    inv = torch.where(scale != 0, 1.0 / scale, torch.zeros_like(scale))
    codes = torch.round(blocks * inv.unsqueeze(-1)).clamp(-127, 127)  # torch.round: ties to even
    return codes.view(m, k), scale


def reference_quant_linear(
    x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, min: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """float64 oracle of :func:`quant_linear` from the unpacked codes (tests)."""
    m, k = x.shape
    n = codes.shape[0]
    xq, xs = quantize_activations(x.float())
    xq = xq.double().view(m, k // BLOCK, BLOCK)
    wq = codes.double().view(n, k // BLOCK, BLOCK)
    dots = torch.einsum("mbi,nbi->mnb", xq, wq)  # exact integer block dots
    out = (dots * xs.double().unsqueeze(1) * scale.double().unsqueeze(0)).sum(-1)
    out += (xs.double() * xq.sum(-1)) @ min.double().T
    if bias is not None:
        out += bias.double()
    return out
