"""How ``--dtype`` and ``--weights`` resolve for the default model on this machine."""

from __future__ import annotations

import pytest
import torch

from trillium.config import EngineConfig
from trillium.launch import resolve_weights
from trillium.models import default_model_path
from trillium.models.registry import can_run_quantized


@pytest.fixture(scope="module")
def path() -> str:
    return default_model_path()


def test_auto_dtype_serves_quantized_weights_in_fp32(path):
    config = EngineConfig()
    assert config.dtype_auto
    resolved = resolve_weights(config, path)
    if can_run_quantized(path, torch.float32)[0]:
        # Even where bf16 is native: the quantized fp32 path decodes faster than dense bf16.
        assert resolved.weights == "quantized" and resolved.dtype == "fp32"
    else:
        assert resolved.weights == "dense"


def test_resolving_leaves_the_given_config_alone(path):
    config = EngineConfig()
    before = (config.dtype, config.weights, config.dtype_auto)
    resolve_weights(config, path)
    assert (config.dtype, config.weights, config.dtype_auto) == before


def test_explicit_dtype_is_kept(path):
    config = EngineConfig(dtype="bf16")
    assert not config.dtype_auto
    resolved = resolve_weights(config, path)
    assert resolved.weights == "dense"  # the kernels take fp32 activations only
    assert resolved.dtype == "bf16"


def test_dense_weights_keep_the_auto_dtype(path):
    config = EngineConfig(weights="dense")
    resolved = resolve_weights(config, path)
    assert resolved.weights == "dense" and resolved.dtype == config.dtype


def test_asking_for_quantized_weights_where_they_cannot_run_names_the_flag(path):
    with pytest.raises(ValueError, match="--weights quantized"):
        resolve_weights(EngineConfig(dtype="bf16", weights="quantized"), path)


def test_k_quant_files_are_served_quantized_but_not_with_int8_activations(tmp_path):
    """A Q4_K_M-style file (K-quants, Q5_0, Q8_0, ...): --weights auto keeps it quantized; int8
    activations take 4- and 8-bit codes with per-block scales only, and saying so names the flag."""
    from tests.tiny_gguf import build

    path = str(tmp_path / "tiny-qwen3.gguf")
    build("qwen3", tmp_path / "tiny-qwen3.gguf")
    if not can_run_quantized(path, torch.float32)[0]:
        pytest.skip("no SIMD quantized kernel on this CPU")
    assert resolve_weights(EngineConfig(), path).weights == "quantized"
    with pytest.raises(ValueError, match="--weights quantized-int8: int8 activations take"):
        resolve_weights(EngineConfig(dtype="fp32", weights="quantized-int8"), path)
