"""Llama-family decoder (Llama, SmolLM, Mistral, Qwen2) over the paged KV cache.

Weights arrive through :meth:`LlamaForCausalLM.load_weights` under Hugging Face names
(``model.layers.0.self_attn.q_proj.weight``, ...); it fuses q/k/v into one projection and
gate/up into another, so each layer runs two matmuls fewer per step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from trillium.models.config import ModelConfig
from trillium.models.layers import RMSNorm, RopeStep, RotaryEmbedding, rotate_
from trillium.ops.attention import AttentionMetadata, fresh_prefill_attention, paged_attention, store_kv
from trillium.ops.decoder_stack import DecoderStack, GemmaLayerParts, LayerShape
from trillium.ops.layer_ops import fused_ok, silu_and_mul
from trillium.ops.quant_linear import Activations, BoundQuantLinear, QuantWeight, quant_linear

KVCache = tuple[torch.Tensor, torch.Tensor]  # (k_cache, v_cache), each [num_blocks, block_size, Hkv, D]


def _linear(in_features: int, out_features: int, bias: bool, dtype: torch.dtype) -> nn.Linear:
    layer = nn.Linear(in_features, out_features, bias=bias, dtype=dtype)
    layer.requires_grad_(False)
    return layer


class QuantLinear(nn.Module):
    """``nn.Linear`` over a block-quantized weight (``ops.quant_linear``; fp32 CPU activations),
    or over a fused projection's parts when the file stores its pieces in different formats."""

    parts: tuple[QuantWeight, ...]

    def __init__(
        self,
        weight: QuantWeight | tuple[QuantWeight, ...],
        bias: torch.Tensor | None,
        activations: int = Activations.EXACT,
    ) -> None:
        super().__init__()
        self.parts = (weight,) if isinstance(weight, QuantWeight) else tuple(weight)
        self.activations = activations
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)
        # Kernel arguments resolved once: this runs 4 times per layer per step.
        self._op = BoundQuantLinear(self.parts, self.bias, activations)
        self.in_features, self.out_features = self._op.in_features, self._op.out_features

    @property
    def qweight(self) -> QuantWeight:
        """The weight of a one-part projection (ValueError for parts)."""
        if len(self.parts) != 1:
            raise ValueError(f"this projection is stored in {len(self.parts)} parts of different formats")
        return self.parts[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, in] -> [T, out]
        return self._op(x)


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype, window: int = 0) -> None:
        super().__init__()
        self.window = window  # > 0: sliding-window attention in this layer
        self.softcap = config.attn_softcap  # > 0: scores soft-capped (Gemma 2)
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim
        self.scale = config.attn_scale if config.attn_scale is not None else config.head_dim**-0.5
        self.qkv_proj: nn.Module = _linear(
            config.hidden_size, self.q_size + 2 * self.kv_size, config.attention_bias, dtype
        )
        self.o_proj: nn.Module = _linear(self.q_size, config.hidden_size, False, dtype)
        # Qwen3: each q and k head is RMS-normed (its own [D] weight) before RoPE.
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps, dtype) if config.qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps, dtype) if config.qk_norm else None

    def forward(
        self,
        hidden: torch.Tensor,  # [T, H]
        rope: RopeStep,  # this step's positions and RoPE tables, shared by every layer
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [T, H]
        num_tokens = hidden.shape[0]
        qkv = self.qkv_proj(hidden)  # [T, q_size + 2 * kv_size]
        heads = qkv.view(num_tokens, self.num_heads + 2 * self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q_end, k_end = self.num_heads, self.num_heads + self.num_kv_heads
            for norm, lo, hi in ((self.q_norm, 0, q_end), (self.k_norm, q_end, k_end)):
                part = heads[:, lo:hi].reshape(-1, self.head_dim)  # a copy: heads are strided by token
                normed = norm(part)
                assert isinstance(normed, torch.Tensor)
                heads[:, lo:hi] = normed.view(num_tokens, hi - lo, self.head_dim)
        # Q and K heads are adjacent in the fused output: rotate them in place in one pass.
        rotate_(heads[:, : self.num_heads + self.num_kv_heads], rope)
        q, k, v = heads.split([self.num_heads, self.num_kv_heads, self.num_kv_heads], dim=1)  # views [T, H*, D]
        k_cache, v_cache = kv_cache
        store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = None if self.window or self.softcap else fresh_prefill_attention(q, k, v, meta, self.scale)
        if out is None:
            out = paged_attention(q, k_cache, v_cache, meta, self.scale, window=self.window, softcap=self.softcap)
        projected: torch.Tensor = self.o_proj(out.to(hidden.dtype).reshape(num_tokens, self.q_size))
        return projected


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj: nn.Module = _linear(config.hidden_size, 2 * config.intermediate_size, False, dtype)
        self.down_proj: nn.Module = _linear(config.intermediate_size, config.hidden_size, False, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, H] -> [T, H]
        gate_up = self.gate_up_proj(x)  # [T, 2I]: [gate | up]
        if fused_ok(gate_up):
            activated = silu_and_mul(gate_up)
        else:
            gate, up = gate_up.split(self.intermediate_size, dim=-1)  # [T, I] each
            activated = F.silu(gate) * up
        out: torch.Tensor = self.down_proj(activated)
        return out


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype, window: int = 0) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.self_attn = LlamaAttention(config, dtype, window)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.mlp = LlamaMLP(config, dtype)

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        rope: RopeStep,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(this layer's MLP output, the residual stream before it); the caller adds them (the next
        layer's norm does, fused). ``residual`` is None for the first layer, whose input is the
        embedding itself."""
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(hidden, rope, kv_cache, meta)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


# HF name of an unfused projection -> (our fused parameter's module, shard index within it).
_FUSED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


class LlamaForCausalLM(nn.Module):
    """Decoder-only Llama-family model; one ``forward`` is one step over T flattened tokens."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        config.validate()
        self.config = config
        self.dtype = dtype
        # Under ``empty``'s meta device, no random init: ``normal_`` there goes through torch's
        # meta kernels, whose first call imports torch._dynamo (~3.5 s of every server start-up).
        weight = None
        if torch.get_default_device().type == "meta":
            weight = torch.empty(config.vocab_size, config.hidden_size, dtype=dtype)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, dtype=dtype, _weight=weight)
        self.embed_tokens.requires_grad_(False)
        self.layers = nn.ModuleList(self._make_layer(config, dtype, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.lm_head = (
            None if config.tie_word_embeddings else _linear(config.hidden_size, config.vocab_size, False, dtype)
        )
        self.quant_head: QuantWeight | None = None  # set by use_quant_weights
        self.quant_embed: QuantWeight | None = None  # the token table kept quantized (use_quant_weights)
        self.activations: int = Activations.EXACT
        # Run all layers of a step in one core call where the model allows it (fp32 CPU,
        # quantized projections; see ops.decoder_stack). False: the per-operation Python path.
        self.fused_layers = True
        self._stack: tuple[list[KVCache], DecoderStack] | None = None  # built for these KV pools
        self.rotary = RotaryEmbedding(
            config.head_dim, config.max_position_embeddings, config.rope_theta, config.rope_scaling
        )

    def _make_layer(self, config: ModelConfig, dtype: torch.dtype, index: int) -> nn.Module:
        """Decoder layer ``index`` (a family whose layers differ overrides this)."""
        return LlamaDecoderLayer(config, dtype, config.window_of(index))

    @classmethod
    def empty(cls, config: ModelConfig, dtype: torch.dtype, device: torch.device | str) -> LlamaForCausalLM:
        """A model whose parameters are allocated on ``device`` but uninitialized (no random init:
        loading a large model should not pay for it). Only :meth:`load_weights` makes it usable."""
        with torch.device("meta"):
            model = cls(config, dtype)
        # Not ``model.to_empty``: its ``empty_like`` of a meta tensor runs torch's Python
        # reference, whose first use imports sympy -- a second of every start-up.
        for module in model.modules():
            for name, param in module._parameters.items():
                if param is not None:
                    fresh = torch.empty(param.shape, dtype=param.dtype, device=device)
                    module._parameters[name] = nn.Parameter(fresh, requires_grad=param.requires_grad)
            for name, buffer in module._buffers.items():
                if buffer is not None:
                    module._buffers[name] = torch.empty(buffer.shape, dtype=buffer.dtype, device=device)
        model.rotary.build(inv_freq=None, device=device)
        return model

    def forward(
        self,
        input_ids: torch.Tensor,  # [T] int64
        positions: torch.Tensor,  # [T] int64
        kv_caches: list[KVCache],  # one per layer
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [T, H], after the final norm
        """Run one step: store this step's K/V into the caches (slots from ``meta``) and return
        the final-normed hidden state of every new token. Mutates ``kv_caches`` only."""
        hidden = self.embed(input_ids)  # [T, H] (a fresh tensor: the residual stream is updated in place)
        rope = self.rotary.for_step(positions, hidden.dtype)
        stack = self._decoder_stack(kv_caches, hidden, rope)
        residual: torch.Tensor | None = None
        if stack is not None:
            hidden, residual = stack.forward(hidden, rope.positions, rope.table_cos, rope.table_sin, meta)
        else:
            for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
                hidden, residual = layer(hidden, residual, rope, kv_cache, meta)
        normed: torch.Tensor
        normed, _ = self.norm(hidden, residual)
        return normed

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, H]
        """The token embeddings: rows of the (possibly quantized) token table."""
        if self.quant_embed is not None:
            return self.quant_embed.dequantize_rows(input_ids)
        out: torch.Tensor = self.embed_tokens(input_ids)
        return out

    def _decoder_stack(self, kv_caches: list[KVCache], hidden: torch.Tensor, rope: RopeStep) -> DecoderStack | None:
        """The one-call stack for these KV pools (built on first use), or None where the model
        runs per operation: fused_layers off, dense or non-fp32 weights, or non-CPU tensors."""
        if not (self.fused_layers and self.is_quantized and hidden.dtype == torch.float32 and hidden.is_cpu):
            return None
        if rope.cos is not None or len(kv_caches) != len(self.layers):
            return None
        if self._stack is not None and self._stack[0] is kv_caches:
            return self._stack[1]
        cfg, first_attn = self.config, self.layers[0].self_attn
        assert isinstance(first_attn, LlamaAttention)
        shape = LayerShape(
            cfg.hidden_size,
            cfg.intermediate_size,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.rms_norm_eps,
            first_attn.scale,
        )
        stack = DecoderStack(shape, self.activations)
        for index, (layer, (k_cache, v_cache)) in enumerate(zip(self.layers, kv_caches, strict=True)):
            attn, mlp = layer.self_attn, layer.mlp  # Llama's (or a subclass's, Gemma's) attention and MLP
            input_norm, post_attention_norm = layer.input_layernorm, layer.post_attention_layernorm
            assert isinstance(attn, LlamaAttention) and isinstance(mlp, LlamaMLP)
            assert isinstance(input_norm, RMSNorm) and isinstance(post_attention_norm, RMSNorm)
            projections = [attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj]
            quant = [p for p in projections if isinstance(p, QuantLinear)]
            if len(quant) != len(projections):
                return None
            qkv, o, gate_up, down = quant
            stack.add_layer(
                input_norm.weight,
                post_attention_norm.weight,
                None if attn.q_norm is None else attn.q_norm.weight,
                None if attn.k_norm is None else attn.k_norm.weight,
                qkv.parts,
                qkv.bias,
                o.qweight,
                gate_up.parts,
                down.qweight,
                k_cache,
                v_cache,
                window=attn.window,
                gemma=self._gemma_parts(index),
            )
        self._stack = (kv_caches, stack)
        return stack

    def _gemma_parts(self, index: int) -> GemmaLayerParts | None:
        """What layer ``index`` adds to Llama's layer in the one-call stack (Gemma overrides it)."""
        return None

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, H] -> [N, V] fp32
        if self.quant_head is not None:
            logits = quant_linear(hidden, self.quant_head, activations=self.activations)
        else:
            weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
            logits = F.linear(hidden, weight).float()
        cap = self.config.final_softcap
        if cap > 0:  # Gemma 2: logits soft-capped to (-cap, cap)
            logits = torch.tanh(logits / cap) * cap
        return logits

    @property
    def is_quantized(self) -> bool:
        return self.quant_head is not None

    def use_quant_weights(
        self, weights: Mapping[str, QuantWeight | tuple[QuantWeight, ...]], activations: int = Activations.EXACT
    ) -> None:
        """Swap every projection (and the output head) for its block-quantized weight
        (``activations``: how their matmuls treat activations, ``ops.quant_linear.Activations``).

        ``weights`` maps module names (``layers.0.self_attn.qkv_proj``, ..., ``lm_head``) to packed
        weights of the same shapes -- a fused projection may come as parts of different formats --
        and optionally ``embed_tokens`` to the packed token table [V, H], looked up row by row
        instead of a dense table. The dense matrices they replace are freed. Raises ValueError on
        a missing name or a shape mismatch, before changing anything.
        """
        modules = dict(self.named_modules())
        targets = [n for n, m in modules.items() if isinstance(m, nn.Linear) and n != "lm_head"]
        missing = [n for n in [*targets, "lm_head"] if n not in weights]
        if missing:
            raise ValueError(f"quantized weights missing for {missing[:3]}")

        def shape(packed: QuantWeight | tuple[QuantWeight, ...]) -> tuple[int, int]:
            parts = (packed,) if isinstance(packed, QuantWeight) else packed
            return sum(p.out_features for p in parts), parts[0].in_features

        cfg = self.config
        expected = {n: tuple(modules[n].weight.shape) for n in targets}
        expected["lm_head"] = (cfg.vocab_size, cfg.hidden_size)
        if "embed_tokens" in weights:
            expected["embed_tokens"] = (cfg.vocab_size, cfg.hidden_size)
        for name, want in expected.items():
            if shape(weights[name]) != want:
                raise ValueError(
                    f"{name}: quantized weight is {'x'.join(map(str, shape(weights[name])))}, expected {want}"
                )
        for name in ("lm_head", "embed_tokens"):
            if name in weights and not isinstance(weights[name], QuantWeight):
                raise ValueError(f"{name}: expected one packed weight, not parts")
        for name in targets:
            parent_name, _, leaf = name.rpartition(".")
            parent = modules[parent_name] if parent_name else self
            setattr(parent, leaf, QuantLinear(weights[name], modules[name].bias, activations))
        self.activations = activations
        self.lm_head = None
        head = weights["lm_head"]
        assert isinstance(head, QuantWeight)
        self.quant_head = head
        embed = weights.get("embed_tokens")
        if isinstance(embed, QuantWeight):
            self.quant_embed = embed
            self.embed_tokens.weight = nn.Parameter(
                torch.empty(0, cfg.hidden_size, dtype=self.dtype), requires_grad=False
            )

    def allocate_kv_caches(
        self, num_blocks: int, block_size: int, dtype: torch.dtype | None = None, device: torch.device | str = "cpu"
    ) -> list[KVCache]:
        """Zeroed (K, V) pools, one per layer, each ``[num_blocks, block_size, Hkv, D]``."""
        cfg = self.config
        shape = (num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
        dtype = dtype or self.dtype
        return [
            (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(cfg.num_layers)
        ]

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named tensors into the (fused) parameters, converting dtype on the way.

        Raises ValueError for an unknown name, a shape mismatch, or a parameter left unloaded
        (a model built with :meth:`empty` would otherwise run on garbage memory).
        With tied embeddings ``lm_head.weight`` is ignored, unless the checkpoint lacks
        ``embed_tokens.weight`` (safetensors' de-duplication may keep either name).
        """
        params = dict(self.named_parameters())
        loaded: set[str] = set()  # our parameter names, with ":shard" for fused ones
        tied_head = None
        for hf_name, tensor in weights:
            name = hf_name.removeprefix("model.")
            if name == "embed_tokens.weight" and self.quant_embed is not None:
                continue  # looked up in the quantized table
            if name == "lm_head.weight" and self.lm_head is None:
                tied_head = tensor  # used only if the checkpoint stored the tied matrix under this name
                continue
            if name.startswith("rotary") or name.endswith("rotary_emb.inv_freq"):
                continue
            module, _, leaf = name.rpartition(".")
            parent, _, proj = module.rpartition(".")
            if proj in _FUSED:
                fused, shard = _FUSED[proj]
                target = f"{parent}.{fused}.{leaf}"
                param = params.get(target)
                if param is None:
                    raise ValueError(f"unexpected weight {hf_name!r}")
                sizes = self._shard_sizes(fused)
                offset = sum(sizes[:shard])
                dest = param.narrow(0, offset, sizes[shard])
                key = f"{target}:{shard}"
            else:
                own = params.get(name)
                if own is None:
                    raise ValueError(f"unexpected weight {hf_name!r}")
                dest = own
                key = name
            if tuple(dest.shape) != tuple(tensor.shape):
                raise ValueError(f"weight {hf_name!r} has shape {tuple(tensor.shape)}, expected {tuple(dest.shape)}")
            dest.copy_(tensor)
            loaded.add(key)
        if "embed_tokens.weight" not in loaded and tied_head is not None and self.quant_embed is None:
            params["embed_tokens.weight"].copy_(tied_head)
            loaded.add("embed_tokens.weight")
        missing = [n for n in self._expected_keys() if n not in loaded]
        if missing:
            raise ValueError(f"{len(missing)} weights missing from the checkpoint, e.g. {missing[:3]}")
        self._use_column_major_weights()

    def _use_column_major_weights(self) -> None:
        """Store fp32 CPU projection weights as [in, out] in memory (still seen as [out, in]).

        F.linear then runs MKL's plain NN sgemm instead of the NT one, which on this CPU class is
        2-5x faster for the 4-48 row matmuls of decode batches (and equal elsewhere). bf16 and
        non-CPU tensors are left alone (no gain measured). The tied embedding keeps its row layout.
        """
        for module in self.layers.modules():
            if (
                isinstance(module, nn.Linear)
                and module.weight.dtype == torch.float32
                and module.weight.device.type == "cpu"
            ):
                module.weight.data = module.weight.data.t().contiguous().t()

    def _shard_sizes(self, fused: str) -> list[int]:
        cfg = self.config
        if fused == "qkv_proj":
            q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
            return [q, kv, kv]
        return [cfg.intermediate_size, cfg.intermediate_size]

    def _expected_keys(self) -> list[str]:
        keys = []
        for name, _ in self.named_parameters():
            if name == "embed_tokens.weight" and self.quant_embed is not None:
                continue
            module, _, _leaf = name.rpartition(".")
            fused = module.rpartition(".")[2]
            if fused == "qkv_proj":
                keys += [f"{name}:{i}" for i in range(3)]
            elif fused == "gate_up_proj":
                keys += [f"{name}:{i}" for i in range(2)]
            else:
                keys.append(name)
        return keys
