"""Quantized GGUF weights kept quantized: block codes for the C++ block-quantized linear kernel.

GGUF's Q4_0, Q4_1 and Q8_0 blocks (32 weights each) are read as integer codes plus one scale and
one min per block, ``w = scale * code + min``, without any loss:

    Q4_0  [d: f16][16 bytes: low nibbles = weights 0..15, high = 16..31]   w = d * (q - 8)
    Q4_1  [d: f16][m: f16][16 bytes as Q4_0]                               w = d * q + m
    Q8_0  [d: f16][32 x int8]                                              w = d * q

Other types (Q5_*, K-quants, F16, ...) return None here and stay on the dense path.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from gguf.constants import GGMLQuantizationType as QT

from trillium.models.config import ModelConfig
from trillium.models.gguf_file import GGUFFile, GGUFTensor
from trillium.ops.quant_linear import QuantWeight

BlockCodes = tuple[np.ndarray, np.ndarray, np.ndarray, int]  # codes int8 [N, K], scale [N, K/32], min, bits

SUPPORTED = {QT.Q4_0: "Q4_0", QT.Q4_1: "Q4_1", QT.Q8_0: "Q8_0"}


def read_block_codes(gguf: GGUFFile, tensor: GGUFTensor) -> BlockCodes | None:
    """(codes, scale, min, bits) of a 2-D Q4_0 / Q4_1 / Q8_0 tensor, or None for other types."""
    if tensor.qtype not in SUPPORTED or len(tensor.dims) != 2:
        return None
    return block_codes_from_raw(np.asarray(gguf.raw(tensor)), tensor.qtype, *tensor.dims)


def block_codes_from_raw(raw: np.ndarray, qtype: int, n: int, k: int) -> BlockCodes:
    """Decode the raw bytes of an [n, k] Q4_0 / Q4_1 / Q8_0 tensor into codes, scale, min."""
    raw = raw.reshape(n * k // 32, -1)  # one row per block
    d = raw[:, :2].copy().view(np.float16).astype(np.float32).reshape(n, k // 32)
    if qtype == QT.Q8_0:
        codes = raw[:, 2:].copy().view(np.int8).reshape(n, k)
        return codes, d, np.zeros_like(d), 8
    if qtype == QT.Q4_1:
        m = raw[:, 2:4].copy().view(np.float16).astype(np.float32).reshape(n, k // 32)
        qs = raw[:, 4:]
    elif qtype == QT.Q4_0:
        m = -8.0 * d
        qs = raw[:, 2:]
    else:
        raise ValueError(f"block codes are read for Q4_0, Q4_1 and Q8_0 only, not type {qtype}")
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int8).reshape(n, k)
    return codes, d, m, 4


def _rows(block_codes: BlockCodes, fn: Callable[[np.ndarray], np.ndarray]) -> BlockCodes:
    codes, scale, mins, bits = block_codes
    return fn(codes), fn(scale), fn(mins), bits


def _cat(parts: list[BlockCodes]) -> BlockCodes:
    bits = {p[3] for p in parts}
    if len(bits) != 1:
        raise ValueError("fused projections must share one quantization type")
    return (
        np.concatenate([p[0] for p in parts]),
        np.concatenate([p[1] for p in parts]),
        np.concatenate([p[2] for p in parts]),
        bits.pop(),
    )


def _pack(block_codes: BlockCodes) -> QuantWeight:
    codes, scale, mins, bits = block_codes
    return QuantWeight.pack(
        torch.from_numpy(np.ascontiguousarray(codes)), torch.from_numpy(scale), torch.from_numpy(mins), bits
    )


def read_quant_weights(gguf: GGUFFile, config: ModelConfig, permuted: bool) -> dict[str, QuantWeight] | None:
    """Packed weights for every projection of the model, keyed by our module names
    (``layers.0.self_attn.qkv_proj``, ..., ``lm_head``), or None if any projection is of a type
    the kernel does not take (then the whole model stays dense: one path per model).

    ``permuted``: undo llama.cpp's Q/K row permutation, as the dense loader does.
    """
    from trillium.models.gguf_loader import unpermute_qk

    by_name = {t.name: t for t in gguf.tensors}

    def codes(name: str) -> BlockCodes | None:
        tensor = by_name.get(name)
        return None if tensor is None else read_block_codes(gguf, tensor)

    out: dict[str, QuantWeight] = {}
    for i in range(config.num_layers):
        found = {
            kind: codes(f"blk.{i}.{kind}.weight")
            for kind in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
        }
        parts = {kind: p for kind, p in found.items() if p is not None}
        if len(parts) < len(found):
            return None
        q, k = parts["attn_q"], parts["attn_k"]
        if permuted:
            q = _rows(q, lambda a: unpermute_qk(a, config.num_heads))
            k = _rows(k, lambda a: unpermute_qk(a, config.num_kv_heads))
        prefix = f"layers.{i}"
        out[f"{prefix}.self_attn.qkv_proj"] = _pack(_cat([q, k, parts["attn_v"]]))
        out[f"{prefix}.self_attn.o_proj"] = _pack(parts["attn_output"])
        out[f"{prefix}.mlp.gate_up_proj"] = _pack(_cat([parts["ffn_gate"], parts["ffn_up"]]))
        out[f"{prefix}.mlp.down_proj"] = _pack(parts["ffn_down"])
    head = codes("output.weight") if "output.weight" in by_name else codes("token_embd.weight")
    if head is None:
        return None
    out["lm_head"] = _pack(head)
    return out
