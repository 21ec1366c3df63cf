"""Block-quantized linear layers: typed wrappers over ``_core.quant_linear`` (CPU only).

A weight ``W[N, K]`` is stored as integer codes of 4, 5, 6 or 8 bits with one fp32 scale and one
fp32 min per scale block of S weights along K (S = 32; 16 for 6 bits):
``W[n, k] = scale[n, k // S] * codes[n, k] + min[n, k // S]`` -- exactly GGUF's Q4_0, Q4_1, Q5_0,
Q5_1, Q8_0 and the K-quants Q4_K, Q5_K, Q6_K, so a quantized file is served without dequantizing
it. Formats whose mins are ``-offset * scale`` (Q4_0, Q5_0, Q6_K; Q8_0's zero) store no mins. By default the
activations stay fp32 and the result is ``x @ dequantize(W).T`` up to summation order
(:data:`Activations.EXACT`); with :data:`Activations.INT16` they are rounded to int16 per row and
32-block and the integer dot products are exact (every format; faster, ~1e-5 relative error); with
:data:`Activations.INT8` to int8 (as llama.cpp does; 4- and 8-bit per-block weights only):
:func:`reference_quant_linear` computes the int8 mode in float64.

The only caller of ``_core.quant_linear``: models go through :func:`quant_linear` (any leading
shape) or, for a layer that runs every step, :class:`BoundQuantLinear` (arguments resolved once).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from trillium import _core

BLOCK = _core.QUANT_BLOCK  # 32
BITS = (4, 5, 6, 8)
SUPER_BLOCK = 256  # weights per super scale of two-level (K-quant) scales


class Activations(enum.IntEnum):
    """How a quantized matmul treats its fp32 activations (``QuantActivations`` in quant_linear.h)."""

    EXACT = 0  # fp32 times the dequantized weights: Hugging Face parity
    INT8 = 1  # rounded to int8 per row and 32-block (llama.cpp's Q8_1): 4- and 8-bit per-block weights
    INT16 = 2  # rounded to int16 per row and 32-block: every format, ~256x less rounding than int8


def scale_block(bits: int) -> int:
    """Weights per scale along K: 16 for 6-bit codes (GGUF's Q6_K), else 32."""
    return 16 if bits == 6 else BLOCK


def symmetric_offset(bits: int) -> int:
    """What no mins stand for: ``w = scale * (code - offset)`` (8-bit codes are signed: 0)."""
    return 0 if bits == 8 else 1 << (bits - 1)


@dataclass(frozen=True)
class QuantWeight:
    """A packed weight (opaque layout, see cpp/include/trillium/kernels/quant_linear.h)."""

    out_features: int
    in_features: int
    bits: int
    codes: torch.Tensor  # uint8, packed
    scales: torch.Tensor  # float32, packed
    mins: torch.Tensor  # float32, packed; empty for the format's symmetric codes (no mins read)
    # Two-level scales (K-quants; quant_linear.h): uint8 sub-scales (then sub-mins), with `scales`
    # and `mins` the fp32 super scales per 256 weights; empty for per-block fp32 scales.
    sub_scales: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.uint8))

    @classmethod
    def pack(cls, codes: torch.Tensor, scale: torch.Tensor, min: torch.Tensor | None, bits: int) -> QuantWeight:
        """Pack row-major ``codes`` int8 [N, K] (``bits`` 4, 5, 6: unsigned codes below
        ``2**bits``; 8: signed) with ``scale`` and ``min`` fp32 [N, K / S] (S = :func:`scale_block`).
        ``min`` None, or equal to ``-symmetric_offset(bits) * scale`` (Q4_0, Q5_0, Q6_K; Q8_0's
        zeros), is not packed (``mins`` empty): a decode step reads its weights from memory, and
        the mins were 1/10 of a Q8_0 weight's bytes. Raises ValueError on bad sizes or codes."""
        if codes.dtype != torch.int8 or codes.dim() != 2:
            raise ValueError(f"codes must be a 2-D int8 tensor, got {codes.dtype} {tuple(codes.shape)}")
        if bits not in BITS:
            raise ValueError(f"bits must be one of {BITS}, got {bits}")
        n, k = codes.shape
        if k % BLOCK:
            raise ValueError(f"in_features must be a multiple of {BLOCK}, got {k}")
        blocks = k // scale_block(bits)
        codes = codes.contiguous()
        scale = scale.to(torch.float32).contiguous()
        if tuple(scale.shape) != (n, blocks) or (min is not None and tuple(min.shape) != (n, blocks)):
            shapes = tuple(scale.shape), None if min is None else tuple(min.shape)
            raise ValueError(f"scale and min must be [{n}, {blocks}], got {shapes}")
        if min is not None:
            min = min.to(torch.float32).contiguous()
            if torch.equal(min, scale * -float(symmetric_offset(bits))):
                min = None
        weight = cls.empty(n, k, bits, with_mins=min is not None)
        weight.pack_rows(0, codes, scale, min)
        return weight

    @classmethod
    def empty(
        cls, out_features: int, in_features: int, bits: int, with_mins: bool, two_level: bool = False
    ) -> QuantWeight:
        """An unfilled weight for :meth:`pack_rows` (a large tensor packed a few rows at a time);
        ``two_level``: K-quant scales (in_features a multiple of 256)."""
        if bits not in BITS:
            raise ValueError(f"bits must be one of {BITS}, got {bits}")
        if in_features % BLOCK or in_features <= 0 or out_features <= 0:
            raise ValueError(f"need out_features > 0 and in_features a positive multiple of {BLOCK}")
        if two_level and in_features % SUPER_BLOCK:
            raise ValueError(f"two-level scales need in_features a multiple of {SUPER_BLOCK}, got {in_features}")
        num_bytes, num_scales = _core.quant_linear_sizes(out_features, in_features, bits)
        floats = _core.quant_linear_super_count(out_features, in_features) if two_level else num_scales
        sub = num_scales * (2 if with_mins else 1) if two_level else 0
        return cls(
            out_features,
            in_features,
            bits,
            torch.empty(num_bytes, dtype=torch.uint8),
            torch.empty(floats, dtype=torch.float32),
            torch.empty(floats if with_mins else 0, dtype=torch.float32),
            torch.empty(sub, dtype=torch.uint8),
        )

    @property
    def two_level(self) -> bool:
        return self.sub_scales.numel() > 0

    def pack_rows(
        self,
        row: int,
        codes: torch.Tensor,
        scale: torch.Tensor,
        min: torch.Tensor | None,
        sub_scale: torch.Tensor | None = None,
        sub_min: torch.Tensor | None = None,
    ) -> None:
        """Pack output rows ``[row, row + len(codes))`` (``row`` a multiple of 32: the layout's
        tiles are 32 rows and lie one after another) as :meth:`pack` would. ``min`` must be given
        exactly when this weight has mins. A two-level weight takes super ``scale`` / ``min`` fp32
        [n, K / 256] and ``sub_scale`` [n, K / S] (int8 for 6 bits, else 0..255) / ``sub_min``
        [n, K / 32] (0..255). ValueError on bad sizes or codes."""
        n, k = codes.shape
        if (
            codes.dtype != torch.int8
            or k != self.in_features
            or row % 32
            or not 0 <= row < row + n <= self.out_features
        ):
            raise ValueError(f"rows [{row}, {row + n}) of width {k} do not fit this weight at a tile boundary")
        if (min is None) != (self.mins.numel() == 0):
            raise ValueError("min must be given exactly when the weight keeps mins")
        if (sub_scale is not None) != self.two_level or (sub_min is not None) != (self.two_level and min is not None):
            raise ValueError("sub_scale (and, with mins, sub_min) go with two-level weights only")
        blocks = k // (SUPER_BLOCK if self.two_level else scale_block(self.bits))
        scale = scale.to(torch.float32).contiguous()
        min = None if min is None else min.to(torch.float32).contiguous()
        if tuple(scale.shape) != (n, blocks) or (min is not None and tuple(min.shape) != (n, blocks)):
            raise ValueError(f"scale and min must be [{n}, {blocks}]")
        codes = codes.contiguous()
        bytes_before, scales_before = _core.quant_linear_sizes(row, k, self.bits) if row else (0, 0)
        if not self.two_level:
            _core.quant_linear_pack(
                codes.data_ptr(),
                scale.data_ptr(),
                0 if min is None else min.data_ptr(),
                n,
                k,
                self.bits,
                self.codes.data_ptr() + bytes_before,
                self.scales.data_ptr() + 4 * scales_before,
                self.mins.data_ptr() + 4 * scales_before if min is not None else 0,
            )
            return
        assert sub_scale is not None
        subs = k // scale_block(self.bits)
        sub_scale = sub_scale.to(torch.int8 if self.bits == 6 else torch.uint8).contiguous()
        sub_min = None if sub_min is None else sub_min.to(torch.uint8).contiguous()
        if tuple(sub_scale.shape) != (n, subs) or (sub_min is not None and tuple(sub_min.shape) != (n, k // BLOCK)):
            raise ValueError(f"sub_scale must be [{n}, {subs}] and sub_min [{n}, {k // BLOCK}]")
        supers_before = _core.quant_linear_super_count(row, k) if row else 0
        total_scales = _core.quant_linear_sizes(self.out_features, k, self.bits)[1]
        sub = self.sub_scales.data_ptr()
        _core.quant_linear_pack_two_level(
            codes.data_ptr(),
            scale.data_ptr(),
            0 if min is None else min.data_ptr(),
            sub_scale.data_ptr(),
            0 if sub_min is None else sub_min.data_ptr(),
            n,
            k,
            self.bits,
            self.codes.data_ptr() + bytes_before,
            self.scales.data_ptr() + 4 * supers_before,
            self.mins.data_ptr() + 4 * supers_before if min is not None else 0,
            sub + scales_before,
            sub + total_scales + scales_before if min is not None else 0,
        )

    @classmethod
    def pack_two_level(
        cls,
        codes: torch.Tensor,
        super_scale: torch.Tensor,
        super_min: torch.Tensor | None,
        sub_scale: torch.Tensor,
        sub_min: torch.Tensor | None,
        bits: int,
    ) -> QuantWeight:
        """Pack codes with two-level (K-quant) scales: see :meth:`pack_rows`. ValueError on bad input."""
        if codes.dtype != torch.int8 or codes.dim() != 2:
            raise ValueError(f"codes must be a 2-D int8 tensor, got {codes.dtype} {tuple(codes.shape)}")
        n, k = codes.shape
        weight = cls.empty(n, k, bits, with_mins=super_min is not None, two_level=True)
        weight.pack_rows(0, codes, super_scale, super_min, sub_scale, sub_min)
        return weight

    def dequantize_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """fp32 ``W[rows]`` [*rows.shape, K]: the same values the exact matmul multiplies with. An
        embedding lookup over a quantized token table. ValueError for a row outside [0, N)."""
        flat = rows.reshape(-1).to(torch.int64).contiguous()
        out = torch.empty(flat.numel(), self.in_features, dtype=torch.float32)
        _core.quant_linear_dequantize_rows(
            self.out_features,
            self.in_features,
            self.bits,
            self.codes.data_ptr(),
            self.scales.data_ptr(),
            self.mins.data_ptr() if self.mins.numel() else 0,
            self.sub_scales.data_ptr() if self.two_level else 0,
            flat.data_ptr(),
            flat.numel(),
            out.data_ptr(),
            self.in_features,
            torch.get_num_threads(),
        )
        return out.view(*rows.shape, self.in_features)

    @property
    def nbytes(self) -> int:
        return self.codes.numel() + 4 * (self.scales.numel() + self.mins.numel()) + self.sub_scales.numel()


def quant_linear(
    x: torch.Tensor,
    weight: QuantWeight,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    activations: int = Activations.EXACT,
) -> torch.Tensor:
    """``x [..., K] -> [..., N]``: ``x @ W.T (+ bias)`` on fp32 CPU tensors, W block-quantized.

    Exact by default (fp32 activations times the dequantized weights); ``activations``
    (:class:`Activations`) rounds x per 32-block first, to int16 or int8.
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
    _run(x2, x2.stride(0), _weight_args(weight, bias), out, activations)
    return out.view(*lead, weight.out_features)


class BoundQuantLinear:
    """:func:`quant_linear` for one weight (or a fused projection's parts: consecutive output rows
    packed in different formats), bias and activation mode, with the kernel's weight arguments
    resolved (and the bias checked) once -- for projections that run every step.

    Holds references to the weights and ``bias``, whose storage must not be replaced afterwards (the
    kernel keeps their addresses). ValueError at construction for a bias that is not [N], or parts
    of different in_features.
    """

    __slots__ = ("parts", "bias", "activations", "in_features", "out_features", "_args")

    def __init__(
        self,
        weight: QuantWeight | Sequence[QuantWeight],
        bias: torch.Tensor | None = None,
        activations: int = Activations.EXACT,
    ) -> None:
        self.parts = (weight,) if isinstance(weight, QuantWeight) else tuple(weight)
        if not self.parts or len({p.in_features for p in self.parts}) != 1:
            raise ValueError("a projection needs one or more parts of the same in_features")
        self.in_features = self.parts[0].in_features
        self.out_features = sum(p.out_features for p in self.parts)
        self.bias = _checked_bias(bias, self.out_features)
        self.activations = activations
        # (column offset, kernel arguments) per part; each part's bias is its slice of the bias.
        self._args: list[tuple[int, _WeightArgs]] = []
        offset = 0
        for part in self.parts:
            part_bias = None if self.bias is None else self.bias[offset : offset + part.out_features]
            self._args.append((offset, _weight_args(part, part_bias)))
            offset += part.out_features

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [T, K] -> [T, N]; [..., K] -> [..., N]
        """Same contract as :func:`quant_linear`. A contiguous fp32 CPU [T, K] input (every step's
        case) costs one feature-count check; anything else is checked in full first."""
        if x.dim() != 2 or x.dtype != torch.float32 or not x.is_cpu or not x.is_contiguous():
            if x.dtype != torch.float32 or x.device.type != "cpu":
                raise ValueError(f"quant_linear takes fp32 CPU activations, got {x.dtype} on {x.device}")
            if x.shape[-1] != self.in_features:
                raise ValueError(f"x has {x.shape[-1]} features, the weight expects {self.in_features}")
            lead = x.shape[:-1]
            return self(x.reshape(-1, self.in_features).contiguous()).view(*lead, self.out_features)
        if x.shape[1] != self.in_features:
            raise ValueError(f"x has {x.shape[1]} features, the weight expects {self.in_features}")
        out = torch.empty(x.shape[0], self.out_features, dtype=torch.float32)
        for offset, args in self._args:
            _run(x, self.in_features, args, out[:, offset:], self.activations)
        return out

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)


def _checked_bias(bias: torch.Tensor | None, out_features: int) -> torch.Tensor | None:
    """``bias`` as a contiguous fp32 [out_features] tensor (itself when it already is one)."""
    if bias is None:
        return None
    bias = bias.to(torch.float32).contiguous()
    if bias.shape != (out_features,):
        raise ValueError(f"bias must be [{out_features}], got {tuple(bias.shape)}")
    return bias


# (out_features, in_features, bits, codes, scales, mins, sub_scales, bias): the kernel's flat weight
# arguments, addresses for the tensors (0 when absent), in ``_core.quant_linear``'s order.
_WeightArgs = tuple[int, int, int, int, int, int, int, int]


def _weight_args(weight: QuantWeight, bias: torch.Tensor | None) -> _WeightArgs:
    """The kernel's weight and bias arguments of ``weight`` and a checked ``bias``."""
    return (
        weight.out_features,
        weight.in_features,
        weight.bits,
        weight.codes.data_ptr(),
        weight.scales.data_ptr(),
        weight.mins.data_ptr() if weight.mins.numel() else 0,
        weight.sub_scales.data_ptr() if weight.two_level else 0,
        0 if bias is None else bias.data_ptr(),
    )


def _run(x: torch.Tensor, x_stride: int, weight_args: _WeightArgs, out: torch.Tensor, activations: int) -> None:
    """The kernel on checked tensors: fp32 CPU x [M, K] (row stride x_stride), out [M, >= N] with
    unit column stride (a fused projection's part writes its columns of the whole output)."""
    _core.quant_linear(
        x.data_ptr(),
        x.shape[0],
        x_stride,
        *weight_args,
        out.data_ptr(),
        out.stride(0),
        torch.get_num_threads(),
        int(activations),
    )


def dequantize_blocks(codes: torch.Tensor, scale: torch.Tensor, min: torch.Tensor) -> torch.Tensor:
    """fp32 ``W[N, K]`` from row-major codes and per-scale-block scale/min (what the codes stand
    for; the scale block is K / scale.shape[1] weights), rounded once as the kernels do."""
    n, k = codes.shape
    size = k // scale.shape[1]
    c = codes.to(torch.float64).view(n, k // size, size)
    w = c * scale.double().unsqueeze(-1) + min.double().unsqueeze(-1)  # exact in float64: rounded once below
    return w.to(torch.float32).view(n, k)


def quantize_activations(x: torch.Tensor, top: int = 127) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's activation rounding in torch: int codes and per-block scales of fp32 x [M, K]
    (``top``: 127 for int8, 32767 for int16)."""
    m, k = x.shape
    blocks = x.view(m, k // BLOCK, BLOCK)
    scale = blocks.abs().amax(-1) / float(top)  # [M, K/32], fp32 as in the kernel
    inv = torch.where(scale != 0, 1.0 / scale, torch.zeros_like(scale))
    codes = torch.round(blocks * inv.unsqueeze(-1)).clamp(-top, top)  # torch.round: ties to even
    return codes.view(m, k), scale


def reference_quant_linear(
    x: torch.Tensor,
    codes: torch.Tensor,
    scale: torch.Tensor,
    min: torch.Tensor,
    bias: torch.Tensor | None = None,
    activations: int = Activations.INT8,
) -> torch.Tensor:
    """float64 oracle of :func:`quant_linear` with rounded ``activations`` (INT8 or INT16) from the
    unpacked codes and per-scale-block ``scale`` / ``min`` [N, K / S] (tests)."""
    m, k = x.shape
    n = codes.shape[0]
    size = k // scale.shape[1]  # weights per scale block
    xq, xs = quantize_activations(x.float(), 32767 if activations == Activations.INT16 else 127)
    xs = xs.double().repeat_interleave(BLOCK // size, dim=1)  # the activation scale of each scale block
    xq = xq.double().view(m, k // size, size)
    wq = codes.double().view(n, k // size, size)
    dots = torch.einsum("mbi,nbi->mnb", xq, wq)  # exact integer dots per scale block
    out = (dots * xs.unsqueeze(1) * scale.double().unsqueeze(0)).sum(-1)
    out += (xs * xq.sum(-1)) @ min.double().T
    if bias is not None:
        out += bias.double()
    return out
