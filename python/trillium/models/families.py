"""Which model class serves an architecture: Llama's decoder, or a family that differs from it."""

from __future__ import annotations

from trillium.models.config import ModelConfig
from trillium.models.llama import LlamaForCausalLM


def causal_lm_class(config: ModelConfig) -> type[LlamaForCausalLM]:
    """The class to build for ``config.architecture`` (validated by ``ModelConfig.validate``)."""
    if config.architecture in ("gemma2", "gemma3"):
        from trillium.models.gemma import GemmaForCausalLM

        return GemmaForCausalLM
    return LlamaForCausalLM
