"""How ``--dtype`` and ``--weights`` resolve for the default model on this machine."""

from __future__ import annotations

import pytest
import torch

from trillium.config import EngineConfig
from trillium.launch import resolve_weights
from trillium.models import default_model_path
from trillium.models.registry import can_run_quantized
from trillium.ops.cpu_isa import kernel_isa

# What --weights auto keeps a quantized file as under --precision auto: int16 activations wherever
# a SIMD kernel runs them, exact fp32 on the portable loops.
AUTO_QUANTIZED = "quantized" if kernel_isa() == "portable" else "quantized-int16"


@pytest.fixture(scope="module")
def path() -> str:
    return default_model_path()


def test_auto_dtype_serves_quantized_weights_in_fp32(path):
    config = EngineConfig()
    assert config.dtype_auto
    resolved = resolve_weights(config, path)
    if can_run_quantized(path, torch.float32)[0]:
        # Even where bf16 is native: the quantized fp32 path decodes faster than dense bf16.
        assert resolved.weights == AUTO_QUANTIZED and resolved.dtype == "fp32"
        # --precision exact keeps the activations fp32 (Hugging Face parity).
        assert resolve_weights(EngineConfig(precision="exact"), path).weights == "quantized"
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


def test_k_quant_files_are_served_quantized_but_not_with_activations(tmp_path):
    """A Q4_K_M-style file (K-quants, Q5_0, Q8_0, ...): --weights auto keeps it quantized; int8
    activations take 4- and 8-bit codes with per-block scales only, and saying so names the flag."""
    from tests.tiny_gguf import build

    path = str(tmp_path / "tiny-qwen3.gguf")
    build("qwen3", tmp_path / "tiny-qwen3.gguf")
    if not can_run_quantized(path, torch.float32)[0]:
        pytest.skip("no SIMD quantized kernel on this CPU")
    assert resolve_weights(EngineConfig(), path).weights == AUTO_QUANTIZED
    with pytest.raises(ValueError, match="--weights quantized-int8: int8 activations take"):
        resolve_weights(EngineConfig(dtype="fp32", weights="quantized-int8"), path)


# ------------------------------------------------------------------------------------ --device
def test_auto_device_is_cuda_only_where_torch_sees_a_gpu(monkeypatch):
    monkeypatch.delenv("TRILLIUM_DEVICE", raising=False)
    config = EngineConfig(device="auto")
    assert config.device == ("cuda" if torch.cuda.is_available() else "cpu")
    assert EngineConfig().device == "cpu"  # the default, without TRILLIUM_DEVICE


def test_device_comes_from_the_environment_when_not_given(monkeypatch):
    monkeypatch.setenv("TRILLIUM_DEVICE", "cpu")
    assert EngineConfig().device == "cpu"
    monkeypatch.setenv("TRILLIUM_DEVICE", "npu")
    with pytest.raises(ValueError, match="device must be one of cpu, cuda, auto"):
        EngineConfig()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without a GPU")
def test_cuda_without_a_gpu_is_a_clear_error(capsys):
    with pytest.raises(ValueError, match="torch sees no CUDA GPU"):
        EngineConfig(device="cuda")
    from trillium.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["serve", "--device", "cuda"])
    assert exc.value.code == 2
    assert "device cuda" in capsys.readouterr().err


def test_on_a_gpu_weights_are_dense_bf16_by_default(path, monkeypatch):
    """GGUF blocks are dequantized at load on a GPU (the quantized kernels are CPU-only); asking
    for quantized weights there names the flag. (Resolving needs no GPU: torch is told it has one.)"""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    config = EngineConfig(device="cuda")
    assert config.dtype == "bf16"
    resolved = resolve_weights(config, path)
    assert resolved.weights == "dense" and resolved.dtype == "bf16"
    with pytest.raises(ValueError, match="--weights quantized: quantized kernels take fp32 CPU activations"):
        resolve_weights(EngineConfig(device="cuda", dtype="fp32", weights="quantized"), path)


def test_the_kv_cache_dtype_follows_the_compute_dtype_unless_given_and_exact_pins_fp32(path):
    auto = EngineConfig()
    assert (auto.precision, auto.kv_cache_dtype) == ("auto", "auto")
    assert resolve_weights(auto, path).kv_dtype == resolve_weights(auto, path).dtype
    exact = EngineConfig(precision="exact")
    assert (exact.dtype, exact.kv_dtype) == ("fp32", "fp32") and not exact.dtype_auto
    assert resolve_weights(exact, path).dtype == "fp32"
    # Explicit flags override auto, and may not contradict exact (the message names the flag).
    bf16 = EngineConfig(dtype="fp32", kv_cache_dtype="bf16")
    assert (bf16.kv_dtype, bf16.torch_kv_dtype) == ("bf16", torch.bfloat16)
    for bad in (
        {"dtype": "bf16"},
        {"weights": "quantized-int8"},
        {"weights": "quantized-int16"},
        {"kv_cache_dtype": "bf16"},
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            EngineConfig(precision="exact", **bad)
    with pytest.raises(ValueError, match="precision"):
        EngineConfig(precision="fast")


def test_an_explicit_quantized_format_implies_fp32_activations(path, monkeypatch):
    """On a CPU whose auto dtype is bf16, ``--weights quantized`` alone still runs (fp32 activations)."""
    monkeypatch.setattr("trillium.config.cpu_has_native_bf16", lambda: True)
    config = EngineConfig(weights="quantized")
    assert config.dtype == "bf16" and config.dtype_auto
    if can_run_quantized(path, torch.float32)[0]:
        resolved = resolve_weights(config, path)
        assert (resolved.weights, resolved.dtype) == ("quantized", "fp32")
