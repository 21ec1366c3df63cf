"""Draft-model speculation below the engine: the proposer's per-request state, rollback and block
accounting on a tiny random model; the tokenizer check; the scheduler's placeholder slots with a
fake executor that fills them (fewer than planned, wrong ones, none); the configuration."""

from __future__ import annotations

import pytest
import torch

from tests.fakes import FakeExecutor
from tests.unit.test_scheduler_policy import expected_output, idle, make, req, run_until_done
from trillium.config import SpeculativeConfig
from trillium.engine.sampler import inverse_cdf
from trillium.engine.verify import position_generator
from trillium.models import LlamaForCausalLM, ModelConfig, default_model_path
from trillium.ops.attention import AttentionMetadata
from trillium.protocol import FinishReason, SamplingParams, ScheduledRequest, StepOutput
from trillium.speculative.draft import DraftProposer, check_same_tokenizer
from trillium.speculative.draft_slots import PLACEHOLDER
from trillium.tokenizer import load_tokenizer

BLOCK = 4
VOCAB = 96
GREEDY = SamplingParams(temperature=0.0, max_tokens=64)


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    config = ModelConfig(
        architecture="llama",
        name="tiny",
        num_layers=2,
        hidden_size=64,
        intermediate_size=96,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        vocab_size=VOCAB,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    return model.eval()


def proposer(model, num_blocks=64, **kw) -> DraftProposer:
    return DraftProposer(model, num_blocks=num_blocks, block_size=BLOCK, dtype=torch.float32, **kw)


def scheduled(request_id: str, context: list[int], k: int, sampling: SamplingParams = GREEDY) -> ScheduledRequest:
    """A speculating request as the scheduler sends it with method draft: its last token, k
    placeholder slots, and its whole context."""
    return ScheduledRequest(
        request_id=request_id,
        token_ids=[context[-1]] + [PLACEHOLDER] * k,
        start_pos=len(context) - 1,
        block_ids=[],  # the target's blocks: not the proposer's business
        sample=True,
        sampling=sampling,
        prompt_token_ids=context[:3],
        output_token_ids=context[3:],
        num_draft_tokens=k,
    )


@torch.inference_mode()
def logits_after(model, context: list[int]) -> torch.Tensor:  # [V]: the next token's, from a fresh KV
    n = len(context)
    kv = model.allocate_kv_caches(-(-n // BLOCK), BLOCK, torch.float32)
    meta = AttentionMetadata.build([n], [n], [list(range(-(-n // BLOCK)))], BLOCK)
    hidden = model(torch.tensor(context), torch.arange(n), kv, meta)
    return model.compute_logits(hidden[-1:]).float()[0]


def greedy_continuation(model, context: list[int], n: int) -> list[int]:
    out: list[int] = []
    for _ in range(n):
        out.append(int(logits_after(model, context + out).argmax()))
    return out


def context_of(seed: int, n: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (n,), generator=g).tolist()


def test_drafts_are_the_draft_models_greedy_continuation_and_its_kv_is_kept(model) -> None:
    p = proposer(model)
    context = context_of(1, 13)
    ((drafts, q),) = p.propose([scheduled("a", context, 4)])
    assert drafts == greedy_continuation(model, context, 4) and q is None
    # K/V of the context and of every draft but the last (only its successor needs it).
    assert p.cached_tokens("a") == context + drafts[:3]
    assert p.num_total_blocks - p.num_free_blocks == -(-(13 + 3) // BLOCK)
    p.check_invariants()


def test_rollback_to_the_common_prefix_frees_the_blocks_past_it(model) -> None:
    p = proposer(model)
    context = context_of(2, 10)
    ((drafts, _),) = p.propose([scheduled("a", context, 6)])  # K/V for 10 + 5 tokens: 4 blocks
    assert p.num_total_blocks - p.num_free_blocks == 4
    # The target kept 1 draft and chose another token: the rest of the draft K/V is stale.
    context = [*context, drafts[0], (drafts[1] + 1) % VOCAB]
    ((again, _),) = p.propose([scheduled("a", context, 1)])
    assert again == greedy_continuation(model, context, 1)
    assert p.cached_tokens("a") == context  # rolled back to 11 tokens, then fed the new last one
    assert p.num_total_blocks - p.num_free_blocks == 3
    # Preempted and recomputed by the target from a shorter context: rolled back again.
    short = [*context[:5], 7, 8]
    ((drafts, _),) = p.propose([scheduled("a", short, 2)])
    assert drafts == greedy_continuation(model, short, 2)
    assert p.cached_tokens("a") == short + drafts[:1]
    assert p.num_total_blocks - p.num_free_blocks == 2
    p.release(["a", "unknown"])
    assert p.num_free_blocks == p.num_total_blocks and p.cached_tokens("a") == []
    p.check_invariants()


def test_requests_draft_together_each_as_if_alone(model) -> None:
    p = proposer(model)
    contexts = {"a": context_of(3, 5), "b": context_of(4, 17), "c": context_of(5, 9)}
    slots = {"a": 3, "b": 1, "c": 5}
    proposals = p.propose([scheduled(r, contexts[r], slots[r]) for r in contexts])
    for r, (drafts, _) in zip(contexts, proposals):
        assert drafts == greedy_continuation(model, contexts[r], slots[r]), r
    p.check_invariants()


def test_a_full_pool_evicts_idle_requests_then_gives_fewer_drafts_or_none(model) -> None:
    p = proposer(model, num_blocks=6)
    p.propose([scheduled("old", context_of(6, 8), 1)])  # 2 blocks
    p.propose([scheduled("idle", context_of(7, 4), 1)])  # 1 block
    assert p.num_free_blocks == 3
    # 9 tokens + 3 drafts need 3 blocks: free, nothing evicted.
    ((drafts, _),) = p.propose([scheduled("a", context_of(8, 9), 3)])
    assert len(drafts) == 3 and p.cached_tokens("old") and p.cached_tokens("idle")
    # Next: "a" needs a 4th block; the least recently drafted idle request ("old") makes room.
    context = context_of(8, 9) + drafts[:2] + [1, 2, 3]
    ((drafts, _),) = p.propose([scheduled("a", context, 3)])
    assert len(drafts) == 3 and p.cached_tokens("old") == [] and p.cached_tokens("idle")
    # Two busy requests cannot evict each other: "b" gets what fits, "c" nothing.
    proposals = p.propose(
        [
            scheduled("a", context + drafts[:1], 1),
            scheduled("b", context_of(9, 6), 4),
            scheduled("c", context_of(10, 9), 2),
        ]
    )
    assert [len(d) for d, _ in proposals] == [1, 3, 0]  # "b": 6 + 2 tokens fill its 2 blocks
    assert p.cached_tokens("idle") == [] and p.num_free_blocks == 0 and p.num_short == 2
    assert proposals[1][0] == greedy_continuation(model, context_of(9, 6), 3)
    p.check_invariants()
    p.reset()
    assert p.num_free_blocks == p.num_total_blocks
    p.check_invariants()


def test_a_long_context_catches_up_in_chunks_before_drafting(model) -> None:
    p = proposer(model, max_catch_up_tokens=8)
    context = context_of(11, 20)
    assert p.propose([scheduled("a", context, 2)]) == [([], None)]
    assert p.cached_tokens("a") == context[:8]
    assert p.propose([scheduled("a", context, 2)]) == [([], None)]
    ((drafts, _),) = p.propose([scheduled("a", context, 2)])  # 4 tokens left: within the budget
    assert drafts == greedy_continuation(model, context, 2)
    p.check_invariants()


def test_sampled_drafts_unseeded_carry_q_and_seeded_use_the_targets_numbers(model) -> None:
    context = context_of(12, 7)
    unseeded = SamplingParams(temperature=0.9, top_k=20, max_tokens=8)
    ((drafts, q),) = proposer(model).propose([scheduled("u", context, 3, unseeded)])
    assert q is not None and q.shape == (3, VOCAB) and q.dtype == torch.float32
    assert torch.allclose(q.sum(dim=-1), torch.ones(3)) and ((q > 0).sum(dim=-1) <= 20).all()
    assert all(q[j, d] > 0 for j, d in enumerate(drafts))

    seeded = SamplingParams(temperature=0.9, top_p=0.8, seed=42, max_tokens=8)
    ((drafts, q),) = proposer(model).propose([scheduled("s", context, 3, seeded)])
    assert q is None  # verified as a point mass against the target's draw at the same number
    assert proposer(model).propose([scheduled("s", context, 3, seeded)]) == [(drafts, None)]
    # Draft j is the inverse-CDF draw of the processed draft distribution at the number the
    # request's generator gives sequence index len(context) + j.
    from trillium.engine.sampler import truncate

    expected: list[int] = []
    for j in range(3):
        logits = logits_after(model, context + expected) / torch.tensor([0.9])
        probs = torch.softmax(truncate(logits.unsqueeze(0), [-1], [0.8], [0.0]), dim=-1)
        expected.append(int(inverse_cdf(probs, [position_generator(42, len(context) + j)])[0]))
    assert drafts == expected


def test_a_request_without_its_context_gets_no_drafts(model) -> None:
    p = proposer(model)
    r = scheduled("a", context_of(13, 5), 2)
    r.prompt_token_ids = r.output_token_ids = None
    assert p.propose([r]) == [([], None)]
    p.check_invariants()


# ---- the tokenizer check ---------------------------------------------------------------------


def test_a_draft_with_another_tokenizer_is_refused_naming_both_models_and_the_difference() -> None:
    path = default_model_path()
    target, draft = load_tokenizer(path), load_tokenizer(path)
    check_same_tokenizer(path, target, "draft.gguf", draft)  # the same: fine
    draft.eos_token_id = 0
    with pytest.raises(ValueError) as err:
        check_same_tokenizer(path, target, "draft.gguf", draft)
    assert "draft.gguf" in str(err.value) and path in str(err.value) and "eos_token_id 2 vs 0" in str(err.value)
    other = load_tokenizer(path)
    other.convert_ids_to_tokens = lambda ids: [
        "x" if i == 77 else t for i, t in zip(ids, target.convert_ids_to_tokens(ids))
    ]
    with pytest.raises(ValueError, match="token 77 is"):
        check_same_tokenizer(path, target, "draft.gguf", other)


# ---- the scheduler's placeholder slots -------------------------------------------------------


class FillingExecutor(FakeExecutor):
    """Plays the runner with a draft model: fills each request's slots with the true tokens of
    their positions (``FakeExecutor.token_at``), but only ``fill`` of them, the one at
    ``wrong_at`` wrong; reports the filled drafts as the runner does."""

    def __init__(self, block_size: int, fill: int, wrong_at: int | None = None) -> None:
        super().__init__(block_size)
        self.fill, self.wrong_at = fill, wrong_at
        self.num_filled = 0
        self.released: list[str] = []

    def execute(self, step_input):
        self.released.extend(step_input.finished_request_ids)
        drafts: list[list[int] | None] = []
        for r in step_input.requests:
            if not r.num_draft_tokens:
                drafts.append(None)
                continue
            assert r.token_ids[1:] == [PLACEHOLDER] * r.num_draft_tokens
            assert r.prompt_token_ids is not None  # the whole context comes along
            assert len(r.prompt_token_ids) + len(r.output_token_ids or []) == r.start_pos + 1
            filled = [self.token_at(r.start_pos + 1 + j) for j in range(min(self.fill, r.num_draft_tokens))]
            if self.wrong_at is not None and self.wrong_at < len(filled):
                filled[self.wrong_at] = 1
            r.token_ids = r.token_ids[:1] + filled
            r.num_draft_tokens = len(filled)
            self.num_filled += len(filled)
            drafts.append(filled)
        out = super().execute(step_input)
        accepted = out.num_accepted_drafts or [0] * len(out.sampled_token_ids)
        return StepOutput(out.sampled_token_ids, out.logprobs, accepted, drafts)


@pytest.mark.parametrize(("fill", "wrong_at"), [(4, None), (2, None), (3, 1), (0, None)])
def test_the_policy_keeps_the_drafts_the_executor_filled_and_frees_the_rest(fill, wrong_at) -> None:
    spec = SpeculativeConfig(method="draft", model="draft.gguf", num_speculative_tokens=4, disable_by_batch_size=8)
    policy, allocator, _ = make(speculative=spec)
    executor = FillingExecutor(4, fill, wrong_at)
    policy.add(req("a", 9, max_tokens=23, temperature=0.0))
    policy.add(req("b", 5, max_tokens=17, temperature=0.0))
    outputs, reasons = run_until_done(policy, executor)
    assert outputs == {"a": expected_output(9, 23), "b": expected_output(5, 17)}
    assert set(reasons.values()) == {FinishReason.LENGTH}
    assert idle(policy) and allocator.num_free_blocks == allocator.num_total_blocks
    stats = policy.spec_stats  # counts the filled drafts, not the slots
    assert stats.num_draft_tokens == executor.num_filled
    if wrong_at is None:
        assert stats.num_accepted_tokens == executor.num_filled
    else:
        assert stats.num_accepted_tokens == stats.num_drafts  # one accepted per verify
    assert (stats.num_drafts == 0) == (fill == 0)
    # The finished requests' ids reach the executor with the next step, or when it goes idle.
    assert sorted(executor.released + policy.take_finished()) == ["a", "b"]


def test_draft_slots_skip_grammar_requests_and_back_off_after_rejections() -> None:
    from trillium.speculative.draft_slots import DraftSlots

    slots = DraftSlots(4)
    r = req("r", 5)
    assert slots.propose(r, 10) == [PLACEHOLDER] * 4 and slots.propose(r, 2) == [PLACEHOLDER] * 2
    slots.feedback("r", 4, 0)
    assert slots.propose(r, 10) == []  # one step off
    assert slots.propose(r, 10) == [PLACEHOLDER]  # then one slot (cap 2 * 0 + 1)
    slots.feedback("r", 1, 1)
    assert len(slots.propose(r, 10)) == 3
    slots.forget("r")
    assert len(slots.propose(r, 10)) == 4


def test_speculative_config_for_a_draft_model() -> None:
    config = SpeculativeConfig.from_json('{"model": "/m/draft.gguf", "num_speculative_tokens": 4}')
    assert (config.method, config.model, config.draft_kv_cache_gib) == ("draft", "/m/draft.gguf", None)
    config = SpeculativeConfig.from_json('{"method": "draft", "model": "d", "draft_kv_cache_gib": 0.5}')
    assert config.draft_kv_cache_gib == 0.5
    for bad, field in [
        ('{"method": "draft"}', "model"),
        ('{"method": "ngram", "model": "d"}', "model"),
        ('{"model": 3}', "model"),
        ('{"model": "d", "draft_kv_cache_gib": 0}', "draft_kv_cache_gib"),
        ('{"model": "d", "draft_kv_cache_gib": "1"}', "draft_kv_cache_gib"),
    ]:
        with pytest.raises(ValueError, match=field):
            SpeculativeConfig.from_json(bad)


def test_drafts_stop_at_the_draft_models_context_length(model) -> None:
    p = proposer(model, num_blocks=80)
    context = context_of(14, 254)  # the tiny model takes 256 positions: d_0 .. d_2 at 254 .. 256
    ((drafts, _),) = p.propose([scheduled("a", context, 4)])
    assert len(drafts) == 3 and len(p.cached_tokens("a")) == 256
    p.check_invariants()
