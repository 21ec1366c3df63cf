"""Load a Hugging Face model directory (``config.json`` + ``*.safetensors``) into :class:`LlamaForCausalLM`.

HF checkpoints already use rotate-half RoPE layout, so tensors go in unchanged (only fused).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import torch

from trillium.models.config import ModelConfig, served_name
from trillium.models.families import causal_lm_class
from trillium.models.llama import LlamaForCausalLM

# HF `architectures[0]` -> our architecture
_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
}
_MODEL_TYPES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
}


def read_config(path: str) -> ModelConfig:
    """ModelConfig from ``<path>/config.json``; ValueError naming an unsupported architecture."""
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    hf_arch = (cfg.get("architectures") or [None])[0]
    if hf_arch is None:  # some exporters leave `architectures` empty; model_type still says it
        hf_arch = _MODEL_TYPES.get(cfg.get("model_type"), cfg.get("model_type"))
    if hf_arch not in _ARCHITECTURES:
        raise ValueError(f"unsupported architecture {hf_arch!r}; supported: {', '.join(_ARCHITECTURES)}")
    arch = _ARCHITECTURES[hf_arch]
    num_heads = cfg["num_attention_heads"]
    rope_params = cfg.get("rope_parameters") or {}  # transformers >= 5 moves rope settings here
    rope_scaling = cfg.get("rope_scaling") or rope_params or None
    if rope_scaling and rope_scaling.get("rope_type", rope_scaling.get("type")) in (None, "default"):
        rope_scaling = None
    max_positions = cfg.get("max_position_embeddings", 4096)
    rope_scaling = _complete_scaling(rope_scaling, cfg, max_positions)
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", hf_arch == "MistralForCausalLM") else None
    sliding_layers = None
    if window and cfg.get("layer_types"):  # transformers >= 5 lists each layer's attention
        sliding_layers = tuple(i for i, t in enumerate(cfg["layer_types"]) if t == "sliding_attention")
    elif window and arch in ("qwen2", "qwen3"):  # Qwen2/3 slide from layer max_window_layers on
        sliding_layers = tuple(range(int(cfg.get("max_window_layers", 0)), cfg["num_hidden_layers"]))
    config = ModelConfig(
        architecture=arch,
        name=served_name(os.path.abspath(path)),
        num_layers=cfg["num_hidden_layers"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_heads=num_heads,
        num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // num_heads,
        vocab_size=cfg["vocab_size"],
        rope_theta=float(cfg.get("rope_theta", rope_params.get("rope_theta", 10000.0))),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=max_positions,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        # Qwen2 always has q/k/v bias; Llama exposes it as `attention_bias`.
        attention_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
        qk_norm=arch == "qwen3",
        sliding_window=int(window or 0) if window and window < max_positions else 0,
        sliding_layers=sliding_layers,
        rope_scaling=rope_scaling,
    )
    return dataclasses.replace(config, **_gemma_fields(cfg, arch)) if arch.startswith("gemma") else config


def _complete_scaling(scaling: dict[str, Any] | None, cfg: dict[str, Any], max_positions: int) -> dict[str, Any] | None:
    """``scaling`` (a copy) with what transformers fills in for "llama3" and "yarn": the pretraining
    length from a top-level ``original_max_position_embeddings`` (Phi-3 style, which wins) or else
    ``max_position_embeddings``, and a YaRN ``factor`` left null from the two lengths' ratio."""
    if not scaling or scaling.get("rope_type", scaling.get("type")) not in ("llama3", "yarn"):
        return scaling
    scaling = dict(scaling)
    if cfg.get("original_max_position_embeddings") is not None:
        scaling["original_max_position_embeddings"] = cfg["original_max_position_embeddings"]
    scaling.setdefault("original_max_position_embeddings", max_positions)
    if scaling.get("factor") is None and scaling.get("original_max_position_embeddings"):
        scaling["factor"] = max_positions / scaling["original_max_position_embeddings"]
    return scaling


def _gemma_fields(cfg: dict[str, Any], arch: str) -> dict[str, Any]:
    """Gemma 2 / 3 settings (ValueError for what the model does not implement): the softmax scale,
    sliding layers (every `sliding_window_pattern`-th global), Gemma 3's q/k norms and local RoPE
    base, Gemma 2's soft-capping."""
    if cfg.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise ValueError(f"{arch}: hidden_activation {cfg.get('hidden_activation')!r} is not supported")
    layers = cfg["num_hidden_layers"]
    pattern = int(cfg.get("sliding_window_pattern", 6 if arch == "gemma3" else 2))
    types = cfg.get("layer_types") or [
        "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)
    ]
    params = cfg.get("rope_parameters") or {}
    base = params.get("rope_theta", cfg.get("rope_theta", 1_000_000.0 if arch == "gemma3" else 10000.0))
    full = params.get("full_attention") or {"rope_theta": base, **(cfg.get("rope_scaling") or {})}
    local = params.get("sliding_attention") or {"rope_theta": cfg.get("rope_local_base_freq", full["rope_theta"])}
    scaling = full if full.get("rope_type", full.get("type")) not in (None, "default") else None
    scaling = _complete_scaling(scaling, cfg, cfg.get("max_position_embeddings", 4096))
    return {
        "qk_norm": arch == "gemma3",
        "attn_scale": float(cfg.get("query_pre_attn_scalar", cfg.get("head_dim", 256))) ** -0.5,
        "sliding_window": int(cfg.get("sliding_window") or 0),
        "sliding_layers": tuple(i for i, t in enumerate(types) if t == "sliding_attention"),
        "rope_theta": float(full["rope_theta"]),
        "rope_local_theta": float(local["rope_theta"]),
        "rope_scaling": scaling,
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", True)),
        "attn_softcap": float(cfg.get("attn_logit_softcapping") or 0.0),
        "final_softcap": float(cfg.get("final_logit_softcapping") or 0.0),
    }


def _shards(path: str) -> list[str]:
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index, encoding="utf-8") as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors weights in {path}")
    return [os.path.join(path, f) for f in files]


def iter_weights(path: str, dtype: torch.dtype, progress: bool, desc: str) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor in ``dtype``) for every tensor of every shard, read one at a time."""
    from safetensors import safe_open
    from tqdm import tqdm

    shards = _shards(path)
    handles = [safe_open(f, framework="pt") for f in shards]
    keys = [(h, k) for h in handles for k in h.keys()]  # type: ignore[no-untyped-call]  # noqa: SIM118  # safe_open is not iterable; untyped
    for handle, key in tqdm(keys, desc=desc, unit="tensor", file=sys.stderr, disable=not progress):
        yield key, handle.get_tensor(key).to(dtype)


def load_hf_model(
    path: str, dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cpu", progress: bool = True
) -> tuple[LlamaForCausalLM, ModelConfig]:
    """Build the model in a HF directory and load its safetensors weights."""
    config = read_config(path)
    model = causal_lm_class(config).empty(config, dtype, device)
    weights = iter_weights(path, dtype, progress, f"Loading {config.name}")
    if config.architecture.startswith("gemma"):
        # Gemma's norms compute x_normed * (1 + w); the model takes 1 + w (as GGUF files store it),
        # added in fp32 before the weights' dtype rounds it, as Gemma does.
        weights = (
            (n, t) if not n.endswith("norm.weight") else (n, (t.float() + 1).to(dtype))
            for n, t in iter_weights(path, torch.float32, progress, f"Loading {config.name}")
        )
    model.load_weights((n, t.to(device)) for n, t in weights)
    return model.eval(), config
