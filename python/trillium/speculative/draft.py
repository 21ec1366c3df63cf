"""Draft-model proposer: a second, smaller model with the target's tokenizer drafts each
speculating request's next tokens, k autoregressive steps batched across requests.

It lives on the step thread, owned by the runner (``ModelRunner.drafter``), and runs inside the
step, before the target's verify forward: the scheduler has planned n draft slots per
speculating request (``speculative.draft_slots``) and sends the request's whole context (prompt
and output ids); this fills the slots. It keeps its own paged KV pool (a ``_core.BlockAllocator``
of its own and the draft model's ``allocate_kv_caches``) and, per request, the tokens whose K/V
is in that pool and their blocks. Each step, for each request::

    draft KV   [ t_0 .......... t_{c-1} | stale ............ ]    c: common prefix with the context
    context    [ t_0 .......... t_{c-1} | t_c ...... t_{L-1} ]    t_{L-1}: the last token
    forward 0  feed t_c .. t_{L-1}             -> d_0    (a request's first step: its whole prompt)
    forward j  feed d_{j-1} at position L+j-1  -> d_j    j = 1 .. n-1

Forward j runs every request that still drafts in one batch. The K/V past the common prefix is
rolled back (its blocks freed) the next time the request drafts: that covers rejected drafts and
a preempted request recomputed by the target alike. A request's blocks are freed when it shows up
in ``StepInput.finished_request_ids`` (``release``).

Memory is bounded by the pool: when it is short, the states of requests not drafting in this step
are evicted (least recently drafted first), and if that is not enough a request gets fewer drafts,
or none, this step. A request's catch-up (its missing context) counts against
``max_catch_up_tokens`` per step; past that it is fed in chunks and drafts from a later step.

Draws: a greedy request takes the draft's argmax (verified by ``GREEDY``: no q needed). A sampled
request draws from the draft's distribution processed as the target's is, without penalties:
``logit_bias -> temperature -> top-k / top-p / min-p -> softmax``, q, by the inverse CDF:

* unseeded: at a fresh number; q goes to the verify kernel (``DRAFT_PROBS``: rejection sampling,
  lossless for any q, and the most acceptances a q allows);
* seeded: at the request's own number for that sequence index, ``position_generator(seed, p)``,
  the one the target's draw there uses; verified as a point mass (``POINT_MASS``: accepted iff
  it equals the target's draw). Where q is close to the target's p the two inverse-CDF draws
  coincide (a coupling), so most drafts still pass, and the request's tokens are exactly those
  of decoding without speculation: they do not depend on how many drafts each step had, which
  varies with the batch, the pool and recent acceptance. (Rejection sampling would keep the
  seeded text reproducible only for the same drafts per step.)
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Sequence

import torch

from trillium import _core
from trillium.engine.runner import kv_bytes_per_block
from trillium.engine.sampler import apply_logit_bias, inverse_cdf, truncate
from trillium.engine.verify import position_generator
from trillium.models import LlamaForCausalLM, ModelConfig, load_model
from trillium.ops.attention import AttentionMetadata
from trillium.protocol import ScheduledRequest
from trillium.tokenizer import Tokenizer, load_tokenizer

log = logging.getLogger("trillium.speculative")

Proposal = tuple[list[int], torch.Tensor | None]  # (drafts, their q rows [n, V] fp32 for DRAFT_PROBS)


class _State:
    """What the draft's pool holds for one request: K/V of ``token_ids`` (positions 0..len-1)
    in ``block_ids``."""

    __slots__ = ("block_ids", "token_ids")

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.block_ids: list[int] = []


@dataclasses.dataclass
class _Job:
    """One request's drafting in this step."""

    request: ScheduledRequest
    state: _State
    context_len: int  # L: the request's tokens, the last one included
    num_drafts: int  # drafts to make (0: catch-up only)
    feed: list[int]  # tokens of the next forward
    drafts: list[int] = dataclasses.field(default_factory=list)
    probs: list[torch.Tensor] = dataclasses.field(default_factory=list)  # [V] q per draft (sampled)


