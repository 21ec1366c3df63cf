"""spec_verify (``_core`` and ``_cuda``), the speculative-decoding verify kernel, on fresh random
inputs: every mode against a plain Python reference written here (exact: the reference adds the
same float64 numbers in the same order), point-mass draws against the sampler's own
``inverse_cdf`` bit for bit, a chi-square test that draft-model verification is lossless (and that
the same test catches biased verifiers), the argument checks, and the CUDA twin against the CPU
(marked ``gpu``). Failure messages carry the seed; ``TRILLIUM_TEST_SEED=<seed>`` replays a test.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from trillium import _core
from trillium.engine.sampler import inverse_cdf
from trillium.ops.kernel_specs import VerifySpec
from trillium.ops.spec_verify import VerifyMode, spec_verify

GREEDY, POINT_MASS, DRAFT_PROBS = VerifyMode.GREEDY, VerifyMode.POINT_MASS, VerifyMode.DRAFT_PROBS

# Upper 1e-6 quantiles of chi-square(df): mpmath, solving gammainc(df/2, x/2, inf, regularized) = 1e-6.
# A correct kernel fails one check in a million; each run makes about twenty.
CHI2_CRITICAL = {
    1: 23.9281, 2: 27.6310, 3: 30.6648, 4: 33.3768, 5: 35.8882, 6: 38.2583, 7: 40.5218, 8: 42.7009,
    9: 44.8109, 10: 46.8630, 11: 48.8656, 12: 50.8253, 13: 52.7471, 14: 54.6353, 15: 56.4934,
}  # fmt: skip
TRIALS = 20_000  # per distribution check: the smallest expected count stays above ~100


def _cuda_available() -> bool:
    try:
        from trillium import _cuda
    except ImportError:
        return False
    return torch.cuda.is_available() and _cuda.device_count() > 0


GPU = [pytest.mark.gpu, pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA GPU and trillium._cuda")]
DEVICES = ["cpu", pytest.param("cuda", marks=GPU)]


def ref_inverse_cdf(weights: torch.Tensor, u: float) -> int:
    """``inverse_cdf`` for one row of float64 weights and a given uniform."""
    cdf = weights.cumsum(0)
    chosen = int(torch.searchsorted(cdf, (u * cdf[-1]).reshape(1), right=True))
    if chosen < weights.shape[0]:
        return chosen
    positive = (weights > 0).nonzero()
    return int(positive[-1]) if positive.numel() else weights.shape[0] - 1


def ref_verify(batch: dict[str, Any]) -> tuple[list[int], list[list[int]]]:
    """The kernel's contract, one request and one position at a time."""
    target, drafts = batch["target"], batch["draft_tokens"]
    u, ur, q = batch["uniforms"], batch["residual_uniforms"], batch["draft_probs"]
    num_requests, positions, _ = target.shape
    accepted_all, rows = [], []
    for i in range(num_requests):
        n, mode = int(batch["num_draft"][i]), int(batch["modes"][i])
        d = [int(x) for x in drafts[i, :n]]
        a, next_token = 0, -1
        if mode == DRAFT_PROBS:
            for j in range(n + 1):
                row = target[i, j].double()
                if j == n:
                    next_token = ref_inverse_cdf(row, float(u[i, j]))
                    break
                total = float(row.cumsum(0)[-1])
                if float(u[i, j]) * float(q[i, j, d[j]]) < float(row[d[j]]) / total:
                    a += 1
                    continue
                diff = row / total - q[i, j].double()
                residual = torch.where(diff > 0, diff, torch.zeros_like(diff))
                fallback = not bool(residual.cumsum(0)[-1] > 0)
                next_token = ref_inverse_cdf(row if fallback else residual, float(ur[i]))
                break
        else:
            for j in range(n + 1):
                row = target[i, j]
                draw = int(row.argmax()) if mode == GREEDY else ref_inverse_cdf(row.double(), float(u[i, j]))
                if j < n and d[j] == draw:
                    a += 1
                    continue
                next_token = draw
                break
        accepted_all.append(a)
        rows.append(d[:a] + [next_token] + [-1] * (positions - a - 1))
    return accepted_all, rows


