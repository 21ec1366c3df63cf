"""Quantized GGUF weights kept quantized: block codes for the C++ block-quantized linear kernel.

Every type here is read as integer codes with one scale and one min per scale block,
``w = scale * code + min`` (``ops.quant_linear``), without any loss: the scales are products of
the file's fp16 and small integer scales, exact in fp32, and the kernel's one fma per weight
rounds ``scale * code + min`` once, as the file's own dequantization does. The K-quants keep their
two levels (an fp32 super scale per 256 weights times an integer sub-scale per block, computed in
the kernel): 0.75 bits a weight of scales instead of 2.

    Q4_0  [d f16][16 B: low nibbles = w 0..15, high = 16..31]        w = d (q - 8)            4 bits
    Q4_1  [d f16][m f16][16 B as Q4_0]                               w = d q + m              4 bits
    Q5_0  [d f16][qh u32: bit j = bit 4 of w j][16 B as Q4_0]        w = d (q - 16)           5 bits
    Q5_1  [d f16][m f16][qh u32][16 B as Q4_0]                       w = d q + m              5 bits
    Q8_0  [d f16][32 x int8]                                         w = d q                  8 bits
    Q4_K  256 weights: [d f16][dmin f16][12 B: 8 x (6-bit sc, 6-bit m)][128 B nibbles]
          sub-block j (32 weights): w = d sc_j q - dmin m_j                                     4 bits
    Q5_K  as Q4_K with [32 B qh: bit j of byte i = bit 4 of weight i of sub-block j]            5 bits
    Q6_K  256 weights: [128 B low nibbles][64 B 2-bit highs][16 x int8 sc][d f16]
          16-weight sub-block j: w = d sc_j (q - 32)                                          6 bits

Other types (Q2_K, Q3_K, IQ*, F16, ...) return None here and stay on the dense path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from gguf.constants import GGMLQuantizationType as QT

from trillium.models.config import ModelConfig
from trillium.models.gguf_file import GGUFFile, GGUFTensor
from trillium.ops.quant_linear import QuantWeight, symmetric_offset

# codes int8 [N, K], scale fp32 [N, K / S], min fp32 [N, K / S], bits (S: ops.quant_linear.scale_block)
BlockCodes = tuple[np.ndarray, np.ndarray, np.ndarray, int]
TWO_LEVEL = frozenset({QT.Q4_K, QT.Q5_K, QT.Q6_K})

# The types the kernel takes, with their code widths.
BITS = {QT.Q4_0: 4, QT.Q4_1: 4, QT.Q5_0: 5, QT.Q5_1: 5, QT.Q8_0: 8, QT.Q4_K: 4, QT.Q5_K: 5, QT.Q6_K: 6}
SUPPORTED = {qtype: qtype.name for qtype in BITS}
# Types whose mins are -offset * scale: packed without mins (the kernel derives them).
SYMMETRIC = frozenset({QT.Q4_0, QT.Q5_0, QT.Q6_K, QT.Q8_0})

# What the fused projections and the head are built from, in row order.
_PROJECTIONS = {
    "self_attn.qkv_proj": ("attn_q", "attn_k", "attn_v"),
    "self_attn.o_proj": ("attn_output",),
    "mlp.gate_up_proj": ("ffn_gate", "ffn_up"),
    "mlp.down_proj": ("ffn_down",),
}

Packed = QuantWeight | tuple[QuantWeight, ...]  # one weight, or a fused projection's parts


@dataclass
class Blocks:
    """A tensor's codes and scales as the kernel packs them (rows may be several tensors').

    Per-block scales: ``scale``/``min`` fp32 [N, K / S] (``min`` None: the format's symmetric
    codes). Two-level (K-quants): ``scale``/``min`` are the super scales [N, K / 256] and
    ``sub_scale`` [N, K / S] (int8 for 6 bits, else uint8) / ``sub_min`` [N, K / 32] uint8 the
    integer ones (``ops.quant_linear``)."""

    codes: np.ndarray
    scale: np.ndarray
    min: np.ndarray | None
    bits: int
    sub_scale: np.ndarray | None = None
    sub_min: np.ndarray | None = None

    @property
    def two_level(self) -> bool:
        return self.sub_scale is not None

    def key(self) -> tuple[int, bool, bool]:
        """What must match for row-concatenated pieces to share one packed weight."""
        return self.bits, self.two_level, self.min is None

    def rows(self, fn: Callable[[np.ndarray], np.ndarray]) -> Blocks:
        """The same row transformation (a permutation) applied to every row-indexed array."""
        return Blocks._of([None if a is None else fn(a) for a in self._arrays()], self.bits)

    def _arrays(self) -> tuple[np.ndarray | None, ...]:
        return self.codes, self.scale, self.min, self.sub_scale, self.sub_min

    @staticmethod
    def cat(pieces: list[Blocks]) -> Blocks:
        """Row-concatenated pieces of one :meth:`key`."""
        if len({p.key() for p in pieces}) != 1:
            raise ValueError("pieces of different formats do not concatenate")
        arrays = [p._arrays() for p in pieces]
        joined = [None if a[0] is None else np.concatenate(a) for a in zip(*arrays, strict=True)]
        return Blocks._of(joined, pieces[0].bits)

    @staticmethod
    def _of(arrays: list[np.ndarray | None], bits: int) -> Blocks:
        codes, scale, mins, sub_scale, sub_min = arrays
        assert codes is not None and scale is not None
        return Blocks(codes, scale, mins, bits, sub_scale, sub_min)

    def per_block(self) -> BlockCodes:
        """(codes, scale, min, bits) with one fp32 scale and min per scale block (what the values are)."""
        if not self.two_level:
            mins = self.min if self.min is not None else -float(symmetric_offset(self.bits)) * self.scale
            return self.codes, self.scale, mins.astype(np.float32), self.bits
        assert self.sub_scale is not None
        per_super = self.sub_scale.shape[1] // self.scale.shape[1]
        scale = np.repeat(self.scale, per_super, axis=1) * self.sub_scale.astype(np.float32)
        if self.min is None:
            mins = -float(symmetric_offset(self.bits)) * scale
        else:
            assert self.sub_min is not None
            mins = np.repeat(self.min, 8, axis=1) * self.sub_min.astype(np.float32)
        return self.codes, scale.astype(np.float32), mins.astype(np.float32), self.bits

    def _tensors(self) -> list[torch.Tensor | None]:
        return [None if a is None else torch.from_numpy(np.ascontiguousarray(a)) for a in self._arrays()]

    def pack(self) -> QuantWeight:
        codes, scale, mins, sub_scale, sub_min = self._tensors()
        assert codes is not None and scale is not None
        if sub_scale is None:
            return QuantWeight.pack(codes, scale, mins, self.bits)
        return QuantWeight.pack_two_level(codes, scale, mins, sub_scale, sub_min, self.bits)

    def pack_into(self, weight: QuantWeight, row: int) -> None:
        """These rows into ``weight`` (made by ``QuantWeight.empty`` for this format) at ``row``."""
        codes, scale, mins, sub_scale, sub_min = self._tensors()
        assert codes is not None and scale is not None
        weight.pack_rows(row, codes, scale, mins, sub_scale, sub_min)


_CHUNK_WEIGHTS = 1 << 22  # decoded at a time: the decoding's temporaries stay a few MB


def read_blocks(gguf: GGUFFile, tensor: GGUFTensor) -> Blocks | None:
    """The :class:`Blocks` of a 2-D tensor of a :data:`SUPPORTED` type, or None otherwise."""
    if tensor.qtype not in SUPPORTED or len(tensor.dims) != 2:
        return None
    return blocks_from_raw(np.asarray(gguf.raw(tensor)), tensor.qtype, *tensor.dims)


def read_packed(gguf: GGUFFile, tensor: GGUFTensor) -> QuantWeight | None:
    """The packed weight of a 2-D tensor of a :data:`SUPPORTED` type, or None otherwise.

    Decoded and packed a few tiles of rows at a time, straight into the packed buffers: a token
    table of 150k rows would otherwise hold its codes, their copies and the decoding's widened
    bit planes -- several times its packed size -- while it loads."""
    if tensor.qtype not in SUPPORTED or len(tensor.dims) != 2:
        return None
    n, k = tensor.dims
    qtype = QT(tensor.qtype)
    weight = QuantWeight.empty(n, k, BITS[qtype], with_mins=qtype not in SYMMETRIC, two_level=qtype in TWO_LEVEL)
    raw = np.asarray(gguf.raw(tensor)).reshape(n, -1)  # one row of blocks per output feature
    rows = max(32, _CHUNK_WEIGHTS // k // 32 * 32)  # whole tiles of 32 rows
    for row in range(0, n, rows):
        blocks_from_raw(raw[row : row + rows], qtype, min(rows, n - row), k).pack_into(weight, row)
    return weight


def _f16(raw: np.ndarray, at: int) -> np.ndarray:
    """The fp16 at byte ``at`` of every block row, as fp32 [blocks, 1]."""
    return raw[:, at : at + 2].copy().view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[blocks, 16 c] bytes -> [blocks, c, 32]: chunk j's low nibbles then its high nibbles."""
    chunks = qs.reshape(qs.shape[0], -1, 16 if qs.shape[1] == 16 else 32)
    return np.concatenate([chunks & 0x0F, chunks >> 4], axis=2)


