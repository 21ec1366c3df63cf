"""Decode steps of a :class:`~trillium.models.llama.LlamaForCausalLM` through ``torch.compile``.

An opt-in path for decode-only steps (one new token per request) of an fp32 CPU model. The
model's weights are flattened once into :class:`DecodeWeights`; :func:`decode_forward` is the
model's ``forward`` + ``compute_logits`` written against the ``torch.ops.trillium.*`` custom
operators (:mod:`trillium.ops.torch_ops`), which dynamo traces without graph breaks, so inductor
sees a whole step as one graph: the C++ kernels stay opaque calls, the glue between them
(embedding, views, the residual stream) is fused or planned away, and the Python of the nn.Module
tree runs once at trace time instead of every step.

:class:`CompiledDecoder` owns one compiled function specialised (``dynamic=False``) per batch
bucket: a step of R requests runs in the smallest bucket B >= R, its inputs padded to fixed shapes

    input_ids, positions, slot_mapping, context_lens   [B]
    block_tables                                       [B, W]   W = blocks of the longest context
    query_start_loc                                    [B+1]    0..B (one token per request)

Padding rows write nothing (slot -1) and attend to one position of block 0 (context_len 1);
their logits are dropped. Values change every step, shapes never do, so no step recompiles.
"""

from __future__ import annotations

import time
import types
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from trillium.models.llama import KVCache, LlamaDecoderLayer, LlamaForCausalLM, QuantLinear
from trillium.models.step_buckets import StepBuckets
from trillium.ops import torch_ops  # noqa: F401  (registers torch.ops.trillium.*)

DEFAULT_BUCKETS = (1, 8, 32)


class Projection(NamedTuple):
    """One linear layer: dense (``weight`` set) or block-quantized (``codes`` ... set)."""

    weight: torch.Tensor | None  # [N, K] fp32 (dense)
    bias: torch.Tensor | None  # [N]
    codes: torch.Tensor | None  # QuantWeight fields (quantized)
    scales: torch.Tensor | None
    mins: torch.Tensor | None
    out_features: int
    in_features: int
    bits: int
    activations: int

    @classmethod
    def of(cls, module: nn.Module) -> Projection:
        """The projection of an ``nn.Linear`` or :class:`QuantLinear`; TypeError otherwise."""
        if isinstance(module, QuantLinear):
            w = module.qweight  # ValueError for a projection stored in parts (not compiled)
            if w.two_level:
                raise ValueError("compiled decode takes per-block scales, not two-level (K-quant) weights")
            return cls(None, module.bias, w.codes, w.scales, w.mins, w.out_features, w.in_features, w.bits,
                       module.activations)  # fmt: skip
        if isinstance(module, nn.Linear):
            return cls(module.weight, module.bias, None, None, None, module.out_features, module.in_features, 0, 0)
        raise TypeError(f"not a projection: {type(module).__name__}")


class LayerWeights(NamedTuple):
    input_norm: torch.Tensor  # [H] fp32
    qkv: Projection
    o: Projection
    post_norm: torch.Tensor  # [H] fp32
    gate_up: Projection
    down: Projection


class DecodeWeights(NamedTuple):
    """Everything :func:`decode_forward` reads from the model (references, nothing copied)."""

    embed: torch.Tensor  # [V, H]
    layers: tuple[LayerWeights, ...]
    final_norm: torch.Tensor  # [H]
    head: Projection  # the output head (the tied embedding when the model has no lm_head)
    rope_cos: torch.Tensor  # [max_positions, D/2] fp32
    rope_sin: torch.Tensor
    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float
    scale: float

    @classmethod
    def of(cls, model: LlamaForCausalLM) -> DecodeWeights:
        """The weights of an fp32 CPU model (dense or quantized). ValueError for any other dtype or
        device: the fused CPU kernels take fp32 only."""
        if model.dtype != torch.float32 or model.embed_tokens.weight.device.type != "cpu":
            raise ValueError(f"compiled decode needs an fp32 CPU model, got {model.dtype} on "
                             f"{model.embed_tokens.weight.device}")  # fmt: skip
        if model.quant_embed is not None:
            raise ValueError("compiled decode reads a dense token table; this model keeps it quantized")
        c = model.config
        if type(model) is not LlamaForCausalLM or c.qk_norm or c.sliding_window or c.attn_scale or c.attn_softcap:
            raise ValueError("compiled decode runs Llama's plain layer: no q/k norms, windows, scales or caps")
        cfg = model.config
        decoder_layers = [layer for layer in model.layers if isinstance(layer, LlamaDecoderLayer)]
        layers = tuple(
            LayerWeights(
                layer.input_layernorm.weight,
                Projection.of(layer.self_attn.qkv_proj),
                Projection.of(layer.self_attn.o_proj),
                layer.post_attention_layernorm.weight,
                Projection.of(layer.mlp.gate_up_proj),
                Projection.of(layer.mlp.down_proj),
            )
            for layer in decoder_layers
        )
        if model.quant_head is not None:
            w = model.quant_head
            if w.two_level:
                raise ValueError("compiled decode takes per-block scales, not two-level (K-quant) weights")
            head = Projection(None, None, w.codes, w.scales, w.mins, w.out_features, w.in_features, w.bits,
                              model.activations)  # fmt: skip
        else:
            head = Projection.of(model.lm_head if model.lm_head is not None else _tied_head(model))
        return cls(
            embed=model.embed_tokens.weight,
            layers=layers,
            final_norm=model.norm.weight,
            head=head,
            rope_cos=model.rotary.cos,
            rope_sin=model.rotary.sin,
            num_heads=cfg.num_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            eps=cfg.rms_norm_eps,
            scale=cfg.head_dim**-0.5,
        )


