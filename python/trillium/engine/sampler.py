"""Batched sampling over a step's logits.

Per-request parameters become tensors so that the whole batch is processed by a handful
of torch ops, in this order::

    logit_bias -> repetition / frequency / presence penalties -> [logprobs] -> temperature
      -> top-k / top-p / min-p truncation -> softmax -> sample

Logprobs are the log-softmax of the logits after bias and penalties, before temperature and
truncation (the model's distribution as the request shaped it). Rows with ``temperature == 0``
are greedy (argmax after bias and penalties). Sampling inverts each row's cumulative
distribution at one uniform draw: exact, batched, and a seeded request takes its one number per
token from its own generator, so its samples do not depend on the batch. (The exponential race,
``argmax(p / E)``, needs a random number per vocabulary entry: 33 ms per step for 32 rows of a
49k vocabulary on a 2-vCPU CPU, against about 2 ms here.)

The logits may live on a GPU: every tensor made here is made on their device (host values copied
asynchronously through pinned memory), the uniforms are still drawn on the host (the requests'
generators are CPU generators), and the one synchronization is reading the chosen token ids
(and the logprobs of the rows that asked for them).
"""

from __future__ import annotations

import dataclasses

import torch

from trillium.ops.attention import host_to_device
from trillium.protocol import SamplingParams

TopLogprobs = tuple[float, list[tuple[int, float]]]  # (chosen logprob, [(token id, logprob)])
# (rows that asked, their log-softmax [L, V], top ids, top values, each row's k): see row_logprobs.
RowLogprobs = tuple[list[int], torch.Tensor, list[list[int]], list[list[float]], list[int]]


@dataclasses.dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[TopLogprobs | None] | None = None  # per row; None when no row asked


def sample(
    logits: torch.Tensor,  # [N, V] float32
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
    histories: list[tuple[list[int], list[int]] | None] | None = None,
) -> SampleResult:
    """One token id per row. ``generators[i]`` (if not None) drives row i's randomness.

    ``histories[i]`` is (prompt ids, output ids) of row i, required for rows with penalties.
    ``logits`` is modified in place.
    """
    num_rows = logits.shape[0]
    apply_logit_bias(logits, [p.logit_bias for p in params])
    if any(p.needs_history for p in params):
        assert histories is not None, "penalties need the token history"
        apply_penalties(logits, params, histories)
    logprobs = row_logprobs(logits, params)

    greedy = logits.argmax(dim=-1)  # [N]
    random_rows = [i for i, p in enumerate(params) if p.temperature > 0.0]
    if not random_rows:
        return SampleResult(greedy.tolist(), with_chosen(logprobs, logits, greedy))

    device = logits.device
    rows = host_to_device(torch.tensor(random_rows, dtype=torch.long), device)
    sub = logits.index_select(0, rows)  # [R, V]
    temperature = host_to_device(torch.tensor([params[i].temperature for i in random_rows], dtype=sub.dtype), device)
    sub = sub / temperature.unsqueeze(1)
    sub = truncate(
        sub,
        [params[i].top_k for i in random_rows],
        [params[i].top_p for i in random_rows],
        [params[i].min_p for i in random_rows],
    )
    probs = torch.softmax(sub, dim=-1)  # [R, V]
    chosen = inverse_cdf(probs, [generators[i] for i in random_rows])  # [R]

    out = greedy.clone()
    out[rows] = chosen
    assert out.shape[0] == num_rows
    return SampleResult(out.tolist(), with_chosen(logprobs, logits, out))


