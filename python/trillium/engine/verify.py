"""Verify a step's draft tokens: the model's own choice at each position against the drafts.

A speculating request's rows are its last token's and each draft's (row j predicts the token
after drafts 0..j-1). Each row is processed exactly as the sampler processes a row when the
request decodes one token at a time, with drafts 0..j-1 taken as already output::

    [grammar mask at position j] -> logit_bias -> penalties (history + drafts 0..j-1)
      -> [logprobs] -> [greedy: argmax] | temperature -> top-k / top-p / min-p -> softmax

(the grammar mask is applied by the runner, from the grammar thread's per-position masks). The
core's kernel (``ops.spec_verify``) then accepts a draft while it equals that choice: the argmax
(GREEDY), or the inverse-CDF draw at the request's number for that position (POINT_MASS: an
n-gram draft is a point mass). A seeded request's number for sequence index p comes from
:func:`position_generator`, exactly as when it decodes without speculation, so its tokens are
the same either way; an unseeded one draws fresh numbers (same distribution). A draft model's
sampled drafts come with the distributions they were drawn from and are verified by rejection
sampling (DRAFT_PROBS: lossless; the same numbers, plus one keyed by ``_RESIDUAL_SALT`` for the
residual draw, so a seeded request is reproducible, though not equal to plain decoding).
Logprobs of the kept tokens are read from the same rows, so they equal those of
one-token-at-a-time decoding.
"""

from __future__ import annotations

import dataclasses

import torch

from trillium.engine.sampler import TopLogprobs, apply_logit_bias, apply_penalties, row_logprobs, truncate, with_chosen
from trillium.ops.attention import host_to_device
from trillium.ops.spec_verify import VerifyMode, spec_verify
from trillium.protocol import ScheduledRequest

_MIX = 0x9E3779B97F4A7C15  # 2^64 / golden ratio (splitmix64's increment)
_MASK = (1 << 64) - 1
_RESIDUAL_SALT = 0xBB67AE8584CAA73B  # SHA-512's second IV word: DRAFT_PROBS residual draws


def position_generator(seed: int, position: int) -> torch.Generator:
    """A generator for the token at sequence index ``position`` of a request seeded ``seed``:
    splitmix64 of (seed, position), so neighbouring seeds and positions get unrelated streams."""
    z = (seed * _MIX + position * 0xBF58476D1CE4E5B9 + _MIX) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return torch.Generator().manual_seed(z ^ (z >> 31))


@dataclasses.dataclass
class Verified:
    """One speculating request's result: ``num_accepted`` drafts kept, then ``token_id`` (the
    model's choice after them); ``logprobs`` (when asked) has one entry per kept token."""

    num_accepted: int
    token_id: int
    logprobs: list[TopLogprobs] | None = None


def verify_drafts(
    logits: torch.Tensor, requests: list[ScheduledRequest], draft_probs: list[torch.Tensor | None] | None = None
) -> list[Verified]:
    """Verify each speculating request's drafts.

    ``logits`` [sum(n_i + 1), V] holds request i's n_i + 1 rows in order (its last token, then
    each draft), already masked by any grammar; it is modified in place. Requests with penalties
    must carry their history (``prompt_token_ids``, ``output_token_ids``). ``draft_probs[i]``
    ([n_i, V], for a sampled request): the distributions its drafts were drawn from.
    """
    counts = [r.num_draft_tokens for r in requests]
    drafts_of = [r.token_ids[1:] for r in requests]
    params = [r.sampling for r, n in zip(requests, counts) for _ in range(n + 1)]
    apply_logit_bias(logits, [p.logit_bias for p in params])
    if any(r.sampling.needs_history for r in requests):
        histories: list[tuple[list[int], list[int]] | None] = []
        for r, n, drafts in zip(requests, counts, drafts_of):
            if not r.sampling.needs_history:
                histories.extend([None] * (n + 1))
                continue
            assert r.prompt_token_ids is not None, "penalties need the token history"
            output = r.output_token_ids or []
            histories.extend((r.prompt_token_ids, output + drafts[:j]) for j in range(n + 1))
        apply_penalties(logits, params, histories)
    logprobs = row_logprobs(logits, params)

    k = max(counts)
    vocab, device = logits.shape[1], logits.device
    target = logits.new_zeros((len(requests), k + 1, vocab))
    draft_tokens = torch.zeros(len(requests), k, dtype=torch.int64)
    uniforms = torch.zeros(len(requests), k + 1, dtype=torch.float64)
    residual = torch.zeros(len(requests), dtype=torch.float64)
    q = logits.new_zeros((len(requests), k, vocab)) if draft_probs and any(p is not None for p in draft_probs) else None
    modes = []
    start = 0
    for i, (r, n, drafts) in enumerate(zip(requests, counts, drafts_of)):
        rows = logits[start : start + n + 1]
        start += n + 1
        draft_tokens[i, :n] = torch.tensor(drafts, dtype=torch.int64)
        sampling = r.sampling
        if sampling.temperature == 0.0:
            modes.append(VerifyMode.GREEDY)
            target[i, : n + 1] = rows
            continue
        probs = draft_probs[i] if draft_probs else None
        modes.append(VerifyMode.POINT_MASS if probs is None else VerifyMode.DRAFT_PROBS)
        span = n + 1
        # A tensor divisor, as in the sampler: dividing by a Python float may round differently.
        scaled = rows / host_to_device(torch.tensor([sampling.temperature], dtype=rows.dtype), device).unsqueeze(1)
        scaled = truncate(scaled, [sampling.top_k] * span, [sampling.top_p] * span, [sampling.min_p] * span)
        target[i, :span] = torch.softmax(scaled, dim=-1)
        first = r.start_pos + 1  # sequence index of the token row 0 predicts
        if sampling.seed is None:
            uniforms[i, :span] = torch.rand(span, dtype=torch.float64)
        else:
            for j in range(span):
                uniforms[i, j] = torch.rand(
                    1, generator=position_generator(sampling.seed, first + j), dtype=torch.float64
                )
        if probs is not None:
            assert q is not None
            q[i, :n] = probs.to(device)
            generator = None if sampling.seed is None else position_generator(sampling.seed ^ _RESIDUAL_SALT, first)
            residual[i] = torch.rand(1, generator=generator, dtype=torch.float64)
    sampled = any(m != VerifyMode.GREEDY for m in modes)
    # Drafts and uniforms are made on the host (the requests' generators are CPU generators) and
    # copied asynchronously; on a GPU the kernel runs there and the host waits once, for its result.
    result = spec_verify(
        target,
        host_to_device(draft_tokens, device),
        counts,
        modes,
        host_to_device(uniforms, device) if sampled else None,
        host_to_device(residual, device) if q is not None else None,
        q,
    )
    accepted = result.num_accepted.tolist()
    tokens = result.output_tokens.tolist()
    verified = [Verified(a, row[a]) for a, row in zip(accepted, tokens)]
    if logprobs is not None:
        # Row j's chosen token is draft j while j < a, then the model's token; later rows' are
        # never reported (any id will do).
        chosen = [row[j] if j <= a else 0 for a, row, n in zip(accepted, tokens, counts) for j in range(n + 1)]
        per_row = with_chosen(logprobs, logits, host_to_device(torch.tensor(chosen, dtype=torch.int64), device))
        assert per_row is not None
        start = 0
        for v, r, n in zip(verified, requests, counts):
            if r.sampling.logprobs is not None:
                kept = per_row[start : start + v.num_accepted + 1]
                v.logprobs = [lp for lp in kept if lp is not None]
            start += n + 1
    return verified
