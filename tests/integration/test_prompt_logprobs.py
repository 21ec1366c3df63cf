"""Prompt logprobs (``SamplingParams.prompt_logprobs``) through the offline ``LLM`` on the default
model: against a direct log-softmax over the same model's full-prompt logits, whatever the
chunking, the batch or the prefix cache, and against the Hugging Face transformers oracle.

The engine takes a small step budget, so every prompt longer than it is prefilled in chunks and
its logprobs are collected across steps; the direct computation is one paged prefill of the
whole prompt (``test_hf_parity._our_all_logits``). Tolerances are those of the fp32 logits parity
test (see ``test_hf_parity``): 1e-4 of the largest logit. A log-softmax moves by at most twice
its logits' largest change, and the measured differences are far below either bound.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.integration.test_hf_parity import CHAT, RAW, _all_logits, _our_all_logits
from trillium import LLM, SamplingParams
from trillium.engine import runner

pytestmark = pytest.mark.slow

STEP_BUDGET = 16  # tokens per step: prompts longer than this are prefilled in chunks
FOX = "The quick brown fox jumps over the lazy dog. "
LONG = FOX * 3 + (
    "Photosynthesis converts light energy into chemical energy stored in glucose, "
    "which plants use to grow; oxygen is released as a by-product."
)


@pytest.fixture(scope="module")
def llm():
    # Dense fp32 weights, as the HF oracle dequantizes them (the logits parity test's model).
    llm = LLM(
        precision="exact",
        weights="dense",
        progress=False,
        max_model_len=1024,
        kv_cache_gib=0.1,
        max_tokens_per_step=STEP_BUDGET,
    )
    yield llm
    llm.engine.close()


@pytest.fixture(scope="module")
def prompts(llm) -> list[str]:
    return [llm.tokenizer.apply_chat_template(m) for m in CHAT] + [*RAW, LONG]


def _direct(llm, prompt: list[int]) -> torch.Tensor:  # [P-1, V]: row p-1 is prompt token p's distribution
    return torch.log_softmax(_our_all_logits(llm.engine.model, prompt)[:-1].float(), dim=-1)


def _check_against(
    prompt_logprobs, prompt: list[int], truth: torch.Tensor, tol: float, k: int
) -> tuple[int, int]:  # (positions whose top-k ids were compared, positions)
    """``prompt_logprobs`` (RequestOutput's, aligned with the prompt) against the log-softmax
    ``truth`` [P-1, V]: each token's logprob and each reported alternative's within ``tol``;
    the top-k ids equal where every gap between truth's top k + 1 candidates is over ``2 tol``."""
    assert prompt_logprobs is not None and len(prompt_logprobs) == len(prompt)
    assert prompt_logprobs[0] is None
    compared = 0
    for p in range(1, len(prompt)):
        lp, top = prompt_logprobs[p]
        row = truth[p - 1]
        assert lp == pytest.approx(float(row[prompt[p]]), abs=tol), p
        assert len(top) == k
        for token_id, value in top:
            assert value == pytest.approx(float(row[token_id]), abs=tol), (p, token_id)
        assert [v for _, v in top] == sorted((v for _, v in top), reverse=True)
        values, ids = row.topk(k + 1)
        if bool((values[:-1] - values[1:] > 2 * tol).all()):
            assert [t for t, _ in top] == ids[:k].tolist(), p
            compared += 1
    return compared, len(prompt) - 1


@pytest.mark.skipif(
    os.environ.get("TRILLIUM_DEVICE", "cpu") not in ("", "cpu"),
    reason="the reference runs the model's fp32 CPU forward (1e-5 tolerance)",
)
def test_prompt_logprobs_equal_the_models_log_softmax_over_chunked_prefill(llm, prompts) -> None:
    outs = llm.generate(prompts, SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=4))
    assert max(len(o.prompt_token_ids) for o in outs) > 3 * STEP_BUDGET  # several chunks
    compared = total = 0
    for out in outs:
        truth = _direct(llm, out.prompt_token_ids)
        tol = 1e-5 * float(truth.abs().max())  # the same model: only the chunking differs
        c, n = _check_against(out.prompt_logprobs, out.prompt_token_ids, truth, tol, 4)
        compared, total = compared + c, total + n
    assert compared >= total // 2  # the top-k ids check was not vacuous


def test_prompt_logprobs_ignore_the_prefix_cache_the_batch_and_sampling_parameters(llm, prompts, monkeypatch) -> None:
    """A warm prefix cache, a batch mixed with plain requests, small log-softmax slices and
    sampling parameters (bias, penalties, temperature, logprobs) change nothing."""
    prompt = prompts[-1]
    ids = llm.tokenizer.encode(prompt, add_special_tokens=True)
    plain = SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=3)
    (cold,) = llm.generate([prompt], plain)
    assert cold.prompt_token_ids == ids
    assert llm.generate("unrelated", SamplingParams(max_tokens=2))[0].prompt_logprobs is None  # not asked

    llm.generate([prompt], SamplingParams(max_tokens=1))  # caches the prompt's blocks
    before = llm.engine.scheduler.stats.latest
    assert before.num_cached_blocks >= len(ids) // 16
    monkeypatch.setattr(runner, "PROMPT_LOGPROBS_ROWS", 5)
    shaped = SamplingParams(
        max_tokens=3,
        temperature=0.7,
        seed=1,
        logit_bias={ids[3]: 50.0},
        repetition_penalty=1.3,
        presence_penalty=1.0,
        logprobs=2,
        prompt_logprobs=3,
    )
    batch = [prompt, prompts[0], prompt, prompts[1]]
    params = [plain, SamplingParams(max_tokens=4), shaped, SamplingParams(max_tokens=3, prompt_logprobs=0)]
    outs = llm.generate(batch, params)
    for out in (outs[0], outs[2]):
        assert out.prompt_logprobs is not None and len(out.prompt_logprobs) == len(ids)
        for got, want in zip(out.prompt_logprobs[1:], cold.prompt_logprobs[1:]):
            assert got[0] == pytest.approx(want[0], abs=1e-4)
            assert [t for t, _ in got[1]] == [t for t, _ in want[1]]
            assert [v for _, v in got[1]] == pytest.approx([v for _, v in want[1]], abs=1e-4)
    assert outs[1].prompt_logprobs is None
    assert outs[3].prompt_logprobs is not None and all(top == [] for _, top in outs[3].prompt_logprobs[1:])
    blocks = llm.engine.scheduler.policy.kv
    assert blocks.num_reclaimable_blocks == blocks.num_total_blocks  # nothing leaked


def test_prompt_logprobs_match_hf(llm, prompts, hf_reference_dir) -> None:
    """The oracle: HF transformers' fp32 log-softmax over the prompt's logits."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(hf_reference_dir, dtype=torch.float32).eval()
    k = 5
    outs = llm.generate(prompts, SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=k))
    compared = total = 0
    for out in outs:
        logits = _all_logits(hf, out.prompt_token_ids)[:-1]  # [P-1, V]
        tol = 1e-4 * float(logits.abs().max())  # the fp32 logits parity test's bound
        c, n = _check_against(out.prompt_logprobs, out.prompt_token_ids, torch.log_softmax(logits, dim=-1), tol, k)
        compared, total = compared + c, total + n
    assert compared >= total // 2  # the top-k ids check was not vacuous