def _tied_head(model: LlamaForCausalLM) -> nn.Linear:
    """An nn.Linear view of the tied embedding (shares its storage)."""
    vocab, hidden = model.embed_tokens.weight.shape
    head = nn.Linear(hidden, vocab, bias=False, device="meta")
    head.weight = model.embed_tokens.weight
    return head


def project(x: torch.Tensor, p: Projection) -> torch.Tensor:  # [T, K] -> [T, N]
    if p.weight is not None:
        return F.linear(x, p.weight, p.bias)
    out: torch.Tensor = torch.ops.trillium.quant_linear(
        x, p.codes, p.scales, p.mins, p.bias, p.out_features, p.in_features, p.bits, p.activations
    )
    return out


def decode_forward(
    w: DecodeWeights,
    kv_caches: Sequence[KVCache],  # mutated: this step's K/V stored at slot_mapping
    input_ids: torch.Tensor,  # [T] int64
    positions: torch.Tensor,  # [T] int64
    slot_mapping: torch.Tensor,  # [T] int64, -1 for a padding row
    query_start_loc: torch.Tensor,  # [R+1] int32
    context_lens: torch.Tensor,  # [R] int32
    block_tables: torch.Tensor,  # [R, W] int32
    max_query_len: int = 1,
) -> torch.Tensor:  # [T, V] fp32 logits of every new token
    """``LlamaForCausalLM.forward`` then ``compute_logits`` of every row, on the custom operators.

    The same arithmetic in the same order as the eager model's fp32 CPU path (same kernels), so
    eager results match it exactly; compiled, inductor may reorder the few torch ops between
    kernels. Mutates ``kv_caches`` only. Plain Python on tensors: callable eagerly or compiled.
    """
    ops = torch.ops.trillium
    num_tokens = input_ids.shape[0]
    hq, hkv, d = w.num_heads, w.num_kv_heads, w.head_dim
    hidden = F.embedding(input_ids, w.embed)  # [T, H]
    residual = hidden  # the residual stream: add_rms_norm adds each block's output into it in place
    for i, (layer, (k_cache, v_cache)) in enumerate(zip(w.layers, kv_caches, strict=True)):
        if i == 0:
            x = ops.rms_norm(hidden, layer.input_norm, w.eps)
        else:
            x = ops.add_rms_norm(hidden, residual, layer.input_norm, w.eps)
        heads = project(x, layer.qkv).view(num_tokens, hq + 2 * hkv, d)
        ops.rotary_inplace(heads[:, : hq + hkv], w.rope_cos, w.rope_sin, positions)  # Q and K heads are adjacent
        q, k, v = heads.split([hq, hkv, hkv], dim=1)  # type: ignore[no-untyped-call]
        ops.store_kv(k, v, k_cache, v_cache, slot_mapping)
        attn = ops.paged_attention(
            q, k_cache, v_cache, query_start_loc, context_lens, block_tables, max_query_len, w.scale
        )  # [T, Hq, D]
        x = ops.add_rms_norm(project(attn.view(num_tokens, hq * d), layer.o), residual, layer.post_norm, w.eps)
        hidden = project(ops.silu_and_mul(project(x, layer.gate_up)), layer.down)
    normed = ops.add_rms_norm(hidden, residual, w.final_norm, w.eps)
    logits: torch.Tensor = project(normed, w.head)
    return logits