class DraftProposer:
    """Drafts for a step's speculating requests. Not thread-safe: the step thread only."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        *,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        max_catch_up_tokens: int = 2048,
        device: str = "cpu",
    ) -> None:
        self.model = model
        self.block_size = block_size
        self.device = device
        self.max_catch_up_tokens = max_catch_up_tokens
        self.max_len = model.config.max_position_embeddings  # positions the draft can take
        self.allocator = _core.BlockAllocator(num_blocks)
        self.kv_caches = model.allocate_kv_caches(num_blocks, block_size, dtype, device)
        self._states: collections.OrderedDict[str, _State] = collections.OrderedDict()  # least recent first
        self.num_short = 0  # requests given fewer drafts than slots (pool full or catching up)

    # ---- accounting ----------------------------------------------------------------------------

    @property
    def num_total_blocks(self) -> int:
        return self.allocator.num_total_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free_blocks

    def cached_tokens(self, request_id: str) -> list[int]:
        """The tokens whose K/V the pool holds for a request ([] if none)."""
        state = self._states.get(request_id)
        return list(state.token_ids) if state is not None else []

    def check_invariants(self) -> None:
        """The allocator's invariants, and every block in use belongs to exactly one request
        whose tokens it covers."""
        self.allocator.check_invariants()
        owned = [b for s in self._states.values() for b in s.block_ids]
        assert len(owned) == len(set(owned)) == self.allocator.num_used_blocks, "draft blocks leaked or shared"
        for request_id, s in self._states.items():
            assert len(s.block_ids) >= self._blocks_for(len(s.token_ids)), f"{request_id}: tokens past its blocks"

    # ---- the executor's calls ------------------------------------------------------------------

    def release(self, request_ids: Sequence[str]) -> None:
        """Free the blocks of requests that ended."""
        for request_id in request_ids:
            state = self._states.pop(request_id, None)
            if state is not None and state.block_ids:
                self.allocator.free(state.block_ids)

    def reset(self) -> None:
        """Forget every request (after a failed step)."""
        self.release(list(self._states))

    @torch.inference_mode()
    def propose(self, requests: Sequence[ScheduledRequest]) -> list[Proposal]:
        """Per request (each with ``num_draft_tokens`` slots and its context in
        ``prompt_token_ids + output_token_ids``): at most that many drafts, and for unseeded
        sampled requests the distributions they were drawn from (else None). Fewer (maybe none)
        when the pool is full or the request is still catching up; none for a request without
        its context."""
        busy = {r.request_id for r in requests}
        budget = self.max_catch_up_tokens
        jobs: list[_Job] = []
        for r in requests:
            job = self._plan(r, busy, budget)
            budget -= len(job.feed)
            self.num_short += job.num_drafts < r.num_draft_tokens
            jobs.append(job)
        active = [job for job in jobs if job.feed]
        while active:
            logits = self._forward(active)  # [drafting rows, V] fp32
            drafting = [job for job in active if job.num_drafts > len(job.drafts)]
            if drafting:
                self._draw(logits, drafting)
            active = [job for job in drafting if len(job.drafts) < job.num_drafts]
            for job in active:
                job.feed = [job.drafts[-1]]
        return [(job.drafts, torch.stack(job.probs) if job.probs else None) for job in jobs]

    # ---- internals -----------------------------------------------------------------------------

    def _plan(self, r: ScheduledRequest, busy: set[str], budget: int) -> _Job:
        """Roll the request's state back to its common prefix with the context and reserve the
        blocks of what this step feeds."""
        state = self._states.pop(r.request_id, None) or _State()
        self._states[r.request_id] = state  # most recently drafted
        if r.prompt_token_ids is None:
            return _Job(r, state, 0, 0, [])  # no context sent: nothing to draft from
        context = r.prompt_token_ids + (r.output_token_ids or [])
        length = len(context)
        assert length == r.start_pos + 1, f"{r.request_id}: context of {length} tokens at start_pos {r.start_pos}"
        self._truncate(
            state, min(_common_prefix(state.token_ids, context), length - 1)
        )  # the last token is always fed: its logits draft d_0
        cut = len(state.token_ids)
        if length - cut > budget:  # catch up by a chunk; draft from a later step
            end = min(cut + max(budget, 0), self.max_len)
            return _Job(r, state, length, 0, context[cut:end] if self._grow(state, end, busy) else [])
        num_drafts = min(r.num_draft_tokens, self.max_len - length + 1)  # the draft's context may be shorter
        while num_drafts > 0 and not self._grow(state, length + num_drafts - 1, busy):
            num_drafts -= 1  # the pool is short: fewer drafts
        return _Job(r, state, length, num_drafts, context[cut:] if num_drafts else [])

    def _forward(self, jobs: list[_Job]) -> torch.Tensor:
        """One draft forward over every job's ``feed``; returns the logits after the last fed
        token of each job that still drafts, in order. Extends each state's tokens."""
        input_ids: list[int] = []
        positions: list[int] = []
        query_lens: list[int] = []
        context_lens: list[int] = []
        for job in jobs:
            start = len(job.state.token_ids)
            input_ids.extend(job.feed)
            positions.extend(range(start, start + len(job.feed)))
            query_lens.append(len(job.feed))
            context_lens.append(start + len(job.feed))
            job.state.token_ids.extend(job.feed)
        meta = AttentionMetadata.build(
            query_lens, context_lens, [job.state.block_ids for job in jobs], self.block_size, self.device
        )
        hidden = self.model(
            torch.tensor(input_ids, dtype=torch.long, device=self.device),
            torch.tensor(positions, dtype=torch.long, device=self.device),
            self.kv_caches,
            meta,
        )  # [T, H]
        ends = meta.query_start_loc[1:].tolist()
        rows = [end - 1 for end, job in zip(ends, jobs) if job.num_drafts > len(job.drafts)]
        if not rows:
            return torch.empty(0)
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        return self.model.compute_logits(hidden.index_select(0, index)).float().cpu()  # [R, V]

    def _draw(self, logits: torch.Tensor, jobs: list[_Job]) -> None:
        """Each job's next draft from its row of ``logits`` (modified in place)."""
        params = [job.request.sampling for job in jobs]
        apply_logit_bias(logits, [p.logit_bias for p in params])
        tokens = logits.argmax(dim=-1).tolist()
        sampled = [i for i, p in enumerate(params) if p.temperature > 0.0]
        if sampled:
            rows = torch.tensor(sampled, dtype=torch.long)
            sub = logits.index_select(0, rows)
            temperature = torch.tensor([params[i].temperature for i in sampled], dtype=sub.dtype)
            sub = truncate(
                sub / temperature.unsqueeze(1),
                [params[i].top_k for i in sampled],
                [params[i].top_p for i in sampled],
                [params[i].min_p for i in sampled],
            )
            probs = torch.softmax(sub, dim=-1)  # [S, V]: q
            generators = [self._generator(jobs[i]) for i in sampled]
            for j, (i, token) in enumerate(zip(sampled, inverse_cdf(probs, generators).tolist())):
                tokens[i] = token
                if generators[j] is None:
                    jobs[i].probs.append(probs[j])  # rejection sampling needs q; a seeded draft is a point mass
        for job, token in zip(jobs, tokens):
            job.drafts.append(token)

    @staticmethod
    def _generator(job: _Job) -> torch.Generator | None:
        """A seeded request's generator for its next draft: the target's for that index."""
        seed = job.request.sampling.seed
        if seed is None:
            return None
        return position_generator(seed, job.context_len + len(job.drafts))

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _truncate(self, state: _State, num_tokens: int) -> None:
        """Keep the first ``num_tokens`` tokens of a state and the blocks they need."""
        del state.token_ids[num_tokens:]
        keep = self._blocks_for(num_tokens)
        if len(state.block_ids) > keep:
            self.allocator.free(state.block_ids[keep:])
            del state.block_ids[keep:]

    def _grow(self, state: _State, num_tokens: int, busy: set[str]) -> bool:
        """Blocks for ``num_tokens`` tokens of ``state``, evicting the states of requests not in
        ``busy`` (least recently drafted first) when the pool is short. False, with no block
        taken, when even that cannot make room."""
        needed = self._blocks_for(num_tokens) - len(state.block_ids)
        if needed <= 0:
            return True
        if needed > self.allocator.num_free_blocks:
            idle = [request_id for request_id in self._states if request_id not in busy]
            for request_id in idle:
                if needed <= self.allocator.num_free_blocks:
                    break
                self.release([request_id])
        if not self.allocator.can_allocate(needed):
            return False
        state.block_ids.extend(self.allocator.allocate(needed))
        return True


