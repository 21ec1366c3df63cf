"""Load a GGUF file (llama.cpp format) into :class:`LlamaForCausalLM`.

Tensors are dequantized one at a time (``gguf.quants.dequantize`` -> fp32 numpy) and converted
to the target dtype at once, so peak memory is the model plus one fp32 tensor.

llama.cpp's converter permutes the rows of Q and K for the Llama architecture (its RoPE rotates
interleaved pairs, HF's rotates halves); we undo that here so the model runs rotate-half RoPE on
HF-layout weights. Qwen2 files are written with NeoX RoPE and are not permuted.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from gguf.constants import GGMLQuantizationType as QT

from trillium.models.config import ModelConfig, served_name
from trillium.models.families import causal_lm_class
from trillium.models.gguf_file import GGUFFile, GGUFTensor
from trillium.models.layers import rope_inv_freq
from trillium.models.llama import LlamaForCausalLM
from trillium.ops.quant_linear import Activations

# GGUF architecture -> (our architecture, whether Q/K rows are permuted in the file)
_ARCHITECTURES = {
    "llama": ("llama", True),
    "qwen2": ("qwen2", False),
    "qwen3": ("qwen3", False),
    "gemma2": ("gemma2", False),
    "gemma3": ("gemma3", False),
}
# Gemma names its four norms per layer differently (llama.cpp's ffn_norm is Gemma's pre-FFN norm).
_GEMMA_LAYER_NAMES = {
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
# Every n-th layer global, as llama.cpp reads Gemma files that do not say.
GEMMA_SLIDING_PATTERN = {"gemma2": 2, "gemma3": 6}

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def read_config(gguf: GGUFFile) -> ModelConfig:
    """ModelConfig from ``general.architecture`` and the ``{arch}.*`` metadata keys.

    Raises ValueError naming an architecture this package does not implement.
    """
    md = gguf.metadata
    arch = md.get("general.architecture")
    if arch not in _ARCHITECTURES:
        raise ValueError(f"unsupported GGUF architecture {arch!r}; supported: {', '.join(_ARCHITECTURES)}")

    def get(key: str, default: Any = None) -> Any:
        value = md.get(f"{arch}.{key}", default)
        if value is None:
            raise ValueError(f"{gguf.path}: metadata key {arch}.{key} is missing")
        return value

    names = {t.name for t in gguf.tensors}
    num_heads = int(get("attention.head_count"))
    num_kv_heads = get("attention.head_count_kv", num_heads)
    if isinstance(num_kv_heads, list):  # per-layer counts: only uniform ones are supported
        if len(set(num_kv_heads)) != 1:
            raise ValueError(f"{gguf.path}: per-layer KV head counts {set(num_kv_heads)} are not supported")
        num_kv_heads = num_kv_heads[0]
    hidden = int(get("embedding_length"))
    layers = int(get("block_count"))
    vocab = md.get(f"{arch}.vocab_size") or len(md.get("tokenizer.ggml.tokens", ()))
    sliding_window = int(md.get(f"{arch}.attention.sliding_window") or 0)
    sliding_layers = None
    if arch in GEMMA_SLIDING_PATTERN and sliding_window:
        pattern = md.get(f"{arch}.attention.sliding_window_pattern") or GEMMA_SLIDING_PATTERN[arch]
        if isinstance(pattern, list):  # newer converters write one flag per layer
            sliding_layers = tuple(i for i, sliding in enumerate(pattern) if sliding)
        else:
            sliding_layers = tuple(i for i in range(layers) if (i + 1) % int(pattern))
    rope_scaling = None
    scaling_type = md.get(f"{arch}.rope.scaling.type")
    if scaling_type == "yarn":
        rope_scaling = _yarn_scaling(gguf, arch)
    elif scaling_type not in (None, "none"):
        if scaling_type != "linear":
            raise ValueError(f"{gguf.path}: unsupported rope scaling {scaling_type!r}")
        rope_scaling = {"rope_type": "linear", "factor": float(get("rope.scaling.factor"))}
    return ModelConfig(
        architecture=_ARCHITECTURES[arch][0],
        name=served_name(os.path.basename(gguf.path)),
        num_layers=layers,
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_heads=num_heads,
        num_kv_heads=int(num_kv_heads),
        head_dim=int(md.get(f"{arch}.attention.key_length", hidden // num_heads)),
        vocab_size=int(vocab),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        max_position_embeddings=int(get("context_length")),
        tie_word_embeddings="output.weight" not in names,
        attention_bias="blk.0.attn_q.bias" in names,
        qk_norm="blk.0.attn_q_norm.weight" in names,
        sliding_window=sliding_window,
        sliding_layers=sliding_layers,
        rope_local_theta=10000.0 if arch == "gemma3" else None,
        attn_scale=_gemma_attn_scale(arch, layers, hidden, num_heads),
        attn_softcap=float(md.get(f"{arch}.attn_logit_softcapping") or 0.0),
        final_softcap=float(md.get(f"{arch}.final_logit_softcapping") or 0.0),
        rope_scaling=rope_scaling,
    )


def _yarn_scaling(gguf: GGUFFile, arch: str) -> dict[str, Any]:
    """HF's "yarn" rope_scaling from the keys convert_hf_to_gguf.py writes for it: the factor, the
    pretraining context (``original_context_length``; absent, the file's context length, as
    transformers defaults it), and -- when the config had them -- beta_fast / beta_slow and the
    attention factor (``yarn_attn_factor``, or ``attn_factor`` as some converters write it).
    ValueError for an extrapolation factor other than 1, which HF's YaRN does not have."""
    md = gguf.metadata

    def key(name: str) -> Any:
        return md.get(f"{arch}.rope.scaling.{name}")

    factor = key("factor")
    if factor is None:
        raise ValueError(f"{gguf.path}: yarn rope scaling without {arch}.rope.scaling.factor")
    ext_factor = key("yarn_ext_factor")
    if ext_factor is not None and float(ext_factor) not in (-1.0, 1.0):  # -1: llama.cpp's "default"
        raise ValueError(f"{gguf.path}: yarn_ext_factor {ext_factor} is not supported (only 1)")
    original = key("original_context_length") or md.get(f"{arch}.context_length")
    scaling: dict[str, Any] = {
        "rope_type": "yarn",
        "factor": float(factor),
        "original_max_position_embeddings": int(original) if original else None,
    }
    for name, hf_key in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
        if key(name) is not None:
            scaling[hf_key] = float(key(name))
    attention_factor = key("yarn_attn_factor") if key("yarn_attn_factor") is not None else key("attn_factor")
    if attention_factor is not None:
        scaling["attention_factor"] = float(attention_factor)
    return scaling


