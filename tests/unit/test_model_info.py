"""``trillium inspect``: a model file's facts and what serving it takes, without loading it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.unit.test_engine_config import AUTO_QUANTIZED
from trillium.cli import main
from trillium.model_info import describe
from trillium.models import default_model_path
from trillium.models.registry import can_run_quantized


def test_the_default_model():
    path = default_model_path()
    info = describe(path)
    assert info["supported"] and info["architecture"] == "llama"
    assert info["shape"]["layers"] == 30 and info["shape"]["kv_heads"] == 3 and info["shape"]["vocab_size"] == 49152
    assert 134e6 < info["parameters"] < 135e6  # SmolLM2-135M (tied embeddings counted once)
    mix = info["quantization"]
    assert {"Q4_1", "Q8_0"} <= set(mix) and sum(g["bytes"] for g in mix.values()) <= info["file_bytes"]
    assert info["chat_template"] and info["tool_calls"].startswith("hermes") and not info["fill_in_the_middle"]
    quantized = can_run_quantized(path, torch.float32)[0]
    assert info["weights_auto"] == (AUTO_QUANTIZED if quantized else "dense")
    # The KV cache's dtype (--kv-cache-dtype auto): the compute dtype.
    assert info["precision"]["kv_cache_dtype"] == info["dtype_auto"]
    assert info["kv_bytes_per_token"] == 2 * 30 * 3 * 64 * (4 if info["dtype_auto"] == "fp32" else 2)
    # quantized weights take less than dense fp32 ones, and more than the file's projections
    assert info["file_bytes"] * 0.9 < info["resident_weights_bytes"] < info["parameters"] * 4


def test_cli_table_and_json(capsys):
    assert main(["inspect"]) == 0
    table = capsys.readouterr().out
    assert "architecture" in table and "--weights auto" in table and "KiB per token" in table
    assert main(["inspect", default_model_path(), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["served_name"] == "SmolLM2-135M-Instruct"


def test_an_unsupported_architecture_is_named(tmp_path, capsys):
    import gguf

    path = str(tmp_path / "tiny-phi3.gguf")
    writer = gguf.GGUFWriter(path, "phi3")
    writer.add_block_count(1)
    writer.add_context_length(128)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_tensor("token_embd.weight", np.zeros((16, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    info = describe(path)
    assert not info["supported"] and "phi3" in info["problem"]
    assert info["parameters"] == 128 and info["quantization"]["F32"]["tensors"] == 1
    assert main(["inspect", path]) == 1
    assert "NOT SUPPORTED" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["inspect", str(tmp_path / "missing.bin")])