def _common_prefix(cached: list[int], context: list[int]) -> int:
    """Length of the common prefix. A mismatch is usually among the last few cached tokens (the
    rejected drafts), so the long head is compared at C speed first."""
    n = min(len(cached), len(context))
    head = max(n - 32, 0)
    start = head if cached[:head] == context[:head] else 0
    for i in range(start, n):
        if cached[i] != context[i]:
            return i
    return n


def check_same_tokenizer(target_path: str, target: Tokenizer, draft_path: str, draft: Tokenizer) -> None:
    """ValueError naming both models and what differs, unless the draft's token ids mean what
    the target's do: the vocabulary size, the bos/eos/pad ids and their strings, the ids that end
    generation, and every token's string."""
    diffs = []
    for name in ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id", "bos_token", "eos_token"):
        ours, theirs = getattr(target, name), getattr(draft, name)
        if ours != theirs:
            diffs.append(f"{name} {ours!r} vs {theirs!r}")
    if target.eos_token_ids != draft.eos_token_ids:
        diffs.append(f"eos_token_ids {sorted(target.eos_token_ids)} vs {sorted(draft.eos_token_ids)}")
    if not diffs:
        ids = list(range(target.vocab_size))
        for i, (ours, theirs) in enumerate(zip(target.convert_ids_to_tokens(ids), draft.convert_ids_to_tokens(ids))):
            if ours != theirs:
                diffs.append(f"token {i} is {ours!r} vs {theirs!r}")
                break
    if diffs:
        raise ValueError(
            f"the draft model {draft_path} does not share the tokenizer of the model {target_path}: {'; '.join(diffs)}"
        )