def _gemma_attn_scale(arch: str, layers: int, hidden: int, heads: int) -> float | None:
    """Gemma's softmax scale where it is not head_dim ** -0.5. GGUF files do not store
    query_pre_attn_scalar; the 27B models (46 layers for Gemma 2, 62 for Gemma 3) use hidden / heads,
    the others head_dim, as llama.cpp reads them."""
    if (arch, layers) in (("gemma2", 46), ("gemma3", 62)):
        return float((hidden // heads) ** -0.5)
    return None


def unpermute_qk(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Invert convert_hf_to_gguf's ``permute``: rows within each head go from interleaved
    pairs (r0, r_half, r1, r_half+1, ...) back to HF's [first half | second half] order.

    Forward (llama.cpp): ``w.reshape(n_head, 2, rows // n_head // 2, *rest).swapaxes(1, 2)``.
    Works for weights [rows, in] and biases [rows].
    """
    rows, rest = w.shape[0], w.shape[1:]
    return w.reshape(num_heads, rows // num_heads // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)


def hf_name(gguf_name: str, arch: str = "llama") -> str | None:
    """HF parameter name for a GGUF tensor name of architecture ``arch``, or None for a tensor this
    mapping does not know."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    names = {**_LAYER_NAMES, **_GEMMA_LAYER_NAMES} if arch.startswith("gemma") else _LAYER_NAMES
    match = _LAYER_TENSOR.fullmatch(gguf_name)
    if match is None or match.group(2) not in names:
        return None
    layer, kind, leaf = match.groups()
    return f"model.layers.{layer}.{names[kind]}.{leaf}"


def iter_weights(
    gguf: GGUFFile, config: ModelConfig, dtype: torch.dtype, progress: bool, skip: frozenset[str] = frozenset()
) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor in ``dtype``) for every model tensor in the file, un-permuted, except the
    GGUF tensors named in ``skip`` (kept quantized: never dequantized)."""
    from gguf.quants import dequantize
    from tqdm import tqdm

    arch = gguf.metadata["general.architecture"]
    permuted = _ARCHITECTURES[arch][1]
    bar = tqdm(gguf.tensors, desc=f"Loading {config.name}", unit="tensor", file=sys.stderr, disable=not progress)
    for tensor in bar:
        if tensor.name in skip:
            continue
        name = hf_name(tensor.name, arch)
        if name is None:
            if tensor.name != "rope_freqs.weight":  # handled by load_gguf_model
                raise ValueError(f"{gguf.path}: unexpected tensor {tensor.name!r}")
            continue
        array = dequantize(gguf.raw(tensor), tensor.qtype).reshape(tensor.dims)  # fp32
        if permuted and ".q_proj." in name:
            array = unpermute_qk(array, config.num_heads)
        elif permuted and ".k_proj." in name:
            array = unpermute_qk(array, config.num_kv_heads)
        # Passthrough types (F32) come back as read-only views of the memory map: copy those.
        yield name, torch.from_numpy(np.require(array, requirements=["C", "W"])).to(dtype)


_PROJECTION_KINDS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def _kernel_tensors(gguf: GGUFFile) -> tuple[list[GGUFTensor], list[GGUFTensor]]:
    """(projection tensors, the output head) of a file: what the quantized path must take."""
    projections = [t for t in gguf.tensors if t.name.endswith(".weight") and t.name.split(".")[-2] in _PROJECTION_KINDS]
    by_name = {t.name: t for t in gguf.tensors}
    head = by_name.get("output.weight", by_name.get("token_embd.weight"))  # tied: the token table
    return projections, [] if head is None else [head]


def supports_quantized(path: str, activations: int = Activations.EXACT) -> bool:
    """Whether every projection and the head of the GGUF file is of a type the quantized kernel
    takes in the ``activations`` mode (``ops.quant_linear.Activations``; int8: Q4_0, Q4_1 or Q8_0,
    what its integer loops take)."""
    return _supports_quantized(GGUFFile(path), activations)


def _supports_quantized(gguf: GGUFFile, activations: int) -> bool:
    from trillium.models.gguf_quant import BITS

    projections, head = _kernel_tensors(gguf)
    tensors = projections + head
    if not projections or not all(t.qtype in BITS for t in tensors):
        return False
    return activations != Activations.INT8 or all(QT(t.qtype) in (QT.Q4_0, QT.Q4_1, QT.Q8_0) for t in tensors)


def _quantized_names(gguf: GGUFFile, embed_quantized: bool) -> frozenset[str]:
    """GGUF names of the tensors the quantized path keeps quantized (never dequantized)."""
    projections, head = _kernel_tensors(gguf)
    names = {t.name for t in projections + head}
    if embed_quantized:
        names.add("token_embd.weight")
    return frozenset(names)


def load_gguf_model(
    path: str,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
    progress: bool = True,
    quantized: bool = False,
    activations: int = Activations.EXACT,
) -> tuple[LlamaForCausalLM, ModelConfig]:
    """Build the model described by a GGUF file and load its (dequantized) weights.

    ``quantized``: keep the projections, the head and the token table in the file's block
    quantization (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K; ``models.gguf_quant``) and run
    them with the C++ block-quantized kernel (fp32 CPU only); their dense matrices are never
    built; ``activations`` is their ``ops.quant_linear.Activations`` mode. Raises ValueError if the file has other types, so callers decide with
    :func:`supports_quantized` first.
    """
    gguf = GGUFFile(path)
    config = read_config(gguf)
    model = causal_lm_class(config).empty(config, dtype, device)
    skip: frozenset[str] = frozenset()
    if quantized:
        from trillium.models.gguf_quant import read_quant_weights

        if dtype != torch.float32 or torch.device(device).type != "cpu":
            raise ValueError("quantized weights run on fp32 CPU activations only")
        if not _supports_quantized(gguf, activations):
            kinds = "Q4_0/Q4_1/Q8_0" if activations == Activations.INT8 else "of a quantized-kernel type"
            raise ValueError(f"{path}: some projections are not {kinds}; load it dense")
        permuted = _ARCHITECTURES[gguf.metadata["general.architecture"]][1]
        weights = read_quant_weights(gguf, config, permuted)
        if weights is None:
            raise ValueError(f"{path}: some projections are not of a quantized-kernel type; load it dense")
        # Swapped in before loading the rest: the dense projections are never materialized.
        model.use_quant_weights(weights, activations)
        skip = _quantized_names(gguf, "embed_tokens" in weights)
    model.load_weights((n, t.to(device)) for n, t in iter_weights(gguf, config, dtype, progress, skip))
    freqs = next((t for t in gguf.tensors if t.name == "rope_freqs.weight"), None)
    if freqs is not None:
        # Llama-3.1-style files carry per-frequency divisors instead of rope-scaling metadata.
        from gguf.constants import GGMLQuantizationType
        from gguf.quants import dequantize

        factors = torch.from_numpy(
            dequantize(gguf.raw(freqs), GGMLQuantizationType(freqs.qtype)).reshape(-1).copy()
        )  # [D/2]
        inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)
        model.rotary.build(inv_freq=inv_freq / factors, device=device)
    return model.eval(), config
