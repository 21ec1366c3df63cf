"""Scheduler <-> executor messages: one step's plan and its result; and what a step came to for
one request (``Verdict``)."""

from __future__ import annotations

from typing import Any

import msgspec

from trillium.protocol.messages import FinishReason, SamplingParams


class ScheduledRequest(msgspec.Struct, gc=False, kw_only=True):
    """One request's share of a step.

    The request already has ``start_pos`` tokens in KV; this step computes ``token_ids`` at
    positions ``start_pos .. start_pos + len(token_ids) - 1`` and stores their K/V into the
    slots given by ``block_ids`` (the whole block table, long enough for those positions)::

        tokens:  [0 ........ start_pos) [start_pos ...... start_pos+len(token_ids))
                  cached in KV            computed now; sample after the last one if ``sample``

    A speculating request (``num_draft_tokens`` = n > 0) is decoding: its ``token_ids`` are its
    last token followed by n draft tokens, and the executor verifies the drafts against the
    model's own choice at each of the n + 1 positions (``StepOutput.num_accepted_drafts``)::

        token_ids:  [ last | d_0 ... d_{n-1} ]     sample after each of the n + 1
    """

    request_id: str
    token_ids: list[int]
    start_pos: int
    block_ids: list[int]
    sample: bool
    sampling: SamplingParams
    # Only when ``sample`` and the params need history (penalties), or the drafts are a draft
    # model's to fill (``speculative.draft``): prompt and output ids so far.
    prompt_token_ids: list[int] | None = None
    output_token_ids: list[int] | None = None
    num_draft_tokens: int = 0
    # Prompt logprobs (``sampling.prompt_logprobs``) still owed: the m prompt tokens this step's
    # first m rows predict (rows start_pos .. start_pos+m-1 predict tokens start_pos+1 .. +m; the
    # row of the last prompt token predicts the output, so it is never one of them). None: none.
    prompt_logprob_token_ids: list[int] | None = None


class StepInput(msgspec.Struct, gc=False, kw_only=True):
    """Everything the executor needs for one forward pass; owned by the executor until it returns."""

    requests: list[ScheduledRequest]
    finished_request_ids: list[str] = msgspec.field(default_factory=list)
    # structured.StepBitmask when some sampling row is constrained: its masks are filled in the
    # grammar thread while the model runs; the executor applies them before sampling.
    bitmask: Any = None


class StepOutput(msgspec.Struct, gc=False):
    """One sampled token per scheduled request, ``-1`` where ``sample`` was false.

    ``logprobs[i]`` is set for requests that sampled and asked for logprobs: one (chosen token's
    logprob, [(token id, logprob)] top alternatives best first) per new token (the accepted
    drafts, then the sampled token).

    ``num_accepted_drafts[i]`` (None when no request speculated): how many of request i's draft
    tokens the model accepted, a; its new tokens are those a drafts, then ``sampled_token_ids[i]``.

    ``draft_token_ids[i]`` (None when the step's drafts are the scheduler's own): the drafts a
    draft model put in request i's placeholder slots, the ones verified; maybe fewer than the
    slots (its KV pool was full), maybe none (then the request decoded one token).

    ``prompt_logprobs[i]`` (None when no request asked): for request i's
    ``prompt_logprob_token_ids``, in order, (that token's logprob, [(token id, logprob)] top
    ``sampling.prompt_logprobs`` best first), from the model's raw log-softmax.
    """

    sampled_token_ids: list[int]
    logprobs: list[list[tuple[float, list[tuple[int, float]]]] | None] | None = None
    num_accepted_drafts: list[int] | None = None
    draft_token_ids: list[list[int] | None] | None = None
    prompt_logprobs: list[list[tuple[float, list[tuple[int, float]]]] | None] | None = None


class Verdict(msgspec.Struct, gc=False, kw_only=True):
    """What one request's step came to, for the scheduler to apply: from a constrained request's
    structured-output controller (``structured.controller``), or the scheduler's own for an
    unconstrained one.

    The output list the step's tokens were appended to is already as it stands; the verdict says
    what follows from it. ``num_unchanged``: the fewest output tokens the output was cut back to
    during the step (tokens taken back by a failed check, a closing, a witness), or its length
    after the step's tokens if nothing was taken back -- K/V is kept only for the positions
    before ``prompt + num_unchanged - 1``. ``new_token_ids`` / ``logprobs``: what the client gets
    now (a checked output holds back what a check may still take back); ``finish_reason`` and
    ``error`` end the request; ``closed_early`` / ``unsatisfied_check``: see ``TokenDelta``;
    ``forget_drafts``: tokens the proposer indexed were taken back."""

    new_token_ids: list[int]
    num_unchanged: int
    finish_reason: FinishReason | None = None
    error: str | None = None
    logprobs: list[tuple[float, list[tuple[int, float]]]] | None = None
    closed_early: bool = False
    unsatisfied_check: str | None = None
    forget_drafts: bool = False
