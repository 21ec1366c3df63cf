"""Tiny random-weight models of each supported architecture, as a Hugging Face transformers model and
the same weights in a GGUF file written with the ``gguf`` package, quantized in the types real files
use (K-quants, Q5_0, Q8_0, ... mixed within a layer as Q4_K_M files mix them).

The GGUF's quantized tensors are fresh random blocks; the transformers model gets exactly what the
``gguf`` package dequantizes them to, so transformers running its own modeling code is the oracle
for the file: our loader, dense or quantized, must compute what it computes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGUFWriter
from gguf.constants import GGML_QUANT_SIZES, RopeScalingType
from gguf.constants import GGMLQuantizationType as QT
from gguf.quants import dequantize

# Hidden and intermediate sizes are multiples of 256: a K-quant block is 256 weights along a row.
SIZES = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 512,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
}

# GGUF type of each projection kind, layer by layer (v and down alternate like Q4_K_M's).
TYPES: list[dict[str, QT]] = [
    {"attn_q": QT.Q4_K, "attn_k": QT.Q4_K, "attn_v": QT.Q6_K, "attn_output": QT.Q5_0,
     "ffn_gate": QT.Q5_K, "ffn_up": QT.Q5_K, "ffn_down": QT.Q6_K},
    {"attn_q": QT.Q5_0, "attn_k": QT.Q5_0, "attn_v": QT.Q8_0, "attn_output": QT.Q4_K,
     "ffn_gate": QT.Q4_0, "ffn_up": QT.Q4_1, "ffn_down": QT.Q5_1},
]  # fmt: skip
HEAD_TYPE = QT.Q6_K
EMBED_TYPE = QT.Q8_0

_HF_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}

# Block byte offsets of the fp16 scales (kept finite and small; every other bit is random).
_F16_AT = {QT.Q4_0: (0,), QT.Q4_1: (0, 2), QT.Q5_0: (0,), QT.Q5_1: (0, 2), QT.Q8_0: (0,), QT.Q4_K: (0, 2),
           QT.Q5_K: (0, 2), QT.Q6_K: (208,)}  # fmt: skip


def random_blocks(qtype: QT, n: int, k: int, rng: np.random.Generator, scale: float) -> np.ndarray:
    """Raw bytes of an [n, k] tensor of ``qtype``; the dequantized weights are of order ``scale``."""
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (n * k // block, size), dtype=np.uint8)
    # K-quants multiply d by a 6-bit (8-bit for Q6_K) sub-scale and codes up to 63: keep d small.
    codes_max = {QT.Q4_K: 15 * 63, QT.Q5_K: 31 * 63, QT.Q6_K: 32 * 127, QT.Q8_0: 127}.get(qtype, 16)
    for at in _F16_AT[qtype]:
        d = (rng.uniform(0.5, 1.0, raw.shape[0]) * scale / codes_max * rng.choice([-1, 1], raw.shape[0])).astype(
            np.float16
        )
        raw[:, at : at + 2] = d.view(np.uint8).reshape(-1, 2)
    return raw


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's Q/K row permutation for the llama architecture."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def build(kind: str, path: Path, seed: int = 0) -> Any:
    """Write ``path`` (a GGUF of architecture ``kind``: llama, llama3 (rope-scaled, tied), mistral,
    mistral_swa (an 8-token sliding window), qwen2, qwen2_yarn (YaRN rope scaling), qwen3, gemma2 and gemma3 (a sliding and a global layer; Gemma 2 soft-capped))
    and return the transformers model
    holding exactly its weights."""
    import transformers as tf

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    sizes = dict(SIZES)
    tied = kind in ("llama3", "qwen2", "qwen3", "gemma2", "gemma3")
    if kind in ("llama", "llama3"):
        rope = None
        if kind == "llama3":
            rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64, "rope_theta": 500000.0}  # fmt: skip
        hf = tf.LlamaForCausalLM(tf.LlamaConfig(**sizes, rope_parameters=rope, tie_word_embeddings=tied))
        arch = "llama"
    elif kind in ("mistral", "mistral_swa"):
        window = 8 if kind == "mistral_swa" else None  # sequences of 56 tokens slide well past it
        hf = tf.MistralForCausalLM(tf.MistralConfig(**sizes, sliding_window=window, tie_word_embeddings=tied))
        arch = "llama"
    elif kind == "qwen2":
        hf = tf.Qwen2ForCausalLM(tf.Qwen2Config(**sizes, tie_word_embeddings=tied))
        arch = "qwen2"
    elif kind == "qwen2_yarn":  # YaRN: 4x a 32-token pretraining context, the attention factor defaulted
        sizes["max_position_embeddings"] = 128
        rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "rope_theta": 10000.0}
        hf = tf.Qwen2ForCausalLM(tf.Qwen2Config(**sizes, rope_parameters=rope, tie_word_embeddings=False))
        arch = "qwen2"
    elif kind == "qwen3":
        hf = tf.Qwen3ForCausalLM(tf.Qwen3Config(**sizes, tie_word_embeddings=tied))
        arch = "qwen3"
    elif kind == "gemma3":  # layer 0 slides over 8 positions, layer 1 is global
        config = tf.Gemma3TextConfig(
            **sizes,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"],
            query_pre_attn_scalar=64,  # what llama.cpp assumes (no GGUF key)
        )
        hf = tf.Gemma3ForCausalLM(config)
        arch = "gemma3"
    elif kind == "gemma2":  # layer 0 slides over 8 positions, layer 1 is global; caps small enough to bite
        config = tf.Gemma2Config(
            **sizes,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"],
            query_pre_attn_scalar=64,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=3.0,
        )
        config._attn_implementation = "eager"  # soft-capping is written out in eager attention
        hf = tf.Gemma2ForCausalLM(config)
        arch = "gemma2"
    else:
        raise ValueError(kind)
    hf = hf.float().eval()
    cfg = hf.config
    permuted = arch == "llama"
    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    rope_params = getattr(cfg, "rope_parameters", None) or {}
    rope_params = rope_params.get("full_attention", rope_params)  # Gemma: per layer type; the file has the global one
    writer.add_rope_freq_base(float(rope_params.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))))
    writer.add_vocab_size(cfg.vocab_size)
    if rope_params.get("rope_type") == "yarn":  # the keys convert_hf_to_gguf.py writes
        writer.add_rope_scaling_type(RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope_params["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope_params["original_max_position_embeddings"])
    if getattr(cfg, "sliding_window", None):
        writer.add_sliding_window(cfg.sliding_window)
    if arch == "gemma3":  # newer converters write one flag per layer (True: sliding)
        writer.add_array("gemma3.attention.sliding_window_pattern", [True, False])
    if arch == "gemma2":  # llama.cpp's keys; its default pattern for Gemma 2 is every other layer
        writer.add_float32("gemma2.attn_logit_softcapping", cfg.attn_logit_softcapping)
        writer.add_float32("gemma2.final_logit_softcapping", cfg.final_logit_softcapping)
    state = hf.state_dict()

    def put(name: str, hf_name: str, qtype: QT | None, permute_heads: int = 0) -> None:
        """Write tensor ``name``: random blocks of ``qtype`` (the HF weight set to what they
        dequantize to), or the HF tensor itself as F32 (norms, biases)."""
        target = state[hf_name]
        if qtype is None:
            data = target.detach().float().numpy()
            if hf_name.endswith("norm.weight"):  # ones (zeros for Gemma) at init: make them matter
                data = (float(not arch.startswith("gemma")) + 0.3 * rng.standard_normal(data.shape)).astype(np.float32)
            elif hf_name.endswith(".bias"):
                data = (0.5 * rng.standard_normal(data.shape)).astype(np.float32)
            file_data = _llama_cpp_permute(data, permute_heads) if permute_heads else data
            if arch.startswith("gemma") and hf_name.endswith("norm.weight"):
                file_data = file_data + 1.0  # Gemma computes x * (1 + w): llama.cpp stores 1 + w
            writer.add_tensor(name, np.ascontiguousarray(file_data))
            target.copy_(torch.from_numpy(data))
            return
        n, k = target.shape
        raw = random_blocks(qtype, n, k, rng, scale=2.0 / k**0.5)
        values = dequantize(raw, qtype).reshape(n, k).astype(np.float32)
        if permute_heads:  # the file holds llama.cpp's row order; HF holds the original
            values = _unpermute(values, permute_heads)
        rows = raw.reshape(n, -1)  # the byte shape of [n, k]: the writer derives the weights' shape
        writer.add_tensor(name, rows, raw_shape=rows.shape, raw_dtype=qtype)
        target.copy_(torch.from_numpy(values))

    put("token_embd.weight", "model.embed_tokens.weight", EMBED_TYPE if not tied else HEAD_TYPE)
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        put(f"blk.{i}.attn_norm.weight", p + "input_layernorm.weight", None)
        if arch.startswith("gemma"):
            put(f"blk.{i}.post_attention_norm.weight", p + "post_attention_layernorm.weight", None)
            put(f"blk.{i}.ffn_norm.weight", p + "pre_feedforward_layernorm.weight", None)
            put(f"blk.{i}.post_ffw_norm.weight", p + "post_feedforward_layernorm.weight", None)
        else:
            put(f"blk.{i}.ffn_norm.weight", p + "post_attention_layernorm.weight", None)
        for kind_name, hf_name in _HF_NAMES.items():
            heads = 0
            if permuted and kind_name == "attn_q":
                heads = cfg.num_attention_heads
            elif permuted and kind_name == "attn_k":
                heads = cfg.num_key_value_heads
            put(f"blk.{i}.{kind_name}.weight", p + hf_name + ".weight", TYPES[i][kind_name], heads)
        if arch == "qwen2":
            for kind_name in ("attn_q", "attn_k", "attn_v"):
                put(f"blk.{i}.{kind_name}.bias", p + _HF_NAMES[kind_name] + ".bias", None)
        if arch in ("qwen3", "gemma3"):
            put(f"blk.{i}.attn_q_norm.weight", p + "self_attn.q_norm.weight", None)
            put(f"blk.{i}.attn_k_norm.weight", p + "self_attn.k_norm.weight", None)
    put("output_norm.weight", "model.norm.weight", None)
    if not tied:
        put("output.weight", "lm_head.weight", HEAD_TYPE)
    if kind == "llama3":  # Llama 3.1 files carry the rope scaling as per-frequency divisors
        inv = hf.model.rotary_emb.inv_freq.float()
        base = 1.0 / (float(rope_params["rope_theta"]) ** (torch.arange(0, cfg.head_dim, 2).float() / cfg.head_dim))
        writer.add_tensor("rope_freqs.weight", (base / inv).numpy().astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    hf.tie_weights()
    return hf
