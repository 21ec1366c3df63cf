"""Torch modules for the supported architectures and their loaders (GGUF, HF safetensors)."""

from trillium.models.config import ModelConfig
from trillium.models.llama import LlamaForCausalLM
from trillium.models.registry import default_model_path, load_model

__all__ = ["LlamaForCausalLM", "ModelConfig", "default_model_path", "load_model"]
