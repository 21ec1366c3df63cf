"""Every decoder layer of a step in one core call: a typed wrapper over ``_core.DecoderStack``.

For fp32 CPU activations with block-quantized projections (the default serving path), a step's
~10 operations per layer -- norms, projections, RoPE, KV store, attention, SiLU-mul -- each cost a
Python call with its checks; at batch 1 that dispatch was ~25% of a decode step. The core runs
the same kernels, in the same order and with the same arithmetic, from one call
(cpp/include/trillium/kernels/decoder_layer.h), so results equal the per-operation path's.

The stack keeps the addresses of the weights and KV pools it was built with: they must stay
alive and in place (the model and the runner own them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from trillium import _core
from trillium.ops.attention import AttentionMetadata
from trillium.ops.kernel_specs import DTYPE_CODES
from trillium.ops.layer_ops import GELU_TANH, SILU
from trillium.ops.quant_linear import QuantWeight, _weight_args


@dataclass(frozen=True)
class LayerShape:
    hidden: int
    intermediate: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    rms_eps: float
    attn_scale: float  # softmax scale of every layer's attention


@dataclass(frozen=True)
class GemmaLayerParts:
    """What a Gemma 2/3 layer adds to Llama's (decoder_layer.h); the defaults are Llama's layer."""

    pre_feedforward_norm: torch.Tensor | None = None  # [H] fp32: sandwich norms, with post_feedforward_norm
    post_feedforward_norm: torch.Tensor | None = None
    gelu_tanh: bool = False  # the MLP gate's activation: GELU-tanh, not SiLU
    rope_cos: torch.Tensor | None = None  # [max_positions, D/2] fp32: the layer's own RoPE (local layers)
    rope_sin: torch.Tensor | None = None
    attn_softcap: float = 0.0  # > 0: attention scores soft-capped (Gemma 2)


def _address(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


def _weight(w: QuantWeight) -> tuple[int, int, int, int, int, int, int]:
    """The kernel's weight arguments without the bias (passed on its own)."""
    n, k, bits, codes, scales, mins, sub_scales, _ = _weight_args(w, None)
    return (n, k, bits, codes, scales, mins, sub_scales)


def _parts(w: QuantWeight | Sequence[QuantWeight]) -> list[tuple[int, int, int, int, int, int, int]]:
    """A fused projection's parts (one weight, or consecutive rows in different formats)."""
    return [_weight(w)] if isinstance(w, QuantWeight) else [_weight(p) for p in w]