def random_probs(gen: torch.Generator, rows: int, vocab: int) -> torch.Tensor:
    """[rows, vocab] float32 like the sampler's processed probabilities: softmax at a random
    temperature (long tails of tiny values that a float64 sum must round), a random share of tokens
    masked to exactly 0 (never the most likely), times a random scale (rows need not sum to 1)."""
    logits = torch.randn(rows, vocab, generator=gen) * (torch.rand(rows, 1, generator=gen) * 12 + 0.3)
    masked = torch.rand(rows, vocab, generator=gen) < torch.rand(rows, 1, generator=gen) * 0.9
    masked &= logits != logits.amax(dim=1, keepdim=True)
    probs = torch.softmax(logits.masked_fill(masked, float("-inf")), dim=1)
    return probs * torch.exp(torch.randn(rows, 1, generator=gen))


def random_scores(gen: torch.Generator, rows: int, vocab: int) -> torch.Tensor:
    """[rows, vocab] greedy scores with ties (rounded) and -inf (masked) entries."""
    scores = torch.round(torch.randn(rows, vocab, generator=gen) * 2)
    return scores.masked_fill(torch.rand(rows, vocab, generator=gen) < 0.2, float("-inf"))


def random_batch(gen: torch.Generator, num_requests: int, k: int, vocab: int) -> dict[str, Any]:
    """A mixed batch (every mode, num_draft 0..k). Greedy and point-mass drafts are the reference's
    own draws until a random position, so acceptance runs of every length occur; draft-model drafts
    are sampled from their q. Draft slots past num_draft hold an invalid id (never read)."""
    modes = torch.randint(0, 3, (num_requests,), generator=gen, dtype=torch.int32)
    num_draft = torch.randint(0, k + 1, (num_requests,), generator=gen, dtype=torch.int32)
    uniforms = torch.rand(num_requests, k + 1, generator=gen, dtype=torch.float64)
    target = torch.empty(num_requests, k + 1, vocab)
    draft_probs = torch.zeros(num_requests, k, vocab)
    drafts = torch.full((num_requests, k), vocab + 7, dtype=torch.int64)
    for i in range(num_requests):
        mode = int(modes[i])
        target[i] = random_scores(gen, k + 1, vocab) if mode == GREEDY else random_probs(gen, k + 1, vocab)
        if k > 0 and mode == DRAFT_PROBS:
            q = random_probs(gen, k, vocab)
            draft_probs[i] = q / q.sum(dim=1, keepdim=True)
        for j in range(int(num_draft[i])):
            if mode == DRAFT_PROBS:
                drafts[i, j] = int(torch.multinomial(draft_probs[i, j], 1, generator=gen))
            elif float(torch.rand(1, generator=gen)) < 0.8:
                row = target[i, j]
                drafts[i, j] = (
                    int(row.argmax()) if mode == GREEDY else ref_inverse_cdf(row.double(), float(uniforms[i, j]))
                )
            else:
                drafts[i, j] = int(torch.randint(0, vocab, (1,), generator=gen))
    index_dtype = torch.int32 if float(torch.rand(1, generator=gen)) < 0.5 else torch.int64
    return {
        "target": target,
        "draft_tokens": drafts.to(index_dtype),
        "num_draft": num_draft,
        "modes": modes,
        "uniforms": uniforms,
        "residual_uniforms": torch.rand(num_requests, generator=gen, dtype=torch.float64),
        "draft_probs": draft_probs,
    }


def on(batch: dict[str, Any], device: str) -> dict[str, Any]:
    return {name: x.to(device) if isinstance(x, torch.Tensor) else x for name, x in batch.items()}


