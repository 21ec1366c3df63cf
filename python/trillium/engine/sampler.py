"""Batched sampling over a step's logits.

Per-request parameters become tensors so that the whole batch is processed by a handful
of torch ops: temperature -> top-k / top-p truncation -> softmax -> sample. Rows with
``temperature == 0`` are greedy (argmax of the raw logits). Sampling uses the
exponential-race trick (``argmax(p / E)`` with ``E ~ Exp(1)``), which draws exactly from
``p`` and lets seeded requests use their own generator without a per-row multinomial.
"""

from __future__ import annotations

import torch

from trillium.protocol import SamplingParams


def sample(
    logits: torch.Tensor,  # [N, V] float32
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> list[int]:
    """One token id per row. ``generators[i]`` (if not None) drives row i's randomness."""
    num_rows = logits.shape[0]
    greedy = logits.argmax(dim=-1)  # [N]
    random_rows = [i for i, p in enumerate(params) if p.temperature > 0.0]
    if not random_rows:
        return greedy.tolist()

    rows = torch.tensor(random_rows, dtype=torch.long)
    sub = logits.index_select(0, rows)  # [R, V]
    temperature = torch.tensor([params[i].temperature for i in random_rows], dtype=sub.dtype)
    sub = sub / temperature.unsqueeze(1)
    sub = _truncate(sub, [params[i].top_k for i in random_rows], [params[i].top_p for i in random_rows])
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
    return out.tolist()


def _truncate(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Mask (to -inf) everything outside each row's top-k and top-p nucleus."""
    use_k = any(k > 0 for k in top_k)
    use_p = any(p < 1.0 for p in top_p)
    if not (use_k or use_p):
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
    sorted_logits = sorted_logits.masked_fill(mask, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)
