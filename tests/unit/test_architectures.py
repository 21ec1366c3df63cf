"""Every supported architecture, from a GGUF file in the quantization types real files use, against
Hugging Face transformers on the same weights (tests/tiny_gguf.py writes both).

For each of Llama (Q/K rows permuted in the file), Llama 3.1 (rope scaling as rope_freqs, tied
head), Mistral (with and without a sliding window), Qwen2 (q/k/v biases), Qwen3 (q/k norms), Gemma 2
(soft-capped attention scores and logits) and Gemma 3 (four norms a layer, GELU, scaled embeddings,
sliding and global layers with their own RoPE), with projections in Q4_K, Q5_K, Q6_K,
Q5_0, Q5_1, Q4_0, Q4_1 and Q8_0 -- fused q/k/v and gate/up mixing types as Q4_K_M files do --
served dense (dequantized) and kept quantized (the C++ kernels, one-call decoder stack): fp32 logits
within summation-order tolerance of transformers', and the same 32 greedy tokens, prefilled and
then decoded one step at a time through the paged KV cache.
"""

from __future__ import annotations

import pytest
import torch

from tests.paged import assert_stack_equals_per_operation, prefill_and_greedy
from tests.tiny_gguf import build
from trillium.models import load_model
from trillium.models.llama import QuantLinear

KINDS = ["llama", "llama3", "mistral", "mistral_swa", "qwen2", "qwen3", "gemma2", "gemma3"]


@pytest.fixture(scope="module", params=KINDS)
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param) / f"tiny-{request.param}.gguf"
    hf = build(request.param, path, seed=hash(request.param) % 1000)
    return request.param, str(path), hf


@pytest.mark.parametrize("quantized", [False, True], ids=["dense", "quantized"])
def test_gguf_matches_transformers(tiny, quantized):
    kind, path, hf = tiny
    ours, config = load_model(path, torch.float32, progress=False, quantized=quantized)
    assert config.architecture == {"llama3": "llama", "mistral": "llama", "mistral_swa": "llama"}.get(kind, kind)
    assert config.sliding_window == (8 if kind in ("mistral_swa", "gemma2", "gemma3") else 0)
    assert (config.attn_softcap, config.final_softcap) == ((2.0, 3.0) if kind == "gemma2" else (0.0, 0.0))
    assert config.qk_norm == (kind in ("qwen3", "gemma3")) and config.attention_bias == (kind == "qwen2")
    if quantized:  # the projections, the head and the token table stay in the file's types
        assert any(isinstance(m, QuantLinear) and len(m.parts) == 2 for m in ours.modules())
        assert ours.quant_head is not None and ours.quant_embed is not None
    prompt = torch.randint(0, config.vocab_size, (24,), generator=torch.Generator().manual_seed(7)).tolist()
    logits, tokens = prefill_and_greedy(ours, prompt, 32)
    with torch.inference_mode():
        expected = hf(torch.tensor([prompt])).logits[0].float()
        reference = hf.generate(
            torch.tensor([prompt]), max_new_tokens=32, do_sample=False, pad_token_id=0, eos_token_id=None
        )[0, len(prompt) :].tolist()
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())
    assert tokens == reference


def test_one_call_decoder_stack_equals_the_per_operation_path(tiny):
    """The core's one-call layers run every architecture's layer (Gemma's sandwich norms, GELU-tanh,
    local RoPE tables and soft-capping included) with the per-operation path's kernels in its
    order: a mixed step (one prompt prefilled, two requests decoding) gives bit-identical hidden
    states and KV both ways."""
    _, path, _ = tiny
    model, _ = load_model(path, torch.float32, progress=False, quantized=True)
    assert_stack_equals_per_operation(model, [11, 1, 1], [11, 14, 5], [[1, 2, 3], [4, 5, 6, 7], [8, 9]], 4)