def load_draft(
    path: str,
    *,
    target_path: str,
    target_tokenizer: Tokenizer,
    target_config: ModelConfig,
    target_num_blocks: int,
    block_size: int,
    kv_cache_gib: float | None,
    max_catch_up_tokens: int,
    dtype: torch.dtype,
    quantized: bool = False,
    activations: int = 0,
    progress: bool = True,
    device: str = "cpu",
) -> DraftProposer:
    """The draft model at ``path`` (GGUF file or HF directory, the target's loaders) with its
    KV pool: ``kv_cache_gib``, or None for as many blocks as the target's pool. Its tokenizer is
    checked first (:func:`check_same_tokenizer`): ValueError before any weight is read."""
    check_same_tokenizer(target_path, target_tokenizer, path, load_tokenizer(path))
    log.info("loading draft model from %s", path)
    model, config = load_model(
        path, dtype=dtype, device=device, progress=progress, quantized=quantized, activations=activations
    )
    if config.vocab_size != target_config.vocab_size:
        raise ValueError(
            f"the draft model {path} has {config.vocab_size} logits per token, the model {target_path} "
            f"{target_config.vocab_size}: their token ids cannot be compared"
        )
    per_block = kv_bytes_per_block(config, block_size, dtype)
    num_blocks = target_num_blocks if kv_cache_gib is None else int(kv_cache_gib * 2**30) // per_block
    if num_blocks < 1:
        raise ValueError(f"draft_kv_cache_gib {kv_cache_gib} holds no block of the draft model ({per_block} bytes)")
    log.info(
        "draft KV cache: %d blocks of %d tokens (%.2f GiB)", num_blocks, block_size, num_blocks * per_block / 2**30
    )
    return DraftProposer(
        model,
        num_blocks=num_blocks,
        block_size=block_size,
        dtype=dtype,
        max_catch_up_tokens=max_catch_up_tokens,
        device=device,
    )
