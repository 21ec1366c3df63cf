"""ModelConfig: the hyperparameters a loader reads from a model file and the model is built from."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# Architectures the Llama-family module implements; loaders map file-specific names onto these.
SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma2", "gemma3")

# File-name suffixes that name a quantization or dtype, not the model (llama.cpp conventions).
_QUANT_SUFFIX = re.compile(
    r"[.\-_](?:I?Q\d[\w]*|F16|F32|BF16|FP16|FP32|MXFP4\w*|TQ\d\w*)$",
    re.IGNORECASE,
)


@dataclass
class ModelConfig:
    """Hyperparameters of a decoder-only Llama-family model.

    ``architecture`` is one of :data:`SUPPORTED_ARCHITECTURES`; ``name`` is the id the server
    reports for the model (e.g. ``"SmolLM2-135M-Instruct"``).
    """

    architecture: str
    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 4096  # the context length
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projections carry a bias (Qwen2)
    qk_norm: bool = False  # an RMSNorm over each q and k head before RoPE (Qwen3)
    # Sliding-window attention (Mistral): a token sees the last `sliding_window` positions in the
    # layers listed in `sliding_layers` (None: every layer); 0: full attention everywhere.
    sliding_window: int = 0
    sliding_layers: tuple[int, ...] | None = None
    # Gemma: the softmax scale (None: head_dim ** -0.5), the sliding layers' own RoPE base (Gemma 3),
    # and soft-capping of attention scores and of the final logits (Gemma 2; 0: none).
    attn_scale: float | None = None
    rope_local_theta: float | None = None
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    # Rope scaling as in HF config.json ({"rope_type": "llama3", "factor": ...}), or None. "linear",
    # "llama3" and "yarn" are implemented; anything else is rejected by validate(). The loaders
    # complete a "yarn" entry (factor, original_max_position_embeddings) as transformers does.
    rope_scaling: dict[str, Any] | None = field(default=None)

    def window_of(self, layer: int) -> int:
        """The sliding window of ``layer`` (0: full attention)."""
        if self.sliding_window <= 0 or (self.sliding_layers is not None and layer not in self.sliding_layers):
            return 0
        return self.sliding_window

    def validate(self) -> None:
        """Raise ValueError naming the first unsupported or inconsistent field."""
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {self.architecture!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for rotary embeddings")
        if self.rope_scaling is not None:
            kind = self.rope_scaling.get("rope_type", self.rope_scaling.get("type"))
            if kind not in ("linear", "llama3", "yarn", "default"):
                raise ValueError(f"unsupported rope_scaling type {kind!r}")
            for key in ("factor", "original_max_position_embeddings") if kind == "yarn" else ():
                value = self.rope_scaling.get(key)
                if not isinstance(value, int | float) or value <= 0:
                    raise ValueError(f"rope_scaling yarn needs a positive {key}, got {value!r}")


def served_name(file_name: str) -> str:
    """The model id for a weights file or directory name: ``SmolLM2-135M-Instruct.Q4_1.gguf`` ->
    ``SmolLM2-135M-Instruct`` (extension and quantization suffix dropped)."""
    stem = re.sub(r"\.gguf$", "", file_name.rstrip("/").rsplit("/", 1)[-1], flags=re.IGNORECASE)
    return _QUANT_SUFFIX.sub("", stem) or stem
