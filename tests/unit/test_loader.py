"""GGUF and HF-directory loaders: config fields, Q/K un-permutation, logits vs transformers."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.paged import prefill_and_greedy
from trillium.models import ModelConfig, default_model_path, load_model
from trillium.models.config import served_name
from trillium.models.gguf_file import GGUFFile
from trillium.models.gguf_loader import read_config, unpermute_qk


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute, verbatim in shape logic."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_gguf_config_of_default_model() -> None:
    config = read_config(GGUFFile(default_model_path()))
    assert config == ModelConfig(
        architecture="llama",
        name="SmolLM2-135M-Instruct",
        num_layers=30,
        hidden_size=576,
        intermediate_size=1536,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        vocab_size=49152,
        rope_theta=100000.0,
        rms_norm_eps=pytest.approx(1e-5),
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        attention_bias=False,
        rope_scaling=None,
    )


@pytest.mark.parametrize("shape", [(8 * 64, 40), (3 * 64, 7), (4 * 16,)])
def test_unpermute_inverts_llama_cpp(shape) -> None:
    heads = shape[0] // 64 if shape[0] % 64 == 0 else 4
    w = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    assert np.array_equal(unpermute_qk(_llama_cpp_permute(w, heads), heads), w)


@pytest.mark.parametrize(
    "file_name, expected",
    [
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct"),
        ("qwen2-0_5b-instruct-q4_k_m.gguf", "qwen2-0_5b-instruct"),
        ("Llama-3.2-1B-Instruct-Q8_0.gguf", "Llama-3.2-1B-Instruct"),
        ("model-f16.gguf", "model"),
        ("/models/Qwen2-0.5B/", "Qwen2-0.5B"),
    ],
)
def test_served_name(file_name: str, expected: str) -> None:
    assert served_name(file_name) == expected


@pytest.mark.slow
def test_gguf_weights_equal_hf_dequantized(hf_reference_dir) -> None:
    """Every parameter (Q/K un-permuted) equals what transformers made of the same GGUF; this also
    runs our HF-directory loader on a real checkpoint (tied embeddings, no `lm_head`)."""
    ours, config = load_model(default_model_path(), torch.float32, progress=False)
    from_hf, hf_config = load_model(str(hf_reference_dir), torch.float32, progress=False)
    assert hf_config.architecture == config.architecture and hf_config.tie_word_embeddings
    theirs = dict(from_hf.named_parameters())
    for name, param in ours.named_parameters():
        torch.testing.assert_close(param, theirs[name], rtol=0, atol=1e-6, msg=name)
    # And directly against the HF tensors for one layer's Q and K (not through our fusing).
    from safetensors import safe_open

    with safe_open(str(hf_reference_dir / "model.safetensors"), framework="pt") as f:
        hf_q = f.get_tensor("model.layers.3.self_attn.q_proj.weight")
        hf_k = f.get_tensor("model.layers.3.self_attn.k_proj.weight")
    q, k, _ = ours.layers[3].self_attn.qkv_proj.weight.split([576, 192, 192])
    torch.testing.assert_close(q, hf_q, rtol=0, atol=1e-6)
    torch.testing.assert_close(k, hf_k, rtol=0, atol=1e-6)


TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 128,
}


def _tiny_hf_model(kind: str):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    if kind == "qwen3":
        from transformers import Qwen3Config, Qwen3ForCausalLM

        model = Qwen3ForCausalLM(Qwen3Config(**TINY, head_dim=32))
        with torch.no_grad():  # q/k norms start as ones: make them matter
            for layer in model.model.layers:
                layer.self_attn.q_norm.weight.normal_(1.0, 0.3)
                layer.self_attn.k_norm.weight.normal_(1.0, 0.3)
        return model
    if kind in ("gemma2", "gemma3"):
        from transformers import Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig

        if kind == "gemma3":
            config = Gemma3TextConfig(
                **TINY, head_dim=32, sliding_window=8, sliding_window_pattern=2, query_pre_attn_scalar=48
            )
            model = Gemma3ForCausalLM(config)
        else:
            config = Gemma2Config(
                **TINY,
                head_dim=32,
                sliding_window=8,
                query_pre_attn_scalar=48,
                attn_logit_softcapping=2.0,
                final_logit_softcapping=3.0,
            )
            config._attn_implementation = "eager"  # soft-capping is written out in eager attention
            model = Gemma2ForCausalLM(config)
        with torch.no_grad():  # Gemma's norm weights start at zero (x * (1 + w)): make them matter
            for name, param in model.named_parameters():
                if name.endswith("norm.weight"):
                    param.normal_(0.0, 0.3)
        return model
    if kind == "mistral_swa":
        from transformers import MistralConfig, MistralForCausalLM

        return MistralForCausalLM(MistralConfig(**TINY, sliding_window=8))
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(**TINY))
    if kind == "llama_rope_scaled_tied":
        rope = {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        }
        return LlamaForCausalLM(LlamaConfig(**TINY, rope_scaling=rope, tie_word_embeddings=True))
    return Qwen2ForCausalLM(Qwen2Config(**TINY, tie_word_embeddings=True))


@pytest.mark.parametrize(
    "kind", ["llama", "llama_rope_scaled_tied", "qwen2", "qwen3", "mistral_swa", "gemma2", "gemma3"]
)
def test_hf_dir_logits_match_transformers(kind: str, tmp_path) -> None:
    hf = _tiny_hf_model(kind).eval()
    if kind == "qwen2":  # random init leaves biases at zero; make them matter
        with torch.no_grad():
            for layer in hf.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_()
    # A tiny shard size exercises the sharded (index.json) path.
    hf.save_pretrained(tmp_path, max_shard_size="100KB" if kind == "llama" else "50MB")
    if kind == "llama":
        assert (tmp_path / "model.safetensors.index.json").exists()

    ours, config = load_model(str(tmp_path), torch.float32, progress=False)
    assert config.attention_bias == (kind == "qwen2")
    assert config.architecture == {"qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2", "gemma3": "gemma3"}.get(
        kind, "llama"
    )
    assert config.sliding_window == (8 if kind in ("mistral_swa", "gemma2", "gemma3") else 0)
    ids = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.inference_mode():
        expected = hf(torch.tensor([ids])).logits[0].float()
    torch.testing.assert_close(prefill_and_greedy(ours, ids)[0], expected, rtol=1e-4, atol=1e-4)


def test_unsupported_architecture_is_named(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        load_model(str(tmp_path))


def test_missing_path_and_bad_extension(tmp_path) -> None:
    with pytest.raises(FileNotFoundError):
        load_model(str(tmp_path / "nope.gguf"))
    bogus = tmp_path / "weights.bin"
    bogus.write_bytes(b"\0")
    with pytest.raises(ValueError, match=r"weights\.bin"):
        load_model(str(bogus))
