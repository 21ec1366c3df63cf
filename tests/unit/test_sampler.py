"""The batched sampler against straightforward references, and its distributions (chi-square)."""

from __future__ import annotations

import pytest
import torch

from trillium.engine.sampler import apply_logit_bias, apply_penalties, sample, truncate
from trillium.protocol import SamplingParams

# Chi-square critical values at p = 0.001 by degrees of freedom (scipy.stats.chi2.ppf(0.999, df)).
CHI2_CRIT_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32}
NUM_DRAWS = 20000
LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0])


def _draw(params: SamplingParams, num: int = NUM_DRAWS, logits: torch.Tensor = LOGITS) -> torch.Tensor:
    """Counts per token over ``num`` draws, all rows of one batched call, one fixed seed."""
    torch.manual_seed(1234)
    batch = logits.unsqueeze(0).repeat(num, 1)
    ids = sample(batch, [params] * num, [None] * num).token_ids
    return torch.bincount(torch.tensor(ids), minlength=logits.shape[0]).double()


def _chi_square(counts: torch.Tensor, expected_probs: torch.Tensor) -> tuple[float, int]:
    support = expected_probs > 0
    assert counts[~support].sum() == 0, "sampled a token outside the expected support"
    expected = expected_probs[support] * counts.sum()
    stat = float(((counts[support] - expected) ** 2 / expected).sum())
    return stat, int(support.sum()) - 1


def _assert_matches(params: SamplingParams, expected_probs: torch.Tensor) -> None:
    stat, df = _chi_square(_draw(params), expected_probs.double())
    assert stat < CHI2_CRIT_999[df], f"chi2={stat:.1f} df={df}"