class DecodeInputs(NamedTuple):
    """One padded decode step (shapes in the module docstring)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    query_start_loc: torch.Tensor
    context_lens: torch.Tensor
    block_tables: torch.Tensor
    num_requests: int  # R: rows 0..R-1 are real, the rest padding


class CompiledDecoder:
    """Decode steps through ``torch.compile(decode_forward)``, one graph per batch bucket.

    Holds ``model``'s weights and ``kv_caches`` (references: they must stay in place) and always
    passes exactly these to the graph. ``max_blocks_per_request`` is the fixed block-table width
    (the longest context / ``block_size``, rounded up). ``mode`` and ``options`` go to
    ``torch.compile``; ``compile=False`` runs :func:`decode_forward` eagerly instead (the custom
    operators without the compiler: for measurements and tests).

    Compilation happens on the first step of each bucket (tens of seconds cold; a few with
    inductor's on-disk cache warm), or up front with :meth:`warm_up`. Not thread-safe; run it on
    the thread that runs the model (the kernels' OpenMP team lives there).
    """

    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_caches: Sequence[KVCache],
        block_size: int,
        max_blocks_per_request: int,
        *,
        buckets: Sequence[int] = DEFAULT_BUCKETS,
        compile: bool = True,
        mode: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        self._buckets = StepBuckets(buckets)  # ValueError for an empty or non-positive list
        self.weights = DecodeWeights.of(model)
        self.kv_caches = list(kv_caches)
        self.block_size = block_size
        self.max_blocks_per_request = max_blocks_per_request
        self.buckets = self._buckets.batch_sizes
        self._fn: Callable[..., torch.Tensor] = decode_forward
        if compile:
            # A private copy of the function: dynamo caches compiled graphs on the code object, so
            # decoders with other buckets or options never see (or evaluate the guards of) ours.
            fn = types.FunctionType(
                decode_forward.__code__.replace(),
                decode_forward.__globals__,
                "decode_forward",
                decode_forward.__defaults__,
            )
            self._fn = torch.compile(fn, backend="inductor", dynamic=False, fullgraph=True, mode=mode, options=options)

    def bucket(self, num_requests: int) -> int:
        """The smallest bucket holding ``num_requests``; ValueError past the largest."""
        b = self._buckets.bucket(num_requests)
        if b is not None:
            return b
        raise ValueError(f"{num_requests} requests exceed the largest decode bucket {self.buckets[-1]}")

    @torch.inference_mode()
    def prepare(self, input_ids: list[int], positions: list[int], block_tables: list[list[int]]) -> DecodeInputs:
        """Padded inputs for R requests, request r's new token ``input_ids[r]`` at ``positions[r]``
        (its context is positions 0..positions[r]; ``block_tables[r]`` covers them). ValueError
        for mismatched lengths, a table too short or wider than ``max_blocks_per_request``."""
        num_requests = len(input_ids)
        if len(positions) != num_requests or len(block_tables) != num_requests:
            raise ValueError("input_ids, positions and block_tables need one entry per request")
        size, width, bs = self.bucket(num_requests), self.max_blocks_per_request, self.block_size
        slots = []
        used = max((len(t) for t in block_tables), default=0)  # pad in Python only to the batch's widest
        for pos, table in zip(positions, block_tables):
            if not len(table) * bs > pos >= 0 or len(table) > width:
                raise ValueError(f"block table of {len(table)} blocks (max {width}) cannot hold position {pos}")
            slots.append(table[pos // bs] * bs + pos % bs)
        tables = torch.zeros(size, width, dtype=torch.int32)
        if used:
            tables[:num_requests, :used] = torch.tensor([list(t) + [0] * (used - len(t)) for t in block_tables])
        pad = size - num_requests
        return DecodeInputs(
            input_ids=torch.tensor([*input_ids, *[0] * pad], dtype=torch.int64),
            positions=torch.tensor([*positions, *[0] * pad], dtype=torch.int64),
            slot_mapping=torch.tensor(slots + [-1] * pad, dtype=torch.int64),
            query_start_loc=torch.arange(size + 1, dtype=torch.int32),
            context_lens=torch.tensor([p + 1 for p in positions] + [1] * pad, dtype=torch.int32),
            block_tables=tables,
            num_requests=num_requests,
        )

    @torch.inference_mode()
    def run(self, inputs: DecodeInputs) -> torch.Tensor:  # [R, V] fp32
        """One decode step on inputs from :meth:`prepare`: stores the real rows' K/V into the
        caches, returns their logits. Inputs made otherwise (other dtypes or widths, tensors made
        outside inference mode) compile another graph.

        Dynamo evaluates its guards on all ~500 weight and cache tensors every call; skipping them
        (``torch.compiler.set_stance(skip_guard_eval_unsafe=True)``) made no measurable difference
        (within 0.5 ms of an 18 ms step), so the safe default stays."""
        logits = self._fn(self.weights, self.kv_caches, *inputs[:-1])
        return logits[: inputs.num_requests]

    def step(self, input_ids: list[int], positions: list[int], block_tables: list[list[int]]) -> torch.Tensor:
        """:meth:`prepare` then :meth:`run`."""
        return self.run(self.prepare(input_ids, positions, block_tables))

    def warm_up(self, buckets: Sequence[int] | None = None) -> dict[int, float]:
        """Compile (or load from inductor's cache) the graph of each bucket by running an all-padding
        step, which writes no KV. Returns seconds per bucket."""
        seconds: dict[int, float] = {}
        for size in buckets or self.buckets:
            inputs = _all_padding(size, self.max_blocks_per_request)
            start = time.perf_counter()
            self.run(inputs)
            seconds[size] = time.perf_counter() - start
        return seconds


@torch.inference_mode()
def _all_padding(size: int, width: int) -> DecodeInputs:
    zeros = torch.zeros(size, dtype=torch.int64)
    return DecodeInputs(
        input_ids=zeros,
        positions=zeros.clone(),
        slot_mapping=torch.full((size,), -1, dtype=torch.int64),
        query_start_loc=torch.arange(size + 1, dtype=torch.int32),
        context_lens=torch.ones(size, dtype=torch.int32),
        block_tables=torch.zeros(size, width, dtype=torch.int32),
        num_requests=0,
    )
