"""Gemma 2 and Gemma 3 text decoders over the paged KV cache: the Llama-family model with Gemma's
differences.

    embeddings scaled by sqrt(hidden)
    per layer: h = norm_in(x); a = post_attn_norm(attn(h)); x += a
               h = pre_ffn_norm(x); m = post_ffn_norm(down(gelu_tanh(gate(h)) * up(h))); x += m
    attention: softmax scale query_pre_attn_scalar^-1/2; local layers slide over the last
               `sliding_window` positions; every `pattern`-th layer is global (full attention)
    Gemma 3:   q/k heads RMS-normed before RoPE (as Qwen3); local layers have their own RoPE base
    Gemma 2:   scores soft-capped (cap * tanh(s / cap)) in the attention kernels, and the final
               logits too; every other layer slides

Norm weights are used as they are: Gemma computes ``x_normed * (1 + w)``, and the loaders hand over
``1 + w`` (llama.cpp's converter already stores it so; the Hugging Face loader adds the 1). Weights
arrive under Hugging Face names through :meth:`LlamaForCausalLM.load_weights`, fused the same way,
so quantized GGUF projections and the quantized token table work as for Llama. With quantized projections on fp32 CPU activations the
layers run in the core's one-call decoder stack (its Gemma fields: sandwich norms, GELU-tanh, the
local layers' RoPE table, soft-capping), through the same kernels as the per-operation path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trillium.models.config import ModelConfig
from trillium.models.layers import RMSNorm, RopeStep, RotaryEmbedding
from trillium.models.llama import KVCache, LlamaAttention, LlamaForCausalLM, LlamaMLP
from trillium.ops.attention import AttentionMetadata
from trillium.ops.decoder_stack import GemmaLayerParts
from trillium.ops.layer_ops import GELU_TANH, fused_ok, silu_and_mul


class GemmaMLP(LlamaMLP):
    """Llama's fused gate/up and down projections, with GELU (tanh approximation) for SiLU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, H] -> [T, H]
        gate_up = self.gate_up_proj(x)
        if fused_ok(gate_up):  # the core's op, as the one-call stack computes it
            activated = silu_and_mul(gate_up, GELU_TANH)
        else:
            gate, up = gate_up.split(self.intermediate_size, dim=-1)
            activated = F.gelu(gate, approximate="tanh") * up
        out: torch.Tensor = self.down_proj(activated)
        return out


class GemmaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype, window: int, local: bool) -> None:
        super().__init__()
        self.local = local  # a local (sliding) layer: Gemma 3 rotates it with the local RoPE base
        h, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = RMSNorm(h, eps, dtype)
        self.self_attn = LlamaAttention(config, dtype, window)
        self.post_attention_layernorm = RMSNorm(h, eps, dtype)
        self.pre_feedforward_layernorm = RMSNorm(h, eps, dtype)
        self.mlp = GemmaMLP(config, dtype)
        self.post_feedforward_layernorm = RMSNorm(h, eps, dtype)

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        rope: RopeStep,
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Same contract as ``LlamaDecoderLayer.forward``: (this layer's normed MLP output, the
        residual stream before it); the next layer's input norm adds them."""
        if residual is None:
            residual = hidden
            x = self.input_layernorm(hidden)
        else:
            x, residual = self.input_layernorm(hidden, residual)
        assert isinstance(x, torch.Tensor)
        attn = self.post_attention_layernorm(self.self_attn(x, rope, kv_cache, meta))
        assert isinstance(attn, torch.Tensor)
        x, residual = self.pre_feedforward_layernorm(attn, residual)  # residual += attn
        out = self.post_feedforward_layernorm(self.mlp(x))
        assert isinstance(out, torch.Tensor)
        return out, residual


def _is_local(config: ModelConfig, layer: int) -> bool:
    """Whether ``layer`` is one of the local (sliding) layers, whatever the window's size."""
    if config.sliding_layers is not None:
        return layer in config.sliding_layers
    return config.window_of(layer) > 0


class GemmaForCausalLM(LlamaForCausalLM):
    """Gemma 2 and 3 (text): see the module docstring. Loading, quantized weights, KV pools and logits
    are the Llama model's."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__(config, dtype)
        # Local (sliding) layers rotate with their own base; global ones with the main one.
        self.rotary_local = RotaryEmbedding(
            config.head_dim, config.max_position_embeddings, config.rope_local_theta or config.rope_theta, None
        )

    def _make_layer(self, config: ModelConfig, dtype: torch.dtype, index: int) -> nn.Module:
        return GemmaDecoderLayer(config, dtype, config.window_of(index), _is_local(config, index))

    @classmethod
    def empty(cls, config: ModelConfig, dtype: torch.dtype, device: torch.device | str) -> LlamaForCausalLM:
        model = super().empty(config, dtype, device)
        assert isinstance(model, GemmaForCausalLM)
        model.rotary_local.build(inv_freq=None, device=device)
        return model

    def _gemma_parts(self, index: int) -> GemmaLayerParts:
        layer = self.layers[index]
        assert isinstance(layer, GemmaDecoderLayer)
        return GemmaLayerParts(
            pre_feedforward_norm=layer.pre_feedforward_layernorm.weight,
            post_feedforward_norm=layer.post_feedforward_layernorm.weight,
            gelu_tanh=True,
            rope_cos=self.rotary_local.cos if layer.local else None,
            rope_sin=self.rotary_local.sin if layer.local else None,
            attn_softcap=layer.self_attn.softcap,
        )

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        # Gemma scales the embeddings by sqrt(hidden), rounded to the weights' dtype first (as HF).
        scale = torch.tensor(self.config.hidden_size**0.5, dtype=torch.float32).to(self.dtype)
        return super().embed(input_ids) * scale

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        hidden = self.embed(input_ids)
        rope_global = self.rotary.for_step(positions, hidden.dtype)
        residual: torch.Tensor | None = None
        stack = self._decoder_stack(kv_caches, hidden, rope_global)
        if stack is not None:  # the local layers' RoPE tables were bound with them
            hidden, residual = stack.forward(
                hidden, rope_global.positions, rope_global.table_cos, rope_global.table_sin, meta
            )
        else:
            rope_local = self.rotary_local.for_step(positions, hidden.dtype)
            for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
                assert isinstance(layer, GemmaDecoderLayer)
                rope = rope_local if layer.local else rope_global
                hidden, residual = layer(hidden, residual, rope, kv_cache, meta)
        normed: torch.Tensor
        normed, _ = self.norm(hidden, residual)
        return normed
