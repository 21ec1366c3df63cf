"""YaRN rope scaling (Qwen2.5 / Qwen3 long-context configs) against Hugging Face transformers.

The frequency table and attention factor equal what transformers' ``_compute_yarn_parameters``
returns (the defaults, beta_fast / beta_slow, no truncation, mscale / mscale_all_dim, an explicit
attention factor); the rotary table carries the attention factor as transformers' cos/sin do; and a
tiny random-weight Qwen2 with 4x YaRN over a 32-token pretraining context, read from a GGUF file
(dense, and quantized through the core's kernels and one-call decoder stack) and from a HF
directory, gives transformers' fp32 logits at 100 positions -- 68 of them past
``original_max_position_embeddings`` -- and the same greedy tokens decoded through the paged cache.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import transformers as tf
from transformers.modeling_rope_utils import _compute_yarn_parameters

from tests.paged import prefill_and_greedy
from tests.tiny_gguf import build
from trillium.models import load_model
from trillium.models.gguf_loader import read_config as read_gguf_config
from trillium.models.hf_loader import read_config as read_hf_config
from trillium.models.layers import RotaryEmbedding, rope_attention_factor, rope_inv_freq

PROMPT_LEN = 100  # past the pretraining context of 32, inside the 4x one of 128
CASES: dict[str, tuple[int, float, dict[str, Any]]] = {  # head_dim, theta, rope parameters
    "defaults": (64, 10000.0, {"factor": 4.0, "original_max_position_embeddings": 32}),
    "qwen2.5": (128, 1_000_000.0, {"factor": 4.0, "original_max_position_embeddings": 32768}),
    "betas-untruncated": (
        64,
        500_000.0,
        {
            "factor": 8.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 16.0,
            "beta_slow": 2.0,
            "truncate": False,
        },
    ),
    "mscale": (
        128,
        10000.0,
        {"factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 1.0, "mscale_all_dim": 0.5},
    ),
    "attention_factor": (
        64,
        10000.0,
        {"factor": 2.0, "original_max_position_embeddings": 2048, "attention_factor": 1.3},
    ),
}


def _hf_config(head_dim: int, theta: float, params: dict[str, Any]) -> Any:
    rope = {"rope_type": "yarn", "rope_theta": theta, **params}
    max_positions = int(params["factor"] * params["original_max_position_embeddings"])
    return tf.Qwen2Config(
        hidden_size=4 * head_dim,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=max_positions,
        rope_parameters=rope,
    )


@pytest.mark.parametrize("case", list(CASES))
def test_frequencies_and_attention_factor_equal_transformers(case):
    head_dim, theta, params = CASES[case]
    expected_inv_freq, expected_factor = _compute_yarn_parameters(_hf_config(head_dim, theta, params))
    scaling = {"rope_type": "yarn", **params}
    assert torch.equal(rope_inv_freq(head_dim, theta, scaling), expected_inv_freq)
    assert rope_attention_factor(scaling) == pytest.approx(expected_factor, rel=1e-12)
    if case == "defaults":
        assert expected_factor == pytest.approx(0.1 * math.log(4.0) + 1)
    if case == "mscale":
        assert expected_factor != pytest.approx(0.1 * math.log(40.0) + 1)


@pytest.mark.parametrize("case", ["defaults", "mscale"])
def test_rotary_table_carries_the_attention_factor(case):
    """Our cos/sin table -- what the torch path, the core's kernels and the CUDA path rotate with --
    is transformers' cos/sin, attention factor included."""
    head_dim, theta, params = CASES[case]
    config = _hf_config(head_dim, theta, params)
    positions = torch.arange(256)
    hf_cos, hf_sin = tf.models.qwen2.modeling_qwen2.Qwen2RotaryEmbedding(config)(
        torch.zeros(1, dtype=torch.float32), positions[None]
    )
    ours = RotaryEmbedding(head_dim, 256, theta, {"rope_type": "yarn", **params})
    torch.testing.assert_close(ours.cos, hf_cos[0, :, : head_dim // 2], rtol=0, atol=1e-5)
    torch.testing.assert_close(ours.sin, hf_sin[0, :, : head_dim // 2], rtol=0, atol=1e-5)
    assert ours.cos[0].max().item() == pytest.approx(rope_attention_factor({"rope_type": "yarn", **params}))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The YaRN Qwen2 as a GGUF file (tests/tiny_gguf.py) and the same weights as a HF directory."""
    root = tmp_path_factory.mktemp("yarn")
    hf = build("qwen2_yarn", root / "tiny-qwen2-yarn.gguf", seed=5)
    hf.save_pretrained(root / "hf")
    return root, hf


def _prompt(vocab_size: int) -> list[int]:
    return torch.randint(0, vocab_size, (PROMPT_LEN,), generator=torch.Generator().manual_seed(3)).tolist()


def _assert_matches(model, hf) -> None:
    prompt = _prompt(hf.config.vocab_size)
    logits, tokens = prefill_and_greedy(model, prompt, 16)
    with torch.inference_mode():
        expected = hf(torch.tensor([prompt])).logits[0].float()
        reference = hf.generate(
            torch.tensor([prompt]), max_new_tokens=16, do_sample=False, pad_token_id=0, eos_token_id=None
        )[0, PROMPT_LEN:].tolist()
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())
    assert tokens == reference


@pytest.mark.parametrize("quantized", [False, True], ids=["dense", "quantized"])
def test_gguf_matches_transformers_past_the_original_context(tiny, quantized):
    root, hf = tiny
    model, config = load_model(str(root / "tiny-qwen2-yarn.gguf"), torch.float32, progress=False, quantized=quantized)
    assert config.rope_scaling == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
    assert config.max_position_embeddings == 128
    _assert_matches(model, hf)


def test_hf_directory_matches_transformers_past_the_original_context(tiny):
    root, hf = tiny
    model, config = load_model(str(root / "hf"), torch.float32, progress=False)
    assert config.rope_scaling is not None and config.rope_scaling["rope_type"] == "yarn"
    assert config.rope_scaling["original_max_position_embeddings"] == 32
    _assert_matches(model, hf)


def test_attention_factor_dropped_is_caught(tiny, monkeypatch):
    """The logits comparison fails when the table lacks the attention factor."""
    import trillium.models.layers as layers

    root, hf = tiny
    monkeypatch.setattr(layers, "rope_attention_factor", lambda scaling: 1.0)
    model, _ = load_model(str(root / "hf"), torch.float32, progress=False)
    with pytest.raises(AssertionError):
        _assert_matches(model, hf)


def test_legacy_hf_config_is_completed_as_transformers_does(tmp_path):
    """``rope_scaling: {"type": "yarn"}`` (transformers 4 configs) with the pretraining length at the
    top level (Phi-3 style, which wins) reads as transformers reads it."""
    cfg = {
        "architectures": ["Qwen2ForCausalLM"],
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 64,
        "max_position_embeddings": 256,
        "rope_theta": 10000.0,
        "original_max_position_embeddings": 64,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 999, "beta_fast": 24},
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    config = read_hf_config(str(tmp_path))
    config.validate()
    assert config.rope_scaling is not None
    assert config.rope_scaling["original_max_position_embeddings"] == 64
    expected_inv_freq, expected_factor = _compute_yarn_parameters(tf.Qwen2Config(**cfg))
    assert torch.equal(rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling), expected_inv_freq)
    assert rope_attention_factor(config.rope_scaling) == pytest.approx(expected_factor)


def _gguf_metadata(**scaling: Any) -> Any:
    md = {
        "general.architecture": "qwen2",
        "qwen2.attention.head_count": 4,
        "qwen2.attention.head_count_kv": 2,
        "qwen2.embedding_length": 256,
        "qwen2.block_count": 1,
        "qwen2.feed_forward_length": 512,
        "qwen2.context_length": 131072,
        "qwen2.rope.freq_base": 1_000_000.0,
        "qwen2.vocab_size": 64,
        "qwen2.rope.scaling.type": "yarn",
        **{f"qwen2.rope.scaling.{k}": v for k, v in scaling.items()},
    }
    return SimpleNamespace(path="x.gguf", metadata=md, tensors=[SimpleNamespace(name="output.weight")])


def test_gguf_yarn_keys():
    """The keys convert_hf_to_gguf.py writes map onto HF's; a file without the original context
    length gets the file's context length (transformers' default); an extrapolation factor other
    than 1 is refused by name."""
    full = read_gguf_config(
        _gguf_metadata(
            factor=4.0, original_context_length=32768, yarn_beta_fast=16.0, yarn_beta_slow=2.0, yarn_attn_factor=1.25
        )
    )
    assert full.rope_scaling == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 32768,
        "beta_fast": 16.0,
        "beta_slow": 2.0,
        "attention_factor": 1.25,
    }
    full.validate()
    assert rope_attention_factor(full.rope_scaling) == 1.25
    older = read_gguf_config(_gguf_metadata(factor=4.0, attn_factor=1.5))
    assert older.rope_scaling is not None and older.rope_scaling["attention_factor"] == 1.5
    assert older.rope_scaling["original_max_position_embeddings"] == 131072
    with pytest.raises(ValueError, match="yarn_ext_factor"):
        read_gguf_config(_gguf_metadata(factor=4.0, yarn_ext_factor=0.5))
    with pytest.raises(ValueError, match="factor"):
        read_gguf_config(_gguf_metadata(original_context_length=32768))
