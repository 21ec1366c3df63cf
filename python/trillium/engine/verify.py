"""Verify a step's draft tokens: the model's own choice at each position against the drafts.

Speculating requests (``scheduler.policy`` picks them: no penalties, grammar or logprobs) are
greedy or sampled. Position j's row sees the request's last token and drafts 0..j-1 as already
output; the row is processed as the sampler would process it when decoding one token at a time:

    logit_bias -> [greedy: argmax]  |  temperature -> top-k / top-p / min-p -> softmax -> draw

and the core's kernel (``ops.spec_verify``) accepts a draft while it equals that choice: the
argmax (GREEDY), or the inverse-CDF draw at the request's number for that position
(POINT_MASS: an n-gram draft is a point mass). A seeded request's number for sequence index p
comes from :func:`position_generator`, exactly as when it decodes without speculation, so its
tokens are the same either way; an unseeded one draws fresh numbers (same distribution).
Penalty requests do not speculate: a penalty at position j would need drafts 0..j-1 in its
history.
"""

from __future__ import annotations

import torch

from trillium.engine.sampler import apply_logit_bias, truncate
from trillium.ops.spec_verify import VerifyMode, spec_verify
from trillium.protocol import ScheduledRequest

_MIX = 0x9E3779B97F4A7C15  # 2^64 / golden ratio (splitmix64's increment)
_MASK = (1 << 64) - 1


def position_generator(seed: int, position: int) -> torch.Generator:
    """A generator for the token at sequence index ``position`` of a request seeded ``seed``:
    splitmix64 of (seed, position), so neighbouring seeds and positions get unrelated streams."""
    z = (seed * _MIX + position * 0xBF58476D1CE4E5B9 + _MIX) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return torch.Generator().manual_seed(z ^ (z >> 31))


def verify_drafts(logits: torch.Tensor, requests: list[ScheduledRequest]) -> list[tuple[int, int]]:
    """``(number of drafts accepted, next token)`` per speculating request.

    ``logits`` [sum(n_i + 1), V] holds request i's n_i + 1 positions in order (its last token,
    then each draft); it is modified in place.
    """
    counts = [r.num_draft_tokens for r in requests]
    apply_logit_bias(logits, [r.sampling.logit_bias for r in requests for _ in range(r.num_draft_tokens + 1)])
    k = max(counts)
    vocab = logits.shape[1]
    target = logits.new_zeros((len(requests), k + 1, vocab))
    drafts = torch.zeros(len(requests), k, dtype=torch.int64)
    uniforms = torch.zeros(len(requests), k + 1, dtype=torch.float64)
    modes = []
    start = 0
    for i, (r, n) in enumerate(zip(requests, counts)):
        rows = logits[start : start + n + 1]
        start += n + 1
        drafts[i, :n] = torch.tensor(r.token_ids[1:], dtype=torch.int64)
        sampling = r.sampling
        if sampling.temperature == 0.0:
            modes.append(VerifyMode.GREEDY)
            target[i, : n + 1] = rows
            continue
        modes.append(VerifyMode.POINT_MASS)
        scaled = rows / torch.tensor([sampling.temperature], dtype=rows.dtype).unsqueeze(1)
        span = n + 1
        rows = truncate(scaled, [sampling.top_k] * span, [sampling.top_p] * span, [sampling.min_p] * span)
        target[i, : n + 1] = torch.softmax(rows, dim=-1)
        first = r.start_pos + 1  # sequence index of the token row 0 predicts
        if sampling.seed is None:
            uniforms[i, : n + 1] = torch.rand(n + 1, dtype=torch.float64)
        else:
            for j in range(n + 1):
                uniforms[i, j] = torch.rand(
                    1, generator=position_generator(sampling.seed, first + j), dtype=torch.float64
                )
    sampled = any(m == VerifyMode.POINT_MASS for m in modes)
    result = spec_verify(target, drafts, counts, modes, uniforms if sampled else None)
    accepted = result.num_accepted.tolist()
    tokens = result.output_tokens.tolist()
    return [(a, row[a]) for a, row in zip(accepted, tokens)]