@pytest.mark.parametrize("device", DEVICES)
def test_matches_reference(device: str, random_seed: int) -> None:
    gen = torch.Generator().manual_seed(random_seed)
    shapes = [(int(torch.randint(1, 24, (1,), generator=gen)), k, v) for k, v in [(0, 5), (3, 1), (4, 97), (6, 300)]]
    shapes.append((6, 5, 5000))
    for num_requests, k, vocab in shapes:
        batch = random_batch(gen, num_requests, k, vocab)
        accepted, rows = ref_verify(batch)
        got = spec_verify(**on(batch, device))
        context = f"seed {random_seed}: N={num_requests} k={k} V={vocab} modes={batch['modes'].tolist()}"
        assert got.num_accepted.tolist() == accepted, context
        assert got.output_tokens.tolist() == rows, context


def test_greedy_ties_nan_and_masked_rows() -> None:
    """Greedy takes torch.argmax's token: the first maximum, a NaN over any number, -0.0 == 0.0."""
    inf, nan = float("inf"), float("nan")
    rows = [[1, 3, 3, -inf], [-inf, -inf, -inf, -inf], [2, nan, 5, nan], [-0.0, 0.0, -1, -2], [-inf, 4, inf, inf]]
    target = torch.tensor(rows).unsqueeze(1)  # [5, 1, 4]: k = 0, every request a plain decode step
    got = spec_verify(target, torch.empty(5, 0, dtype=torch.int32), [0] * 5, [GREEDY] * 5)
    assert got.output_tokens[:, 0].tolist() == target[:, 0].argmax(dim=1).tolist() == [1, 0, 1, 0, 2]


@pytest.mark.parametrize("vocab", [2, 613, 49_152])
def test_point_mass_draws_are_the_samplers_draws(vocab: int, random_seed: int) -> None:
    """With the uniforms a seeded request draws per position, point-mass verification outputs exactly
    the tokens ``sampler.inverse_cdf`` samples: accepted up to the first wrong draft, then its draw."""
    gen = torch.Generator().manual_seed(random_seed)
    num_requests, k = 12, 4
    target = random_probs(gen, num_requests * (k + 1), vocab).view(num_requests, k + 1, vocab)
    seeds = torch.randint(0, 2**62, (num_requests * (k + 1),), generator=gen).tolist()
    expected = inverse_cdf(target.view(-1, vocab), [torch.Generator().manual_seed(s) for s in seeds])
    expected = expected.view(num_requests, k + 1)
    uniforms = torch.tensor(
        [float(torch.rand(1, generator=torch.Generator().manual_seed(s), dtype=torch.float64)) for s in seeds],
        dtype=torch.float64,
    ).view(num_requests, k + 1)
    wrong_at = torch.randint(0, k + 1, (num_requests,), generator=gen)  # k: every draft right
    drafts = expected[:, :k].clone()
    for i, j in enumerate(wrong_at.tolist()):
        if j < k:
            drafts[i, j] = (drafts[i, j] + int(torch.randint(1, vocab, (1,), generator=gen))) % vocab
    got = spec_verify(target, drafts, [k] * num_requests, [POINT_MASS] * num_requests, uniforms)
    assert got.num_accepted.tolist() == wrong_at.tolist(), f"seed {random_seed}"
    for i, a in enumerate(wrong_at.tolist()):
        assert got.output_tokens[i, : a + 1].tolist() == expected[i, : a + 1].tolist(), f"seed {random_seed}: row {i}"


def test_point_mass_edge_rows() -> None:
    """u = 0 takes the first positive token; a row of zeros gives V - 1, as ``inverse_cdf`` does."""
    target = torch.tensor([[[0.0, 0.0, 2.0, 1.0]], [[0.0, 0.0, 0.0, 0.0]]])
    got = spec_verify(
        target, torch.empty(2, 0, dtype=torch.int32), [0, 0], [POINT_MASS] * 2, torch.zeros(2, 1).double()
    )
    assert got.output_tokens[:, 0].tolist() == [2, 3]
    assert int(inverse_cdf(target[1], [torch.Generator().manual_seed(0)])) == 3


