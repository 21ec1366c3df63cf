"""The fast precision modes' rounding, held to its measured quality: ``bench/quality.py``'s windows
of the held text, the default mode (``--precision auto``) and the bf16 KV cache
(``--kv-cache-dtype bf16``) against exact fp32.

The full text's figure is in bench/RESULTS.md ("Precision, first step"); here two windows, in one
prefill pass and one token per decode step, must stay within 2x of it: a kernel change that
rounds more than its measured contract fails here, not in a user's answers."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from trillium.config import EngineConfig
from trillium.models import default_model_path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
from quality import HELD_TEXT, Score, load

# Mean KL divergence to exact of the bf16 KV cache over the whole held text (bench/RESULTS.md);
# the default (quantized weights, fp32 activations and KV) is below 1e-7.
FULL_TEXT_KLD = 4.0e-5
WINDOWS = 2


@pytest.fixture(scope="module")
def windows():
    from trillium.tokenizer import load_tokenizer

    with open(HELD_TEXT, encoding="utf-8") as f:
        ids = load_tokenizer(default_model_path()).encode(f.read())
    return [ids[i * 512 : (i + 1) * 512] for i in range(WINDOWS)]


@pytest.fixture(scope="module")
def references(windows):
    """Exact fp32's prefill of each window, computed once for both modes."""
    exact, _ = load(default_model_path(), "exact")  # dense fp32: the Hugging Face parity path
    assert exact is not None
    return [exact.prefill(window) for window in windows]


@pytest.mark.parametrize("mode", ["auto", "quantized-kv-bf16"])
def test_a_fast_mode_stays_within_its_measured_divergence(windows, references, mode):
    assert EngineConfig().precision == "auto"
    fast, _ = load(default_model_path(), mode)  # auto: what `trillium serve` computes with by default
    assert fast is not None
    prefill, decode = Score(), Score()
    for window, reference in zip(windows, references, strict=True):
        targets = torch.tensor(window[len(window) // 2 + 1 :])
        prefill.add(fast.prefill(window), targets, reference)
        decode.add(fast.decode(window), targets, reference)
    for path, score in (("prefill", prefill.result()), ("decode", decode.result())):
        assert score["kld"] <= 2 * FULL_TEXT_KLD, (path, score)
        assert score["top1"] >= 0.98, (path, score)
