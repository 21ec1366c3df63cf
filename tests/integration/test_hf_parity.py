"""Our GGUF loader + model + paged attention vs Hugging Face transformers on the default model.

HF dequantizes and un-permutes the GGUF itself (see tests/hf_oracle.py), so agreement checks
the loader as well as the forward pass.

Tolerances. fp32: both sides compute the same math in a different summation order (fused QKV
and gate/up matmuls, paged gather + SDPA vs HF's attention); measured max |diff| of the
last-position logits is ~1e-4 at a logit scale of ~30, i.e. ~3e-6 relative. We allow 1e-4 of the
largest logit (~30x headroom); any real bug (RoPE layout, Q/K permutation, norm eps, GQA
mapping) moves logits by O(1).

bf16: every matmul rounds to 8 mantissa bits; against the fp32 truth, HF's own bf16 run is off
by up to ~0.65 logits here, and so are we. Greedy decoding in bf16 therefore legitimately flips
at near-ties (top-2 margins of 0.04 occur in these prompts), so "the first 8 bf16 tokens equal"
is not a sound test. Instead: our bf16 error is at most 1.5x HF's bf16 error (and < 5% of the
logit scale); teacher-forced on the fp32 greedy path, our bf16 argmax matches wherever fp32 has a
clear winner (top-2 margin > 1.0); and free-running bf16 greedy leaves the fp32 path only at a
position whose fp32 margin is below 1.0.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from trillium.models import default_model_path, load_model
from trillium.ops.attention import AttentionMetadata
from trillium.tokenizer import load_tokenizer

pytestmark = pytest.mark.slow

BLOCK_SIZE = 16
NEW_TOKENS = 32
CHAT = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are a poet."},
        {"role": "user", "content": "Write two lines about the sea."},
    ],
]
RAW = ["The three primary colors are", "def fibonacci(n):\n    "]


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    tok = load_tokenizer(default_model_path())
    chat = [tok.encode(tok.apply_chat_template(m)) for m in CHAT]
    return chat + [tok.encode(p, add_special_tokens=True) for p in RAW]


@pytest.fixture(scope="module")
def ours_fp32():
    model, _ = load_model(default_model_path(), torch.float32, progress=False)
    return model


@pytest.fixture(scope="module")
def hf_fp32(hf_reference_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(hf_reference_dir, dtype=torch.float32).eval()


class PagedRunner:
    """A minimal single-request engine: prefill in chunks, then greedy decode through the paged KV
    (on the model's ``device``; the logits come back to the CPU)."""

    def __init__(self, model, num_blocks: int = 32, device: str = "cpu") -> None:
        self.model = model
        self.device = device
        self.kv = model.allocate_kv_caches(num_blocks, BLOCK_SIZE, device=device)
        # Non-contiguous, reversed block ids so that block-table indirection is exercised.
        self.table = list(range(num_blocks - 1, 0, -1))

    @torch.inference_mode()
    def step(self, ids: list[int], start: int) -> torch.Tensor:  # -> [V] logits of the last new token
        n = len(ids)
        needed = -(-(start + n) // BLOCK_SIZE)
        meta = AttentionMetadata.build([n], [start + n], [self.table[:needed]], BLOCK_SIZE, self.device)
        tokens = torch.tensor(ids, device=self.device)
        hidden = self.model(tokens, torch.arange(start, start + n, device=self.device), self.kv, meta)
        return self.model.compute_logits(hidden[-1:])[0].float().cpu()

    def greedy(self, prompt: list[int], num_new: int, chunks: int = 1) -> tuple[list[int], torch.Tensor]:
        """Tokens generated greedily and the prefill's last-position logits."""
        bounds = [len(prompt) * i // chunks for i in range(chunks + 1)]
        for a, b in itertools.pairwise(bounds):
            logits = self.step(prompt[a:b], a)
        first_logits = logits
        out = [int(logits.argmax())]
        while len(out) < num_new:
            logits = self.step(out[-1:], len(prompt) + len(out) - 1)
            out.append(int(logits.argmax()))
        return out, first_logits


def _hf_greedy(model, prompt: list[int], num_new: int, device: str = "cpu") -> tuple[list[int], torch.Tensor]:
    with torch.inference_mode():
        ids = torch.tensor([prompt], device=device)
        logits = model(ids).logits[0, -1].float().cpu()
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=num_new, do_sample=False, pad_token_id=2
        )
    return out[0, len(prompt) :].tolist(), logits


def _same_until_eos(ours: list[int], theirs: list[int], eos: int = 2) -> bool:
    """HF stops at EOS; we generate blindly. Equal up to HF's length, and HF stopped only at EOS."""
    return ours[: len(theirs)] == theirs and (len(theirs) == len(ours) or theirs[-1] == eos)


@pytest.fixture(scope="module")
def hf_fp32_results(hf_fp32, prompts):
    return [_hf_greedy(hf_fp32, p, NEW_TOKENS) for p in prompts]


def test_fp32_logits_and_greedy_match_hf(ours_fp32, prompts, hf_fp32_results) -> None:
    for prompt, (hf_tokens, hf_logits) in zip(prompts, hf_fp32_results):
        tokens, logits = PagedRunner(ours_fp32).greedy(prompt, NEW_TOKENS)
        scale = hf_logits.abs().max()
        assert (logits - hf_logits).abs().max() <= 1e-4 * scale
        assert _same_until_eos(tokens, hf_tokens), (tokens, hf_tokens)
        assert len(prompt) + NEW_TOKENS > 2 * BLOCK_SIZE  # decode crossed block boundaries


def test_fp32_chunked_prefill_matches_hf(ours_fp32, prompts, hf_fp32_results) -> None:
    """Prompt in two chunks: the second chunk attends to a cached prefix plus itself."""
    for prompt, (hf_tokens, hf_logits) in list(zip(prompts, hf_fp32_results))[:2]:
        tokens, logits = PagedRunner(ours_fp32).greedy(prompt, 8, chunks=2)
        assert (logits - hf_logits).abs().max() <= 1e-4 * hf_logits.abs().max()
        assert _same_until_eos(tokens, hf_tokens[:8])


def _all_logits(model, ids: list[int]) -> torch.Tensor:  # [n, V] fp32, HF model, one forward
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0].float()


def _our_all_logits(model, ids: list[int]) -> torch.Tensor:  # [n, V] fp32, ours, one paged prefill
    runner = PagedRunner(model)
    n = len(ids)
    meta = AttentionMetadata.build([n], [n], [runner.table[: -(-n // BLOCK_SIZE)]], BLOCK_SIZE, "cpu")
    with torch.inference_mode():
        return model.compute_logits(model(torch.tensor(ids), torch.arange(n), runner.kv, meta))


def test_bf16_as_accurate_as_hf_bf16(prompts, hf_fp32, hf_fp32_results, hf_reference_dir) -> None:
    """Teacher-forced on HF's fp32 greedy path: our bf16 logits are as close to the fp32 truth as
    HF's own bf16 run is; argmax agrees wherever fp32 has a clear winner (top-2 margin > 1.0,
    above the ~0.65 bf16 noise measured here); free-running greedy leaves the fp32 path only at a
    near-tie."""
    from transformers import AutoModelForCausalLM

    hf_bf16 = AutoModelForCausalLM.from_pretrained(hf_reference_dir, dtype=torch.bfloat16).eval()
    ours, _ = load_model(default_model_path(), torch.bfloat16, progress=False)
    our_err = hf_err = 0.0
    checked = 0
    for prompt, (hf_tokens, _) in zip(prompts, hf_fp32_results):
        path = prompt + hf_tokens[:8]
        rows = slice(len(prompt) - 1, len(path) - 1)  # logits that predicted hf_tokens[:8]
        truth = _all_logits(hf_fp32, path)[rows]
        ours_16 = _our_all_logits(ours, path)[rows]
        our_err = max(our_err, float((ours_16 - truth).abs().max()))
        hf_err = max(hf_err, float((_all_logits(hf_bf16, path)[rows] - truth).abs().max()))
        assert (ours_16 - truth).abs().max() <= 5e-2 * truth.abs().max()

        top2 = truth.topk(2, dim=-1).values
        margin = top2[:, 0] - top2[:, 1]  # [8]
        clear = margin > 1.0
        assert torch.equal(ours_16.argmax(-1)[clear], truth.argmax(-1)[clear])
        checked += int(clear.sum())
        tokens, _ = PagedRunner(ours).greedy(prompt, 8)
        diverged = next((i for i in range(8) if tokens[i] != hf_tokens[i]), None)
        # Free-running bf16 greedy may leave the fp32 path only at a near-tie.
        assert diverged is None or margin[diverged] < 1.0, (diverged, tokens, hf_tokens[:8])
    assert our_err <= 1.5 * hf_err
    assert checked >= 8  # the check above was not vacuous
