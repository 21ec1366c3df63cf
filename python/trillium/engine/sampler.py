"""Batched sampling over a step's logits.

Per-request parameters become tensors so that the whole batch is processed by a handful
of torch ops, in this order::

    logit_bias -> repetition / frequency / presence penalties -> [logprobs] -> temperature
      -> top-k / top-p / min-p truncation -> softmax -> sample

Logprobs are the log-softmax of the logits after bias and penalties, before temperature and
truncation (the model's distribution as the request shaped it). Rows with ``temperature == 0``
are greedy (argmax after bias and penalties). Sampling uses the exponential-race trick
(``argmax(p / E)`` with ``E ~ Exp(1)``), which draws exactly from ``p`` and lets seeded
requests use their own generator without a per-row multinomial.
"""

from __future__ import annotations

import dataclasses

import torch

from trillium.protocol import SamplingParams

TopLogprobs = tuple[float, list[tuple[int, float]]]  # (chosen logprob, [(token id, logprob)])


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
    logprobs = _logprobs(logits, params)

    greedy = logits.argmax(dim=-1)  # [N]
    random_rows = [i for i, p in enumerate(params) if p.temperature > 0.0]
    if not random_rows:
        return SampleResult(greedy.tolist(), _with_chosen(logprobs, logits, greedy))

    rows = torch.tensor(random_rows, dtype=torch.long)
    sub = logits.index_select(0, rows)  # [R, V]
    temperature = torch.tensor([params[i].temperature for i in random_rows], dtype=sub.dtype)
    sub = sub / temperature.unsqueeze(1)
    sub = truncate(sub, [params[i].top_k for i in random_rows], [params[i].top_p for i in random_rows],
                   [params[i].min_p for i in random_rows])
    probs = torch.softmax(sub, dim=-1)  # [R, V]

    noise = torch.empty_like(probs)
    unseeded = [j for j, i in enumerate(random_rows) if generators[i] is None]
    if unseeded:
        noise[unseeded] = torch.empty(len(unseeded), probs.shape[1]).exponential_()
    for j, i in enumerate(random_rows):
        if generators[i] is not None:
            noise[j].exponential_(generator=generators[i])
    chosen = (probs / noise).argmax(dim=-1)  # [R]

    out = greedy.clone()
    out[rows] = chosen
    assert out.shape[0] == num_rows
    return SampleResult(out.tolist(), _with_chosen(logprobs, logits, out))


def apply_logit_bias(logits: torch.Tensor, biases: list[dict[int, float]]) -> None:
    """Add each row's ``{token id: bias}`` to its logits (in place)."""
    rows, cols, vals = [], [], []
    for i, bias in enumerate(biases):
        for token_id, value in bias.items():
            rows.append(i)
            cols.append(int(token_id))
            vals.append(float(value))
    if rows:
        logits.index_put_((torch.tensor(rows), torch.tensor(cols)), torch.tensor(vals, dtype=logits.dtype),
                          accumulate=True)


def apply_penalties(logits: torch.Tensor, params: list[SamplingParams],
                    histories: list[tuple[list[int], list[int]] | None]) -> None:
    """Repetition (prompt + output), then frequency and presence (output only), in place.

    repetition: ``l / r`` where ``l > 0`` else ``l * r``; frequency: ``l - f * count``;
    presence: ``l - p * (count > 0)``, as in vLLM and OpenAI's documentation.
    """
    num_rows, vocab = logits.shape
    output_counts = torch.zeros(num_rows, vocab, dtype=logits.dtype)  # [N, V]
    seen = torch.zeros(num_rows, vocab, dtype=torch.bool)  # [N, V] in prompt or output
    for i, history in enumerate(histories):
        if history is None or not params[i].needs_history:
            continue
        prompt_ids, output_ids = history
        if output_ids:
            ids = torch.tensor(output_ids, dtype=torch.long)
            output_counts[i].scatter_add_(0, ids, torch.ones(len(output_ids), dtype=logits.dtype))
        if prompt_ids:
            seen[i, torch.tensor(prompt_ids, dtype=torch.long)] = True
    seen |= output_counts > 0
    rep = torch.tensor([p.repetition_penalty for p in params], dtype=logits.dtype).unsqueeze(1)  # [N, 1]
    penalized = torch.where(logits > 0, logits / rep, logits * rep)
    logits.copy_(torch.where(seen, penalized, logits))
    freq = torch.tensor([p.frequency_penalty for p in params], dtype=logits.dtype).unsqueeze(1)
    pres = torch.tensor([p.presence_penalty for p in params], dtype=logits.dtype).unsqueeze(1)
    logits -= freq * output_counts + pres * (output_counts > 0).to(logits.dtype)