def _renorm(p: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    p = torch.where(keep, p, torch.zeros_like(p))
    return p / p.sum()


# ---- logits processors against references ----------------------------------------------------


def test_logit_bias_adds_per_row():
    logits = torch.zeros(2, 5)
    apply_logit_bias(logits, [{1: 3.0, 4: -100.0}, {}])
    ref = torch.zeros(2, 5)
    ref[0, 1], ref[0, 4] = 3.0, -100.0
    assert torch.equal(logits, ref)


def test_penalties_match_reference():
    torch.manual_seed(0)
    logits = torch.randn(3, 10)
    params = [
        SamplingParams(repetition_penalty=1.5),
        SamplingParams(frequency_penalty=0.7, presence_penalty=0.3),
        SamplingParams(),
    ]
    histories = [([1, 2], [2, 3, 3]), ([1, 2], [2, 3, 3]), ([1], [1])]
    ref = logits.clone()
    for token in {1, 2, 3}:  # repetition: prompt + output
        ref[0, token] = ref[0, token] / 1.5 if ref[0, token] > 0 else ref[0, token] * 1.5
    for token, count in {2: 1, 3: 2}.items():  # frequency / presence: output only
        ref[1, token] -= 0.7 * count + 0.3
    apply_penalties(logits, params, histories)
    assert torch.allclose(logits, ref)


def test_truncate_matches_reference():
    logits = LOGITS.unsqueeze(0).repeat(3, 1)
    out = truncate(logits, [3, -1, -1], [1.0, 0.5, 1.0], [0.0, 0.0, 0.3])
    probs = torch.softmax(LOGITS, -1)
    keep_k = torch.arange(8) < 3
    before = probs.cumsum(0) - probs
    keep_p = before < 0.5
    keep_min_p = probs >= 0.3 * probs.max()
    for row, keep in enumerate([keep_k, keep_p, keep_min_p]):
        assert torch.equal(torch.isfinite(out[row]), keep), row


def test_greedy_is_argmax_after_bias_and_penalties():
    logits = torch.tensor([[1.0, 2.0, 0.5]])
    r = sample(logits.clone(), [SamplingParams(temperature=0.0)], [None])
    assert r.token_ids == [1]
    r = sample(logits.clone(), [SamplingParams(temperature=0.0, logit_bias={2: 5.0})], [None])
    assert r.token_ids == [2]
    r = sample(logits.clone(), [SamplingParams(temperature=0.0, presence_penalty=2.0)], [None], [([], [1])])
    assert r.token_ids == [0]


def test_logprobs_are_after_penalties_before_temperature():
    logits = torch.tensor([[1.0, 2.0, 0.5, -1.0]])
    params = SamplingParams(temperature=0.0, logit_bias={3: 1.0}, logprobs=2)
    r = sample(logits.clone(), [params], [None])
    ref = torch.log_softmax(torch.tensor([1.0, 2.0, 0.5, 0.0]), -1)
    chosen_lp, top = r.logprobs[0]
    assert r.token_ids == [1] and chosen_lp == pytest.approx(float(ref[1]))
    assert [t for t, _ in top] == [1, 0] and top[1][1] == pytest.approx(float(ref[0]))
    hot = SamplingParams(temperature=2.0, logprobs=0)
    r2 = sample(logits.repeat(2, 1), [hot, SamplingParams()], [None, None])
    assert r2.logprobs[1] is None and r2.logprobs[0][1] == []
    assert r2.logprobs[0][0] == pytest.approx(float(torch.log_softmax(logits[0], -1)[r2.token_ids[0]]))


# ---- distributions ----------------------------------------------------------------------------


def test_temperature_one_matches_softmax():
    _assert_matches(SamplingParams(temperature=1.0), torch.softmax(LOGITS, -1))


def test_temperature_scales_before_truncation():
    # top_p applied to the temperature-scaled distribution: a different nucleus than at T=1.
    t, p = 2.0, 0.6
    probs = torch.softmax(LOGITS / t, -1)
    keep = (probs.cumsum(0) - probs) < p
    assert keep.sum() != ((torch.softmax(LOGITS, -1).cumsum(0) - torch.softmax(LOGITS, -1)) < p).sum()
    _assert_matches(SamplingParams(temperature=t, top_p=p), _renorm(probs, keep))


def test_top_k_matches():
    probs = torch.softmax(LOGITS, -1)
    _assert_matches(SamplingParams(top_k=3), _renorm(probs, torch.arange(8) < 3))


def test_top_p_after_top_k():
    # Nucleus of the top-k renormalized: with k=4, p=0.8 keeps 3 tokens (of all 8 it would keep 4).
    probs = torch.softmax(LOGITS, -1)
    pk = _renorm(probs, torch.arange(8) < 4)
    keep = (pk.cumsum(0) - pk) < 0.8
    _assert_matches(SamplingParams(top_k=4, top_p=0.8), _renorm(pk, keep))


@pytest.mark.parametrize("vocab", [8, 5000])  # the full-sort path and the candidates path
def test_a_tiny_top_p_keeps_the_most_likely_token(vocab):
    # 1e-53 is a valid top_p (> 0) that rounds to 0 in fp32: it must mean "the top token only",
    # not "no token at all" (which sampled from an all -inf row).
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(vocab))
    logits[1, 7] = float("-inf")  # a masked token (a grammar's)
    params = [SamplingParams(top_p=1e-53), SamplingParams(top_p=1e-53, top_k=5), SamplingParams(top_p=1e-300)]
    ids = sample(logits.clone(), params, [None] * 3).token_ids
    assert ids == logits.argmax(dim=-1).tolist()


def test_min_p_matches():
    probs = torch.softmax(LOGITS, -1)
    _assert_matches(SamplingParams(min_p=0.2), _renorm(probs, probs >= 0.2 * probs.max()))


def test_penalty_before_temperature():
    # presence penalty is subtracted from the raw logits, then scaled by 1/T.
    penalized = LOGITS.clone()
    penalized[0] -= 1.5
    torch.manual_seed(99)
    num = NUM_DRAWS
    batch = LOGITS.unsqueeze(0).repeat(num, 1)
    p = SamplingParams(temperature=0.5, presence_penalty=1.5)
    ids = sample(batch, [p] * num, [None] * num, [([], [0])] * num).token_ids
    counts = torch.bincount(torch.tensor(ids), minlength=8).double()
    expected = torch.softmax(penalized / 0.5, -1).double()
    keep = expected * num > 5  # pool nothing: drop negligible cells from the test
    stat, df = _chi_square(counts * keep, _renorm(expected, keep))
    assert stat < CHI2_CRIT_999[df]


