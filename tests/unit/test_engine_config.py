"""How ``--dtype`` and ``--weights`` resolve for the default model on this machine."""

from __future__ import annotations

import pytest
import torch

from trillium.config import EngineConfig
from trillium.engine_client import _use_quantized_weights
from trillium.models import default_model_path
from trillium.models.registry import can_run_quantized


@pytest.fixture(scope="module")
def path() -> str:
    return default_model_path()


def test_auto_dtype_serves_quantized_weights_in_fp32(path):
    config = EngineConfig()
    assert config.dtype_auto
    quantized = _use_quantized_weights(config, path)
    if can_run_quantized(path, torch.float32)[0]:
        # Even where bf16 is native: the quantized fp32 path decodes faster than dense bf16.
        assert quantized and config.dtype == "fp32"
    else:
        assert not quantized


def test_explicit_dtype_is_kept(path):
    config = EngineConfig(dtype="bf16")
    assert not config.dtype_auto
    assert not _use_quantized_weights(config, path)  # the kernels take fp32 activations only
    assert config.dtype == "bf16"


def test_dense_weights_keep_the_auto_dtype(path):
    config = EngineConfig(weights="dense")
    resolved = config.dtype
    assert not _use_quantized_weights(config, path)
    assert config.dtype == resolved
