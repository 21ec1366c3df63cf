"""ModelRunner: executes one step (a :class:`StepInput`) on the model and samples.

Runs in the scheduler's worker thread. It owns the model and the paged KV cache tensors; it
never decides what to run. A seeded request's random number for the token at sequence index p
comes from a generator seeded with (seed, p) (``engine.verify.position_generator``): its text
then depends on neither the batch nor speculation, which verifies several positions at once.

With a draft model (``speculative.draft``, set as :attr:`ModelRunner.drafter`), a speculating
request arrives with placeholder drafts; the drafter fills them in (maybe fewer) before the
forward, and the step's output lists the drafts that were verified.

Prompt logprobs (``ScheduledRequest.prompt_logprob_token_ids``): the rows of a prompt chunk go
through the same output head as sampled rows, then a plain fp32 log-softmax (no sampling
parameter or grammar mask applies), a bounded number of rows at a time; only each row's
logprob of the next prompt token and its top k leave the step.

On a GPU (``device="cuda"``) the step's metadata is built on the host and copied asynchronously,
the logits stay on the GPU for the grammar mask and the sampler, and the host waits once, for
the sampled token ids (or the verify kernel's accepted counts and tokens). With
:attr:`ModelRunner.graphs` set, a step whose requests all bring the same captured number of
tokens (decode: 1, verify: k + 1) replays a CUDA graph (``engine.cuda_graphs``); others run eagerly.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Protocol

import msgspec
import torch

from trillium.engine.cuda_graphs import CudaGraphSteps
from trillium.engine.sampler import TopLogprobs, sample
from trillium.engine.verify import position_generator, verify_drafts
from trillium.models import LlamaForCausalLM, ModelConfig
from trillium.ops.attention import AttentionMetadata, host_to_device
from trillium.protocol import ScheduledRequest, StepInput, StepOutput

# Prompt rows whose logits are taken at once: bounds the [rows, V] fp32 temporaries (a whole
# 2048-token chunk of a 49k vocabulary would be 400 MB a copy).
PROMPT_LOGPROBS_ROWS = 128


def kv_bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block takes across all layers, K and V."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_layers * block_size * config.num_kv_heads * config.head_dim * elem


class Drafter(Protocol):
    """Fills a step's draft slots before the verify forward (``speculative.draft.DraftProposer``)."""

    def propose(self, requests: Sequence[ScheduledRequest]) -> list[tuple[list[int], torch.Tensor | None]]:
        """Per request: at most ``num_draft_tokens`` drafts, and the [n, V] distributions they
        were drawn from (None when drawn greedily)."""
        ...

    def release(self, request_ids: Sequence[str]) -> None: ...

    def reset(self) -> None: ...


