"""The default model served with its GGUF Q4_1/Q8_0 weights kept quantized (``--weights auto``).

Exact mode (the default) must compute what the dense (dequantized, Hugging Face-exact) model
computes up to fp32 summation order: same greedy continuation, logits within fp32 noise. The
int16-activation mode (``--weights quantized-int16``, ``--precision auto``'s choice on AVX2) the
same greedy continuations, logits within 2e-3. The int8-activation mode (``--weights quantized-int8``) may differ by the activation rounding only:
each projection within a few per mille, next-token distributions nearly the same.
"""

from __future__ import annotations

import pytest
import torch

from tests.paged import assert_stack_equals_per_operation
from trillium.models import default_model_path, load_model
from trillium.models.llama import QuantLinear
from trillium.models.registry import can_run_quantized
from trillium.ops.attention import AttentionMetadata
from trillium.ops.quant_linear import Activations
from trillium.tokenizer import load_tokenizer

ok, why = can_run_quantized(default_model_path(), torch.float32)
pytestmark = pytest.mark.skipif(not ok, reason=f"quantized weights cannot run here: {why}")

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The theory of relativity states that",
    "List three colors:",
]


@pytest.fixture(scope="module")
def models():
    dense, _ = load_model(default_model_path(), torch.float32, progress=False)
    quant, _ = load_model(
        default_model_path(), torch.float32, progress=False, quantized=True, activations=Activations.INT8
    )
    return dense, quant


@pytest.fixture(scope="module")
def int16_model():
    model, _ = load_model(
        default_model_path(), torch.float32, progress=False, quantized=True, activations=Activations.INT16
    )
    return model


@pytest.fixture(scope="module")
def exact_model():
    model, _ = load_model(default_model_path(), torch.float32, progress=False, quantized=True)
    return model


def test_exact_mode_matches_dense(models, exact_model):
    dense, _ = models
    tokenizer = load_tokenizer(default_model_path())
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        a, b = last_logits(dense, ids), last_logits(exact_model, ids)
        torch.testing.assert_close(b, a, rtol=0, atol=2e-3)  # fp32 summation order only
        greedy_dense, greedy_exact = list(ids), list(ids)
        for _ in range(8):
            greedy_dense.append(int(last_logits(dense, greedy_dense).argmax()))
            greedy_exact.append(int(last_logits(exact_model, greedy_exact).argmax()))
        assert greedy_exact == greedy_dense, prompt


def test_every_projection_is_quantized(models):
    _, quant = models
    linears = [m for m in quant.modules() if isinstance(m, torch.nn.Linear)]
    assert not linears
    assert sum(isinstance(m, QuantLinear) for m in quant.modules()) == 4 * quant.config.num_layers
    assert quant.is_quantized


@pytest.mark.parametrize("layer", [0, 17])
def test_int8_mode_projections_match_dense(models, layer):
    dense, quant = models
    gen = torch.Generator().manual_seed(layer)
    for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"):
        d = dense.get_submodule(f"layers.{layer}.{name}")
        q = quant.get_submodule(f"layers.{layer}.{name}")
        x = torch.randn(5, d.in_features, generator=gen)
        ref = d(x)
        err = ((q(x) - ref).abs().max() / ref.abs().max()).item()
        assert err < 2e-2, f"{name}: relative error {err}"  # layout bugs (un-permute, fusion) give ~1
    h = torch.randn(3, dense.config.hidden_size, generator=gen)
    ref = dense.compute_logits(h)
    assert ((quant.compute_logits(h) - ref).abs().max() / ref.abs().max()).item() < 2e-2


def last_logits(model, ids: list[int]) -> torch.Tensor:
    n = len(ids)
    blocks = (n + 15) // 16
    kv = model.allocate_kv_caches(blocks, 16)
    meta = AttentionMetadata.build([n], [n], [list(range(blocks))], 16)
    with torch.inference_mode():
        hidden = model(torch.tensor(ids), torch.arange(n), kv, meta)
        return model.compute_logits(hidden[-1:])[0]


def test_int8_mode_next_token_distribution_matches_dense(models):
    dense, quant = models
    tokenizer = load_tokenizer(default_model_path())
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        a, b = last_logits(dense, ids), last_logits(quant, ids)
        assert a.argmax() == b.argmax(), prompt
        cosine = torch.nn.functional.cosine_similarity(a, b, dim=0).item()
        assert cosine > 0.99, (prompt, cosine)


def test_int16_mode_answers_as_exact_does(models, int16_model):
    """int16 activations (``--precision auto``'s choice on AVX2) round 256x finer than int8: the
    logits stay within 2e-3 of exact fp32's and every greedy continuation is the same."""
    dense, _ = models
    tokenizer = load_tokenizer(default_model_path())
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        a, b = last_logits(dense, ids), last_logits(int16_model, ids)
        assert (a - b).abs().max().item() < 2e-3 * a.abs().max().item(), prompt
        greedy_dense, greedy_int16 = list(ids), list(ids)
        for _ in range(8):
            greedy_dense.append(int(last_logits(dense, greedy_dense).argmax()))
            greedy_int16.append(int(last_logits(int16_model, greedy_int16).argmax()))
        assert greedy_int16 == greedy_dense, prompt


@pytest.mark.parametrize("mode", ["exact", "int8", "int16"])
def test_one_call_decoder_stack_equals_the_per_operation_path(models, exact_model, int16_model, mode):
    """The core's one-call layers (ops.decoder_stack) run the same kernels in the same order: a
    mixed step (one prompt being prefilled, two requests decoding) gives bit-identical hidden
    states and KV to the per-operation Python path, in every activation mode."""
    model = {"exact": exact_model, "int8": models[1], "int16": int16_model}[mode]
    tables = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10, 11]]
    assert_stack_equals_per_operation(model, [37, 1, 1], [37, 90, 18], tables, 16)