def chi_square(tokens: torch.Tensor, p: torch.Tensor) -> tuple[float, float]:
    """(statistic, 1e-6 critical value) of ``tokens`` against the distribution ``p`` [V]. A token of
    probability 0 is an outright failure (infinite statistic)."""
    counts = torch.bincount(tokens.long(), minlength=p.shape[0]).double()
    p = p.double() / p.double().sum()
    support = p > 0
    if bool((counts[~support] > 0).any()):
        return math.inf, 0.0
    expected = p[support] * tokens.shape[0]
    statistic = float(((counts[support] - expected) ** 2 / expected).sum())
    return statistic, CHI2_CRITICAL[int(support.sum()) - 1]


def dirichlet(gen: torch.Generator, vocab: int, zeros: torch.Tensor | None = None) -> torch.Tensor:
    """A random distribution over ``vocab`` tokens, none below ~2% unless zeroed by ``zeros``."""
    p = -torch.rand(vocab, generator=gen).log() + 0.3
    if zeros is not None:
        p = p.masked_fill(zeros, 0.0)
    return p / p.sum()


def some_tokens(gen: torch.Generator, vocab: int) -> torch.Tensor:
    """A random proper, non-empty subset of the vocabulary, as a mask."""
    mask = torch.zeros(vocab, dtype=torch.bool)
    mask[torch.randperm(vocab, generator=gen)[: int(torch.randint(1, vocab - 1, (1,), generator=gen))]] = True
    return mask