def inverse_cdf(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """One draw per row of ``probs`` [R, V]: the first token whose cumulative probability
    exceeds ``u * total`` for a uniform ``u`` (float64, so the cumulative sums lose nothing a
    draw could notice). One random number per row, from the row's own generator when it has
    one; a token with probability 0 is never chosen."""
    num_rows, vocab = probs.shape
    u = torch.empty(num_rows, dtype=torch.float64)
    unseeded = [j for j, g in enumerate(generators) if g is None]
    if unseeded:
        u[unseeded] = torch.rand(len(unseeded), dtype=torch.float64)
    for j, g in enumerate(generators):
        if g is not None:
            u[j] = torch.rand(1, generator=g, dtype=torch.float64)
    u = host_to_device(u, probs.device)
    cdf = probs.to(torch.float64).cumsum_(dim=-1)  # [R, V]
    target = (u * cdf[:, -1]).unsqueeze(1)  # [R, 1]
    chosen = torch.searchsorted(cdf, target, right=True).squeeze(1)  # first index with cdf > target
    over = chosen >= vocab  # u * total rounded up to total: take the last token with probability > 0
    if not probs.is_cpu:  # no synchronization on a GPU: every row's fallback, kept where needed
        last = vocab - 1 - (probs > 0).flip(dims=[1]).to(torch.uint8).argmax(dim=-1)
        return torch.where(over, last, chosen)
    if bool(over.any()):
        rows = over.nonzero().squeeze(1)
        chosen[rows] = vocab - 1 - (probs[rows] > 0).flip(dims=[1]).to(torch.uint8).argmax(dim=-1)
    return chosen


def apply_logit_bias(logits: torch.Tensor, biases: list[dict[int, float]]) -> None:
    """Add each row's ``{token id: bias}`` to its logits (in place)."""
    rows, cols, vals = [], [], []
    for i, bias in enumerate(biases):
        for token_id, value in bias.items():
            rows.append(i)
            cols.append(int(token_id))
            vals.append(float(value))
    if rows:
        device = logits.device
        logits.index_put_(
            (host_to_device(torch.tensor(rows), device), host_to_device(torch.tensor(cols), device)),
            host_to_device(torch.tensor(vals, dtype=logits.dtype), device),
            accumulate=True,
        )


def apply_penalties(
    logits: torch.Tensor, params: list[SamplingParams], histories: list[tuple[list[int], list[int]] | None]
) -> None:
    """Repetition (prompt + output), then frequency and presence (output only), in place.

    repetition: ``l / r`` where ``l > 0`` else ``l * r``; frequency: ``l - f * count``;
    presence: ``l - p * (count > 0)``, as in vLLM and OpenAI's documentation.
    """
    num_rows, vocab = logits.shape
    device = logits.device
    output_counts = torch.zeros(num_rows, vocab, dtype=logits.dtype, device=device)  # [N, V]
    seen = torch.zeros(num_rows, vocab, dtype=torch.bool, device=device)  # [N, V] in prompt or output
    for i, history in enumerate(histories):
        if history is None or not params[i].needs_history:
            continue
        prompt_ids, output_ids = history
        if output_ids:
            ids = host_to_device(torch.tensor(output_ids, dtype=torch.long), device)
            output_counts[i].scatter_add_(0, ids, torch.ones(len(output_ids), dtype=logits.dtype, device=device))
        if prompt_ids:
            seen[i, host_to_device(torch.tensor(prompt_ids, dtype=torch.long), device)] = True
    seen |= output_counts > 0

    def column(values: list[float]) -> torch.Tensor:  # [N, 1] on the logits' device
        return host_to_device(torch.tensor(values, dtype=logits.dtype), device).unsqueeze(1)

    rep = column([p.repetition_penalty for p in params])
    penalized = torch.where(logits > 0, logits / rep, logits * rep)
    logits.copy_(torch.where(seen, penalized, logits))
    freq = column([p.frequency_penalty for p in params])
    pres = column([p.presence_penalty for p in params])
    logits -= freq * output_counts + pres * (output_counts > 0).to(logits.dtype)


# Tokens kept by the partial sort (``topk``) that settles most rows' truncation: a full sort of
# 32 x 49k logits costs ~60 ms per step on 2 vCPUs, a top-256 ~3 ms.
CANDIDATES = 256


def truncate(
    logits: torch.Tensor, top_k: list[int], top_p: list[float], min_p: list[float] | None = None
) -> torch.Tensor:
    """Mask (to -inf) everything outside each row's top-k, then its top-p nucleus (of the
    top-k renormalized), and every token whose probability is below ``min_p * p_max``.

    Decided on each row's ``CANDIDATES`` most likely tokens where that is exact: the row's
    top-k fits among them, or their probability mass already reaches its top_p (every later
    token is then outside the nucleus), or the least of them is already below its min_p
    threshold. Other rows (a flat distribution under a high top_p) take the full sort."""
    min_p = min_p if min_p is not None else [0.0] * len(top_k)
    vocab = logits.shape[1]
    if vocab <= CANDIDATES or not logits.is_cpu:  # a GPU sorts every row sooner than it syncs to choose
        return _truncate_sorted(logits, top_k, top_p, min_p)
    k = torch.tensor([kk if 0 < kk < vocab else vocab for kk in top_k])  # [R]
    p = _top_p_tensor(top_p, logits.dtype, logits.device)  # [R]
    m = torch.tensor(min_p, dtype=logits.dtype)  # [R]
    untouched = (k >= vocab) & (p >= 1.0) & (m <= 0.0)
    if bool(untouched.all()):
        return logits
    cand, ids = logits.topk(CANDIDATES, dim=-1)  # [R, C], most likely first
    k_inside, k_none = k <= CANDIDATES, k >= vocab  # else: a top-k beyond the candidates
    mask = torch.arange(CANDIDATES).unsqueeze(0) >= k.clamp(max=CANDIDATES).unsqueeze(1)  # [R, C]
    full = torch.logsumexp(logits, dim=-1)  # [R]
    # Normalizer of the distribution top-p applies to: the top-k when it is inside the
    # candidates, else the whole row (right only without top-k; other rows are not exact).
    norm = torch.where(k_inside, torch.logsumexp(cand.masked_fill(mask, float("-inf")), dim=-1), full)
    probs = torch.exp(cand - norm.unsqueeze(1)).masked_fill(mask, 0.0)  # [R, C]
    use_p = p < 1.0
    mass_before = probs.cumsum(dim=-1) - probs
    mask |= use_p.unsqueeze(1) & (mass_before >= p.unsqueeze(1))
    full_probs = torch.exp(cand - full.unsqueeze(1))  # min_p is relative to the most likely token
    threshold = m.unsqueeze(1) * full_probs[:, :1]
    mask |= full_probs < threshold
    exact = (
        k_inside
        | untouched
        | (k_none & use_p & (probs.sum(dim=-1) >= p))  # the nucleus ends among the candidates
        | ((k_none | ~use_p) & (m > 0.0) & (full_probs[:, -1] < threshold.squeeze(1)))
    )  # min_p cuts there
    out = torch.full_like(logits, float("-inf")).scatter_(1, ids, cand.masked_fill(mask, float("-inf")))
    if bool(untouched.any()):
        rows = untouched.nonzero().squeeze(1)
        out[rows] = logits[rows]
    if not bool(exact.all()):
        rows = (~exact).nonzero().squeeze(1)
        sub = rows.tolist()
        out[rows] = _truncate_sorted(
            logits[rows], [top_k[i] for i in sub], [top_p[i] for i in sub], [min_p[i] for i in sub]
        )
    return out


def _top_p_tensor(top_p: list[float], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``top_p`` in the logits' dtype on their device, at least its smallest normal number: a tiny
    top_p (valid: any p > 0) must not round to 0, which would drop even the most likely token."""
    return host_to_device(torch.tensor(top_p, dtype=dtype).clamp_(min=torch.finfo(dtype).tiny), device)


def _truncate_sorted(logits: torch.Tensor, top_k: list[int], top_p: list[float], min_p: list[float]) -> torch.Tensor:
    """:func:`truncate` by a full sort of each row (the reference, and the fallback)."""
    use_k = any(k > 0 for k in top_k)
    use_p = any(p < 1.0 for p in top_p)
    use_min_p = any(m > 0.0 for m in min_p)
    if not (use_k or use_p or use_min_p):
        return logits
    vocab, device = logits.shape[1], logits.device
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # [R, V]
    mask = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if use_k:
        k = host_to_device(torch.tensor([kk if kk > 0 else vocab for kk in top_k]).clamp(max=vocab), device)
        mask |= torch.arange(vocab, device=device).unsqueeze(0) >= k.unsqueeze(1)
    if use_p:
        p = _top_p_tensor(top_p, logits.dtype, device).unsqueeze(1)
        probs = torch.softmax(sorted_logits.masked_fill(mask, float("-inf")), dim=-1)
        # Drop a token when the mass strictly before it already reaches top_p; the most
        # likely token always survives.
        mass_before = probs.cumsum(dim=-1) - probs
        mask |= (p < 1.0) & (mass_before >= p)  # a row at 1.0 keeps its tail (rounding reaches 1.0)
    if use_min_p:
        # Relative to the most likely token, so it does not matter which tokens are masked.
        m = host_to_device(torch.tensor(min_p, dtype=logits.dtype), device).unsqueeze(1)
        probs = torch.softmax(sorted_logits, dim=-1)
        mask |= probs < m * probs[:, :1]
    sorted_logits = sorted_logits.masked_fill(mask, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def row_logprobs(logits: torch.Tensor, params: list[SamplingParams]) -> RowLogprobs | None:
    """(rows that asked, their log-softmax, top ids, top values, each row's k), or None."""
    asked = [(i, p.logprobs) for i, p in enumerate(params) if p.logprobs is not None]
    if not asked:
        return None
    rows = [i for i, _ in asked]
    ks = [k for _, k in asked]
    logp = torch.log_softmax(logits.index_select(0, host_to_device(torch.tensor(rows), logits.device)), dim=-1)
    k = max(ks)
    top_vals, top_ids = logp.topk(k, dim=-1) if k > 0 else (logp[:, :0], logp[:, :0].long())
    return rows, logp, top_ids.tolist(), top_vals.tolist(), ks


def with_chosen(lp: RowLogprobs | None, logits: torch.Tensor, chosen: torch.Tensor) -> list[TopLogprobs | None] | None:
    """Per row of ``logits``: (logprob of ``chosen[row]``, top alternatives) for the rows that
    asked (``lp`` from :func:`row_logprobs`), None for the others; None when none asked."""
    if lp is None:
        return None
    rows, logp, top_ids, top_vals, ks = lp
    out: list[TopLogprobs | None] = [None] * logits.shape[0]
    idx = host_to_device(torch.tensor(rows), logits.device)
    chosen_lp = logp.gather(1, chosen.index_select(0, idx).unsqueeze(1)).squeeze(1).tolist()
    for j, i in enumerate(rows):
        # -inf alternatives are tokens a structured-output mask ruled out: not alternatives at all.
        top = [(t, v) for t, v in zip(top_ids[j][: ks[j]], top_vals[j][: ks[j]]) if v != float("-inf")]
        out[i] = (chosen_lp[j], top)
    return out