class ModelRunner:
    """Turns step inputs into sampled tokens. Not thread-safe: one step at a time."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        config: ModelConfig,
        *,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: str = "cpu",
        kv_dtype: torch.dtype | None = None,
    ) -> None:
        """``dtype``: the model's; ``kv_dtype``: the KV pool's (None: the model's)."""
        self.model = model
        self.config = config
        self.block_size = block_size
        self.device = device
        self.kv_caches = model.allocate_kv_caches(num_blocks, block_size, kv_dtype or dtype, device)
        self.drafter: Drafter | None = None  # method draft: fills the placeholder drafts
        self.graphs: CudaGraphSteps | None = None  # captured decode/verify steps (CUDA only)

    def reset(self) -> None:
        """Forget every request (after a failure, when the scheduler rebuilds the KV pool empty).
        A block is always written before it is read, and the rebuilt prefix cache holds nothing,
        so no stale K/V can reach an attention; the drafter drops its requests' state."""
        if self.drafter is not None:
            self.drafter.reset()

    @torch.inference_mode()
    def execute(self, step_input: StepInput) -> StepOutput:
        requests = step_input.requests
        draft_token_ids: list[list[int] | None] | None = None
        draft_probs: dict[int, torch.Tensor] = {}
        if self.drafter is not None:
            self.drafter.release(step_input.finished_request_ids)
            requests, draft_token_ids, draft_probs = self._fill_drafts(requests)
        if not requests:
            return StepOutput([])

        input_ids: list[int] = []
        positions: list[int] = []
        query_lens: list[int] = []
        context_lens: list[int] = []
        for r in requests:
            n = len(r.token_ids)
            input_ids.extend(r.token_ids)
            positions.extend(range(r.start_pos, r.start_pos + n))
            query_lens.append(n)
            context_lens.append(r.start_pos + n)
        block_tables = [r.block_ids for r in requests]
        shape = self.graphs.match(query_lens) if self.graphs is not None else None
        if any(r.prompt_logprob_token_ids for r in requests):
            shape = None  # prompt logprobs read the hidden states, which a graph does not keep
        step_logits: torch.Tensor | None = None  # [T, V] fp32 when a graph ran the step
        hidden = torch.empty(0)
        if shape is not None:
            assert self.graphs is not None
            step_logits = self.graphs.run(shape, input_ids, positions, context_lens, block_tables)
        else:
            meta = AttentionMetadata.build(query_lens, context_lens, block_tables, self.block_size, self.device)
            hidden = self.model(
                host_to_device(torch.tensor(input_ids, dtype=torch.long), self.device),
                host_to_device(torch.tensor(positions, dtype=torch.long), self.device),
                self.kv_caches,
                meta,
            )  # [T, hidden]
        starts = list(itertools.accumulate(query_lens, initial=0))  # each request's first row, then the end

        sample_rows = [i for i, r in enumerate(requests) if r.sample and not r.num_draft_tokens]
        draft_rows = [i for i, r in enumerate(requests) if r.num_draft_tokens]
        sampled = [-1] * len(requests)
        logprobs: list[list[TopLogprobs] | None] | None = None
        num_accepted: list[int] | None = None
        # Logits rows: the last token of each sampling request, then every position of each
        # speculating request (its last token and drafts: the model's choice after each).
        ends = starts[1:]  # end of each request's new tokens
        rows = [ends[i] - 1 for i in sample_rows]
        for i in draft_rows:
            rows.extend(range(ends[i] - 1 - requests[i].num_draft_tokens, ends[i]))
        all_logits = self._logits(hidden, step_logits, rows)  # [S + sum(n_i + 1), V] on the model's device
        if step_input.bitmask is not None and all_logits is not None:
            # Structured output: disallowed tokens -> -inf before any sampling parameter, so
            # bias, penalties, temperature, top-p and logprobs all see the masked distribution;
            # a speculating request's rows take the masks of their positions.
            spans = [(i, 1) for i in sample_rows] + [(i, requests[i].num_draft_tokens + 1) for i in draft_rows]
            step_input.bitmask.apply(all_logits, spans)
        if draft_rows:
            assert all_logits is not None
            verified = verify_drafts(
                all_logits[len(sample_rows) :],
                [requests[i] for i in draft_rows],
                [draft_probs.get(i) for i in draft_rows] if draft_probs else None,
            )
            num_accepted = [0] * len(requests)
            for i, v in zip(draft_rows, verified):
                num_accepted[i], sampled[i] = v.num_accepted, v.token_id
                if v.logprobs is not None:
                    logprobs = logprobs or [None] * len(requests)
                    logprobs[i] = v.logprobs
        if sample_rows:
            assert all_logits is not None
            logits = all_logits[: len(sample_rows)]
            params = [requests[i].sampling for i in sample_rows]
            generators = [_generator(requests[i]) for i in sample_rows]
            histories = [_history(requests[i]) for i in sample_rows]
            result = sample(logits, params, generators, histories)
            for i, token_id in zip(sample_rows, result.token_ids):
                sampled[i] = token_id
            if result.logprobs is not None:
                logprobs = logprobs or [None] * len(requests)
                for i, lp in zip(sample_rows, result.logprobs):
                    logprobs[i] = None if lp is None else [lp]
        prompt_logprobs = self._prompt_logprobs(hidden, requests, starts[:-1])
        return StepOutput(sampled, logprobs, num_accepted, draft_token_ids, prompt_logprobs)

    def _logits(self, hidden: torch.Tensor, step_logits: torch.Tensor | None, rows: list[int]) -> torch.Tensor | None:
        """fp32 logits of ``rows`` (None for none): from the graph's output when a graph ran the
        step, else through the output head; on the CPU for a CPU model, else on its device."""
        if not rows:
            return None
        if step_logits is not None and rows == list(range(step_logits.shape[0])):
            return step_logits
        index = host_to_device(torch.tensor(rows, dtype=torch.long), self.device)
        if step_logits is not None:
            return step_logits.index_select(0, index)
        logits = self.model.compute_logits(hidden.index_select(0, index)).float()
        return logits.cpu() if self.device == "cpu" else logits

    def _prompt_logprobs(
        self,
        hidden: torch.Tensor,  # [T, hidden]
        requests: Sequence[ScheduledRequest],
        starts: list[int],  # each request's first row in ``hidden``
    ) -> list[list[TopLogprobs] | None] | None:
        """Per request, (logprob, top k) of each token of its ``prompt_logprob_token_ids``, the
        token its row predicts: None for requests that asked none, None when none asked."""
        asked = [i for i, r in enumerate(requests) if r.prompt_logprob_token_ids]
        if not asked:
            return None
        out: list[list[TopLogprobs] | None] = [None] * len(requests)
        for i in asked:
            targets = requests[i].prompt_logprob_token_ids
            assert targets is not None
            k = requests[i].sampling.prompt_logprobs or 0
            entries: list[TopLogprobs] = []
            for a in range(0, len(targets), PROMPT_LOGPROBS_ROWS):
                chunk = targets[a : a + PROMPT_LOGPROBS_ROWS]
                rows = hidden[starts[i] + a : starts[i] + a + len(chunk)]
                logp = torch.log_softmax(self.model.compute_logits(rows).float(), dim=-1)  # [n, V]
                ids = torch.tensor(chunk, dtype=torch.long, device=logp.device)
                chosen = logp.gather(1, ids.unsqueeze(1)).squeeze(1).tolist()
                if k > 0:
                    top_vals, top_ids = logp.topk(k, dim=-1)  # [n, k]
                    tops = [list(zip(t, v)) for t, v in zip(top_ids.tolist(), top_vals.tolist())]
                else:
                    tops = [[] for _ in chunk]
                entries.extend(zip(chosen, tops))
            out[i] = entries
        return out

    def _fill_drafts(
        self, requests: list[ScheduledRequest]
    ) -> tuple[list[ScheduledRequest], list[list[int] | None] | None, dict[int, torch.Tensor]]:
        """The requests with their placeholder drafts replaced by the drafter's (a request the
        drafter gave none decodes one token), the drafts per request (None: not speculating),
        and the draft distributions of sampled requests by request index."""
        speculating = [i for i, r in enumerate(requests) if r.num_draft_tokens]
        if not speculating or self.drafter is None:
            return requests, None, {}
        requests = list(requests)
        drafts: list[list[int] | None] = [None] * len(requests)
        probs: dict[int, torch.Tensor] = {}
        for i, (tokens, q) in zip(speculating, self.drafter.propose([requests[i] for i in speculating])):
            r = requests[i]
            requests[i] = msgspec.structs.replace(r, token_ids=r.token_ids[:1] + tokens, num_draft_tokens=len(tokens))
            drafts[i] = tokens
            if q is not None and tokens:
                probs[i] = q
        return requests, drafts, probs


def _generator(request: ScheduledRequest) -> torch.Generator | None:
    """The generator of a seeded sampling request's token: keyed by the seed and the token's
    sequence index, so the draw ignores the batch and whether speculation ran."""
    seed = request.sampling.seed
    if seed is None or request.sampling.temperature == 0.0:
        return None
    return position_generator(seed, request.start_pos + len(request.token_ids))


def _history(request: ScheduledRequest) -> tuple[list[int], list[int]] | None:
    if request.prompt_token_ids is None:
        return None
    return request.prompt_token_ids, request.output_token_ids or []