def _k_scales(sc12: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K's 12 bytes -> the 8 sub-blocks' 6-bit scales and mins, [blocks, 8] each."""
    a, b, c = sc12[:, 0:4], sc12[:, 4:8], sc12[:, 8:12]
    sc = np.concatenate([a & 0x3F, (c & 0x0F) | ((a >> 6) << 4)], axis=1)
    mn = np.concatenate([b & 0x3F, (c >> 4) | ((b >> 6) << 4)], axis=1)
    return sc.astype(np.float32), mn.astype(np.float32)


def block_codes_from_raw(raw: np.ndarray, qtype: int, n: int, k: int) -> BlockCodes:
    """Decode the raw bytes of an [n, k] tensor of a :data:`SUPPORTED` type into codes and one fp32
    scale and min per scale block."""
    return blocks_from_raw(raw, qtype, n, k).per_block()


def blocks_from_raw(raw: np.ndarray, qtype: int, n: int, k: int) -> Blocks:
    """Decode the raw bytes of an [n, k] tensor of a :data:`SUPPORTED` type into :class:`Blocks`
    (two-level scales for the K-quants; symmetric types without mins)."""
    qtype = QT(qtype)
    if qtype not in SUPPORTED:
        raise ValueError(f"block codes are read for {', '.join(SUPPORTED.values())}, not {qtype.name}")
    per_block = 256 if qtype in TWO_LEVEL else 32
    raw = raw.reshape(n * k // per_block, -1)  # one row per block
    bits = BITS[qtype]
    codes: np.ndarray
    if qtype == QT.Q8_0:
        codes = raw[:, 2:].copy().view(np.int8)
        return Blocks(codes.reshape(n, k), _f16(raw, 0).reshape(n, -1), None, bits)
    if qtype in (QT.Q4_0, QT.Q4_1):
        codes = _nibbles(raw[:, 4 if qtype == QT.Q4_1 else 2 :]).reshape(raw.shape[0], 32)
        mins = _f16(raw, 2).reshape(n, -1) if qtype == QT.Q4_1 else None
        return Blocks(codes.view(np.int8).reshape(n, k), _f16(raw, 0).reshape(n, -1), mins, bits)
    if qtype in (QT.Q5_0, QT.Q5_1):
        at = 4 if qtype == QT.Q5_1 else 2
        qh = raw[:, at : at + 4].copy().view("<u4")  # [blocks, 1]
        high = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)
        codes = _nibbles(raw[:, at + 4 :]).reshape(raw.shape[0], 32) | (high << 4)
        mins = _f16(raw, 2).reshape(n, -1) if qtype == QT.Q5_1 else None
        return Blocks(codes.view(np.int8).reshape(n, k), _f16(raw, 0).reshape(n, -1), mins, bits)
    if qtype in (QT.Q4_K, QT.Q5_K):
        sc, mn = _k_scales(raw[:, 4:16])  # [blocks, 8] each, 6-bit
        qs = raw[:, 16:144] if qtype == QT.Q4_K else raw[:, 48:176]
        codes = _nibbles(qs).reshape(raw.shape[0], 8, 32)
        if qtype == QT.Q5_K:
            qh = raw[:, None, 16:48]  # [blocks, 1, 32]
            codes = codes | (((qh >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1) << 4)
        return Blocks(
            np.ascontiguousarray(codes).view(np.int8).reshape(n, k),
            _f16(raw, 0).reshape(n, -1),  # d
            -_f16(raw, 2).reshape(n, -1),  # -dmin: min = -dmin * m
            bits,
            sc.astype(np.uint8).reshape(n, -1),
            mn.astype(np.uint8).reshape(n, -1),
        )
    # Q6_K
    ql, qh2 = raw[:, 0:128].reshape(-1, 2, 1, 64), raw[:, 128:192].reshape(-1, 2, 1, 32)
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=2).reshape(raw.shape[0], 256)
    pairs = ((qh2 >> np.array([0, 2, 4, 6], np.uint8)[None, None, :, None]) & 3).reshape(raw.shape[0], 256)
    codes = low | (pairs << 4)
    return Blocks(
        codes.view(np.int8).reshape(n, k),
        _f16(raw, 208).reshape(n, -1),
        None,
        bits,
        raw[:, 192:208].copy().view(np.int8).reshape(n, -1),  # [n, K / 16] signed sub-scales
    )


def pack_fused(pieces: list[Blocks]) -> Packed:
    """One packed weight for row-concatenated pieces of one format, or parts where the format
    changes (consecutive pieces of the same :meth:`Blocks.key` are packed together)."""
    runs: list[list[Blocks]] = []
    for piece in pieces:
        if runs and runs[-1][-1].key() == piece.key():
            runs[-1].append(piece)
        else:
            runs.append([piece])
    parts = tuple(Blocks.cat(run).pack() for run in runs)
    return parts[0] if len(parts) == 1 else parts


def read_quant_weights(gguf: GGUFFile, config: ModelConfig, permuted: bool) -> dict[str, Packed] | None:
    """Packed weights for every projection of the model, keyed by our module names
    (``layers.0.self_attn.qkv_proj``, ..., ``lm_head``), and ``embed_tokens`` when the token table
    is of a kernel type too; or None if any projection is of a type the kernel does not take (then
    the whole model stays dense: one path per model).

    ``permuted``: undo llama.cpp's Q/K row permutation, as the dense loader does.
    """
    from trillium.models.gguf_loader import unpermute_qk

    by_name = {t.name: t for t in gguf.tensors}

    def codes(name: str) -> Blocks | None:
        tensor = by_name.get(name)
        return None if tensor is None else read_blocks(gguf, tensor)

    out: dict[str, Packed] = {}
    for i in range(config.num_layers):
        for module, kinds in _PROJECTIONS.items():
            if len(kinds) == 1:
                tensor = by_name.get(f"blk.{i}.{kinds[0]}.weight")
                packed = None if tensor is None else read_packed(gguf, tensor)
                if packed is None:
                    return None
                out[f"layers.{i}.{module}"] = packed
                continue
            pieces = [codes(f"blk.{i}.{kind}.weight") for kind in kinds]
            if any(p is None for p in pieces):
                return None
            found = dict(zip(kinds, pieces, strict=True))
            if permuted and "attn_q" in found:
                found["attn_q"] = found["attn_q"].rows(lambda a: unpermute_qk(a, config.num_heads))  # type: ignore[union-attr]
                found["attn_k"] = found["attn_k"].rows(lambda a: unpermute_qk(a, config.num_kv_heads))  # type: ignore[union-attr]
            out[f"layers.{i}.{module}"] = pack_fused([found[kind] for kind in kinds])  # type: ignore[misc]
    head_tensor = by_name.get("output.weight", by_name.get("token_embd.weight"))
    head = None if head_tensor is None else read_packed(gguf, head_tensor)
    if head is None:
        return None
    out["lm_head"] = head
    if "output.weight" not in by_name:
        out["embed_tokens"] = head  # tied: one packed table for the lookup and the head
    else:
        embed = by_name.get("token_embd.weight")
        packed_embed = None if embed is None else read_packed(gguf, embed)
        if packed_embed is not None:
            out["embed_tokens"] = packed_embed
    return out