def test_chi_square_detects_wrong_order():
    """Draws reject the distribution of top-p applied before temperature (its nucleus at T=1
    is smaller, so the draws land outside its support) and of temperature ignored."""
    t, p = 2.0, 0.6
    counts = _draw(SamplingParams(temperature=t, top_p=p))
    probs = torch.softmax(LOGITS, -1)
    keep_wrong = (probs.cumsum(0) - probs) < p
    assert counts[~keep_wrong].sum() > 0
    with pytest.raises(AssertionError):
        _chi_square(counts, _renorm(torch.softmax(LOGITS / t, -1), keep_wrong).double())
    # Same nucleus size, no temperature: the chi-square statistic rejects it.
    correct = _renorm(
        torch.softmax(LOGITS / t, -1), (torch.softmax(LOGITS / t, -1).cumsum(0) - torch.softmax(LOGITS / t, -1)) < p
    )
    no_temp = _renorm(probs, correct > 0)
    stat, df = _chi_square(counts, no_temp.double())
    assert stat > CHI2_CRIT_999[df]


# ---- seeds ------------------------------------------------------------------------------------


def test_seeded_rows_ignore_the_batch():
    p = SamplingParams(temperature=1.0, seed=7)
    alone = sample(LOGITS.unsqueeze(0).clone(), [p], [torch.Generator().manual_seed(7)]).token_ids[0]
    gen = torch.Generator().manual_seed(7)
    batch = torch.randn(5, 8)
    batch[2] = LOGITS
    params = [SamplingParams(temperature=1.0)] * 5
    params[2] = p
    gens = [None, None, gen, None, None]
    assert sample(batch, params, gens).token_ids[2] == alone
    seq_alone = []
    g1 = torch.Generator().manual_seed(3)
    for _ in range(20):
        seq_alone.append(sample(LOGITS.unsqueeze(0).clone(), [p], [g1]).token_ids[0])
    g2 = torch.Generator().manual_seed(3)
    seq_batched = []
    for step in range(20):
        b = torch.randn(1 + step % 4, 8)
        b[0] = LOGITS
        seq_batched.append(
            sample(b, [p] + [SamplingParams()] * (b.shape[0] - 1), [g2] + [None] * (b.shape[0] - 1)).token_ids[0]
        )
    assert seq_alone == seq_batched


def test_inverse_cdf_never_draws_a_zero_probability_token(monkeypatch):
    import trillium.engine.sampler as sampler

    probs = torch.tensor([[0.0, 0.25, 0.0, 0.75, 0.0]]).repeat(4, 1)
    assert set(sampler.inverse_cdf(probs, [None] * 4).tolist()) <= {1, 3}
    # u * total rounding up to total (u at the top of [0, 1)) must not fall off the end.
    monkeypatch.setattr(sampler.torch, "rand", lambda n, **kw: torch.ones(n, dtype=kw.get("dtype")))
    assert sampler.inverse_cdf(probs, [None] * 4).tolist() == [3, 3, 3, 3]
    monkeypatch.setattr(sampler.torch, "rand", lambda n, **kw: torch.zeros(n, dtype=kw.get("dtype")))
    assert sampler.inverse_cdf(probs, [None] * 4).tolist() == [1, 1, 1, 1]


def test_candidate_truncation_equals_the_full_sort():
    """``truncate`` settles rows on their top CANDIDATES tokens where that is exact and sorts
    the rest: row by row it must equal the full-sort reference, on fresh random rows whose
    vocabulary exceeds the candidates (peaked and flat, every mix of top-k, top-p, min-p)."""
    from trillium.engine.sampler import CANDIDATES, _truncate_sorted

    gen = torch.Generator().manual_seed(int(torch.randint(1 << 30, (1,))))
    for _ in range(40):
        rows, vocab = 8, int(torch.randint(CANDIDATES + 1, 4 * CANDIDATES, (1,), generator=gen))
        logits = torch.randn(rows, vocab, generator=gen) * float(torch.empty(1).uniform_(0.1, 8, generator=gen))
        top_k = [int(k) if i % 3 else 0 for i, k in enumerate(torch.randint(1, 2 * CANDIDATES, (rows,), generator=gen))]
        top_p = [float(p) if i % 2 else 1.0 for i, p in enumerate(torch.rand(rows, generator=gen))]
        min_p = [0.3 * float(m) if i % 3 == 0 else 0.0 for i, m in enumerate(torch.rand(rows, generator=gen))]
        out = truncate(logits.clone(), top_k, top_p, min_p)
        for r in range(rows):
            if top_k[r] > 0 or top_p[r] < 1.0 or min_p[r] > 0.0:
                expected = _truncate_sorted(logits[r : r + 1].clone(), [top_k[r]], [top_p[r]], [min_p[r]])[0]
            else:
                expected = logits[r]
            assert torch.equal(out[r], expected), (r, top_k[r], top_p[r], min_p[r])