def proposal_shapes(gen: torch.Generator, vocab: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(p, q) pairs: the target's distribution and the draft's, one position."""
    zeros = some_tokens(gen, vocab)
    p = dirichlet(gen, vocab)
    point = torch.zeros(vocab)
    point[int(torch.randint(0, vocab, (1,), generator=gen))] = 1.0
    return {
        "random": (p, dirichlet(gen, vocab)),
        "q zero where p > 0": (p, dirichlet(gen, vocab, zeros)),
        "p zero where q > 0": (dirichlet(gen, vocab, zeros), p),
        "q equals p": (p, p.clone()),
        "point-mass q": (dirichlet(gen, vocab, some_tokens(gen, vocab)), point),
        "disjoint supports": (dirichlet(gen, vocab, zeros), dirichlet(gen, vocab, ~zeros)),
    }


def draft_model_run(
    gen: torch.Generator, device: str, ps: list[torch.Tensor], qs: list[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(num_accepted, output_tokens) of TRIALS requests that share rows p_0..p_k (scaled: the kernel
    normalizes) and q_0..q_{k-1} (broadcast, stride 0), each with drafts sampled from q, fresh
    uniforms and num_draft 0..k."""
    k, vocab = len(qs), ps[0].shape[0]
    target = (torch.stack(ps) * 3.7).unsqueeze(0).expand(TRIALS, k + 1, vocab)
    draft_probs = torch.stack(qs).unsqueeze(0).expand(TRIALS, k, vocab)
    drafts = torch.stack([torch.multinomial(q, TRIALS, replacement=True, generator=gen) for q in qs], dim=1)
    batch = {
        "target": target,
        "draft_tokens": drafts,
        "num_draft": torch.randint(0, k + 1, (TRIALS,), generator=gen),
        "modes": [DRAFT_PROBS] * TRIALS,
        "uniforms": torch.rand(TRIALS, k + 1, generator=gen, dtype=torch.float64),
        "residual_uniforms": torch.rand(TRIALS, generator=gen, dtype=torch.float64),
        "draft_probs": draft_probs,
    }
    result = spec_verify(**on(batch, device))
    return result.num_accepted.cpu(), result.output_tokens.cpu()


@pytest.mark.parametrize("device", DEVICES)
def test_draft_model_outputs_follow_the_target(device: str, random_seed: int) -> None:
    """The first output token follows p_0; the second, wherever the first draft was accepted (in at
    least a tenth of the trials), p_1: a draft accepted or corrected at position 1, or the bonus."""
    gen = torch.Generator().manual_seed(random_seed)
    vocab = int(torch.randint(6, 13, (1,), generator=gen))
    shapes = proposal_shapes(gen, vocab)
    for name, (p, q) in shapes.items():
        p1, q1 = shapes["random"] if name != "random" else shapes["q equals p"]
        accepted, tokens = draft_model_run(gen, device, [p, p1, p], [q, q1])
        for position, rows, dist in [(0, accepted >= 0, p), (1, accepted >= 1, p1)]:
            if int(rows.sum()) < TRIALS // 10:  # the first draft is seldom accepted: too few samples
                continue
            statistic, critical = chi_square(tokens[rows, position], dist)
            assert statistic < critical, f"seed {random_seed}: {name}, position {position}: {statistic} >= {critical}"


def biased_first_tokens(
    bug: str, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, gen: torch.Generator
) -> torch.Tensor:
    """Position 0 of a broken verifier: ``always-accept``, or ``resample-p`` (on rejection, draws
    from p instead of the residual max(0, p - q))."""
    u = torch.rand(drafts.shape[0], generator=gen, dtype=torch.float64)
    accept = (
        u * q.double()[drafts] < p.double()[drafts] if bug == "resample-p" else torch.ones_like(u, dtype=torch.bool)
    )
    cdf = p.double().cumsum(0)
    redraw = torch.searchsorted(
        cdf, torch.rand(drafts.shape[0], generator=gen, dtype=torch.float64) * cdf[-1], right=True
    )
    return torch.where(accept, drafts, redraw.clamp(max=p.shape[0] - 1))


def test_the_chi_square_check_can_fail(random_seed: int) -> None:
    """Verifiers that are not lossless fail the same check at the same trial count: two broken
    Python verifiers, and the kernel told the wrong q (drafts drawn from q, the kernel given p: it
    then accepts every draft), while the kernel given the true q passes."""
    gen = torch.Generator().manual_seed(random_seed)
    p = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.05, 0.05])
    q = p.flip(0)
    drafts = torch.multinomial(q, TRIALS, replacement=True, generator=gen)
    for bug in ["always-accept", "resample-p"]:
        statistic, critical = chi_square(biased_first_tokens(bug, p, q, drafts, gen), p)
        assert statistic > critical, f"seed {random_seed}: {bug} passed ({statistic} <= {critical})"
    for told, lossless in [(q, True), (p, False)]:
        got = spec_verify(
            p.expand(TRIALS, 2, 6),
            drafts.unsqueeze(1),
            [1] * TRIALS,
            [DRAFT_PROBS] * TRIALS,
            torch.rand(TRIALS, 2, generator=gen, dtype=torch.float64),
            torch.rand(TRIALS, generator=gen, dtype=torch.float64),
            told.expand(TRIALS, 1, 6),
        )
        statistic, critical = chi_square(got.output_tokens[:, 0], p)
        assert (statistic < critical) == lossless, f"seed {random_seed}: q told {told.tolist()}: {statistic}"