def truncate(logits: torch.Tensor, top_k: list[int], top_p: list[float],
             min_p: list[float] | None = None) -> torch.Tensor:
    """Mask (to -inf) everything outside each row's top-k, then its top-p nucleus (of the
    top-k renormalized), and every token whose probability is below ``min_p * p_max``."""
    min_p = min_p if min_p is not None else [0.0] * len(top_k)
    use_k = any(k > 0 for k in top_k)
    use_p = any(p < 1.0 for p in top_p)
    use_min_p = any(m > 0.0 for m in min_p)
    if not (use_k or use_p or use_min_p):
        return logits
    vocab = logits.shape[1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # [R, V]
    mask = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if use_k:
        k = torch.tensor([kk if kk > 0 else vocab for kk in top_k]).clamp(max=vocab)
        mask |= torch.arange(vocab).unsqueeze(0) >= k.unsqueeze(1)
    if use_p:
        p = torch.tensor(top_p, dtype=logits.dtype).unsqueeze(1)
        probs = torch.softmax(sorted_logits.masked_fill(mask, float("-inf")), dim=-1)
        # Drop a token when the mass strictly before it already reaches top_p; the most
        # likely token always survives.
        mass_before = probs.cumsum(dim=-1) - probs
        mask |= mass_before >= p
    if use_min_p:
        # Relative to the most likely token, so it does not matter which tokens are masked.
        m = torch.tensor(min_p, dtype=logits.dtype).unsqueeze(1)
        probs = torch.softmax(sorted_logits, dim=-1)
        mask |= probs < m * probs[:, :1]
    sorted_logits = sorted_logits.masked_fill(mask, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def _logprobs(logits: torch.Tensor, params: list[SamplingParams]):
    """(log-softmax rows, top ids, top values) for rows that asked, or None."""
    rows = [i for i, p in enumerate(params) if p.logprobs is not None]
    if not rows:
        return None
    logp = torch.log_softmax(logits.index_select(0, torch.tensor(rows)), dim=-1)  # [L, V]
    k = max(params[i].logprobs for i in rows)
    top_vals, top_ids = logp.topk(k, dim=-1) if k > 0 else (logp[:, :0], logp[:, :0].long())
    return rows, logp, top_ids.tolist(), top_vals.tolist(), [params[i].logprobs for i in rows]


def _with_chosen(lp, logits: torch.Tensor, chosen: torch.Tensor) -> list[TopLogprobs | None] | None:
    if lp is None:
        return None
    rows, logp, top_ids, top_vals, ks = lp
    out: list[TopLogprobs | None] = [None] * logits.shape[0]
    idx = torch.tensor(rows)
    chosen_lp = logp.gather(1, chosen.index_select(0, idx).unsqueeze(1)).squeeze(1).tolist()
    for j, i in enumerate(rows):
        # -inf alternatives are tokens a structured-output mask ruled out: not alternatives at all.
        top = [(t, v) for t, v in zip(top_ids[j][: ks[j]], top_vals[j][: ks[j]]) if v != float("-inf")]
        out[i] = (chosen_lp[j], top)
    return out