class DecoderStack:
    """The layers of one model bound to one set of KV pools; :meth:`forward` runs a step."""

    def __init__(self, shape: LayerShape, activations: int) -> None:
        self.shape = shape
        self.activations = activations
        self._core = _core.DecoderStack()
        self._keep: list[torch.Tensor] = []  # tensors whose addresses the core holds

    def add_layer(
        self,
        input_norm: torch.Tensor,  # [H] fp32
        post_attention_norm: torch.Tensor,  # [H] fp32
        q_norm: torch.Tensor | None,  # [D] fp32: Qwen3's per-head norms of q and k, or None
        k_norm: torch.Tensor | None,
        qkv: QuantWeight | Sequence[QuantWeight],
        qkv_bias: torch.Tensor | None,  # [(Hq + 2 Hkv) D] fp32
        o: QuantWeight,
        gate_up: QuantWeight | Sequence[QuantWeight],
        down: QuantWeight,
        k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D], fp32 or bf16
        v_cache: torch.Tensor,
        window: int = 0,  # > 0: the layer's sliding-window attention (Mistral, Gemma)
        gemma: GemmaLayerParts | None = None,  # Gemma's differences from Llama's layer
    ) -> None:
        """Append the next layer. ValueError on a tensor the core cannot take (dtype, device,
        layout or size)."""
        s = self.shape
        g = gemma or GemmaLayerParts()
        extra = [g.pre_feedforward_norm, g.post_feedforward_norm, g.rope_cos, g.rope_sin]
        vectors = [input_norm, post_attention_norm] + [t for t in (qkv_bias, q_norm, k_norm, *extra) if t is not None]
        if (q_norm is None) != (k_norm is None):
            raise ValueError("q_norm and k_norm come together")
        if (g.pre_feedforward_norm is None) != (g.post_feedforward_norm is None) or (g.rope_cos is None) != (
            g.rope_sin is None
        ):
            raise ValueError("pre/post_feedforward_norm, and rope_cos/rope_sin, come together")
        if any(t.dtype != torch.float32 or not t.is_cpu or not t.is_contiguous() for t in vectors):
            raise ValueError("norm weights and the qkv bias must be contiguous fp32 CPU tensors")
        code = DTYPE_CODES.get(k_cache.dtype)
        pool = (k_cache.shape[2], k_cache.shape[3]) if k_cache.dim() == 4 else None
        if (
            code is None
            or pool != (s.num_kv_heads, s.head_dim)
            or v_cache.shape != k_cache.shape
            or v_cache.dtype != k_cache.dtype
            or not (k_cache.is_cpu and k_cache.is_contiguous() and v_cache.is_cpu and v_cache.is_contiguous())
        ):
            raise ValueError(
                f"KV pools must be equal contiguous CPU [blocks, block_size, {s.num_kv_heads}, {s.head_dim}]"
            )
        self._core.add_layer(
            hidden=s.hidden,
            intermediate=s.intermediate,
            num_q_heads=s.num_q_heads,
            num_kv_heads=s.num_kv_heads,
            head_dim=s.head_dim,
            rms_eps=s.rms_eps,
            input_norm=input_norm.data_ptr(),
            post_attention_norm=post_attention_norm.data_ptr(),
            q_norm=0 if q_norm is None else q_norm.data_ptr(),
            k_norm=0 if k_norm is None else k_norm.data_ptr(),
            qkv=_parts(qkv),
            qkv_bias=0 if qkv_bias is None else qkv_bias.data_ptr(),
            o=_weight(o),
            gate_up=_parts(gate_up),
            down=_weight(down),
            k_cache=k_cache.data_ptr(),
            v_cache=v_cache.data_ptr(),
            kv_dtype=code,
            num_blocks=k_cache.shape[0],
            block_size=k_cache.shape[1],
            window=window,
            pre_feedforward_norm=_address(g.pre_feedforward_norm),
            post_feedforward_norm=_address(g.post_feedforward_norm),
            activation=GELU_TANH if g.gelu_tanh else SILU,
            rope_cos=_address(g.rope_cos),
            rope_sin=_address(g.rope_sin),
            rope_max_positions=0 if g.rope_cos is None else g.rope_cos.shape[0],
            attn_softcap=g.attn_softcap,
        )
        self._keep += [*vectors, k_cache, v_cache]

    def forward(
        self,
        hidden: torch.Tensor,  # [T, H] fp32 contiguous: the embeddings; overwritten
        positions: torch.Tensor,  # [T] int64 contiguous
        rope_cos: torch.Tensor,  # [max_positions, D/2] fp32
        rope_sin: torch.Tensor,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run every layer: returns (the last layer's MLP output, the residual stream before it),
        ``hidden`` itself being the first. ValueError on inconsistent inputs."""
        tokens = hidden.shape[0]
        if (
            hidden.dtype != torch.float32
            or hidden.shape != (tokens, self.shape.hidden)
            or not hidden.is_contiguous()
            or positions.dtype != torch.int64
            or positions.shape != (tokens,)
            or not positions.is_contiguous()
            or sum(meta.query_lens) != tokens
        ):
            raise ValueError(f"hidden must be contiguous fp32 [T, {self.shape.hidden}] with int64 positions [T]")
        residual = torch.empty_like(hidden)
        self._core.forward(
            hidden=hidden.data_ptr(),
            residual=residual.data_ptr(),
            num_tokens=tokens,
            num_requests=len(meta.query_lens),
            decode=meta.max_query_len == 1,
            query_start_loc=meta.query_start_loc.data_ptr(),
            context_lens=meta.context_lens.data_ptr(),
            block_tables=meta.block_tables.data_ptr(),
            block_table_stride=meta.block_tables.shape[1],
            slot_mapping=meta.slot_mapping.data_ptr(),
            positions=positions.data_ptr(),
            rope_cos=rope_cos.data_ptr(),
            rope_sin=rope_sin.data_ptr(),
            rope_max_positions=rope_cos.shape[0],
            attn_scale=self.shape.attn_scale,
            activations=int(self.activations),
            num_threads=torch.get_num_threads(),
        )
        return hidden, residual