def test_bad_arguments_raise_naming_the_value() -> None:
    target = random_probs(torch.Generator().manual_seed(0), 2 * 3, 10).view(2, 3, 10)
    drafts = torch.tensor([[1, 2], [3, 4]], dtype=torch.int32)
    u = torch.full((2, 3), 0.5, dtype=torch.float64)
    with pytest.raises(ValueError, match="request 1: mode 5 is not"):
        spec_verify(target, drafts, [2, 2], [GREEDY, 5], u)
    with pytest.raises(ValueError, match="request 0: num_draft 3 is outside"):
        spec_verify(target, drafts, [3, 2], [GREEDY, GREEDY])
    with pytest.raises(ValueError, match=r"request 1: draft token 1 = 10 is outside \[0, 10\)"):
        spec_verify(target, torch.tensor([[1, 2], [3, 10]]), [2, 2], [GREEDY, GREEDY])
    with pytest.raises(ValueError, match="draft token 0 = 8589934592 "):  # int64 ids are read as int64
        spec_verify(target, torch.tensor([[1, 2], [2**33, 1]]), [2, 2], [GREEDY, GREEDY])
    with pytest.raises(ValueError, match="request 0: a sampled mode needs uniforms"):
        spec_verify(target, drafts, [2, 2], [POINT_MASS, GREEDY])
    with pytest.raises(ValueError, match=r"request 1: uniform 2 = 1\.0+ is not in \[0, 1\)"):
        spec_verify(target, drafts, [2, 2], [GREEDY, POINT_MASS], torch.tensor([[0.5] * 3, [0.5, 0.5, 1.0]]).double())
    with pytest.raises(ValueError, match="needs draft_probs and residual_uniforms"):
        spec_verify(target, drafts, [2, 2], [DRAFT_PROBS, GREEDY], u)
    with pytest.raises(ValueError, match="target must be"):
        spec_verify(target.double(), drafts, [2, 2], [GREEDY, GREEDY])
    with pytest.raises(ValueError, match="draft_tokens must be"):
        spec_verify(target, drafts[:, :1], [1, 1], [GREEDY, GREEDY])
    with pytest.raises(ValueError, match="uniforms must be"):
        spec_verify(target, drafts, [2, 2], [POINT_MASS, POINT_MASS], u.float())
    with pytest.raises(ValueError, match="contiguous last dimension"):
        spec_verify(target.transpose(1, 2).contiguous().transpose(1, 2), drafts, [2, 2], [GREEDY, GREEDY])
    with pytest.raises(ValueError, match="at most 64 draft tokens"):
        spec_verify(torch.rand(1, 66, 4), torch.zeros(1, 65, dtype=torch.int32), [0], [GREEDY])
    # Greedy-only batches need no uniforms; unread draft slots may hold anything; N = 0 is fine.
    ok = spec_verify(target, torch.tensor([[1, -5], [99, 99]]), [1, 0], [GREEDY, GREEDY])
    assert ok.num_accepted.shape == (2,) and spec_verify(target[:0], drafts[:0], [], []).output_tokens.shape == (0, 3)


def test_spec_is_read_by_field_name() -> None:
    spec = VerifySpec(*([0] * len(VerifySpec._fields)))._replace(vocab_size=1, draft_tokens_int64=False)
    _core.spec_verify(spec, 1)  # zero requests: nothing read
    with pytest.raises(TypeError, match="VerifySpec"):
        _core.spec_verify(tuple(spec), 1)  # type: ignore[arg-type]


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA GPU and trillium._cuda")
def test_cuda_matches_cpu_at_real_vocabularies(random_seed: int) -> None:
    """Same tokens as the CPU kernel (both add the same float64 numbers in the same order), at real
    vocabulary sizes; a request with a bad device-resident value gets -1 instead of an error."""
    gen = torch.Generator().manual_seed(random_seed)
    for num_requests, k, vocab in [(3, 0, 151_936), (4, 8, 49_152), (9, 3, 32_000), (40, 2, 1000)]:
        batch = random_batch(gen, num_requests, k, vocab)
        cpu = spec_verify(**batch)
        gpu = spec_verify(**on(batch, "cuda"))
        context = f"seed {random_seed}: N={num_requests} k={k} V={vocab}"
        assert torch.equal(gpu.num_accepted.cpu(), cpu.num_accepted), context
        assert torch.equal(gpu.output_tokens.cpu(), cpu.output_tokens), context
    cpu_batch = random_batch(gen, 3, 2, 50)
    want = spec_verify(**cpu_batch)
    batch = on(cpu_batch, "cuda")
    batch["modes"] = batch["modes"].clone()
    batch["modes"][1] = 7  # no such mode
    got = spec_verify(**batch)
    assert got.num_accepted[1].item() == -1 and got.output_tokens[1].tolist() == [-1, -1, -1]
    for i in (0, 2):  # the bad request leaves the others' tokens as the CPU gives them
        context = f"seed {random_seed}: request {i}"
        assert got.num_accepted[i].item() == want.num_accepted[i].item(), context
        assert got.output_tokens[i].tolist() == want.output_tokens[i].tolist(), context
