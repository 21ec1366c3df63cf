"""ModelRunner: executes one step (a :class:`StepInput`) on the model and samples.

Runs in the scheduler's worker thread. It owns the model, the paged KV cache tensors and
the per-request sampling generators; it never decides what to run.
"""

from __future__ import annotations

import torch

from trillium.engine.sampler import TopLogprobs, sample
from trillium.models import LlamaForCausalLM, ModelConfig
from trillium.ops.attention import AttentionMetadata
from trillium.protocol import ScheduledRequest, StepInput, StepOutput


def kv_bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block takes across all layers, K and V."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_layers * block_size * config.num_kv_heads * config.head_dim * elem


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
    ) -> None:
        self.model = model
        self.config = config
        self.block_size = block_size
        self.device = device
        self.kv_caches = model.allocate_kv_caches(num_blocks, block_size, dtype, device)
        self._generators: dict[str, torch.Generator] = {}

    def reset(self) -> None:
        """Forget every request (after a failure, when the scheduler rebuilds the KV pool empty).
        The KV tensors are kept as they are: a block is always written before it is read, and
        the rebuilt prefix cache holds nothing, so no stale K/V can reach an attention."""
        self._generators.clear()

    @torch.inference_mode()
    def execute(self, step_input: StepInput) -> StepOutput:
        for request_id in step_input.finished_request_ids:
            self._generators.pop(request_id, None)
        requests = step_input.requests
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
        meta = AttentionMetadata.build(
            query_lens, context_lens, [r.block_ids for r in requests], self.block_size, self.device
        )
        hidden = self.model(
            torch.tensor(input_ids, dtype=torch.long, device=self.device),
            torch.tensor(positions, dtype=torch.long, device=self.device),
            self.kv_caches,
            meta,
        )  # [T, hidden]

        sample_rows = [i for i, r in enumerate(requests) if r.sample]
        sampled = [-1] * len(requests)
        logprobs: list[TopLogprobs | None] | None = None
        if sample_rows:
            ends = meta.query_start_loc[1:] - 1  # [R] last new token of each request
            last = ends[torch.tensor(sample_rows, dtype=torch.long)]
            logits = self.model.compute_logits(hidden.index_select(0, last.to(self.device)))  # [S, V]
            logits = logits.float().cpu()
            if step_input.bitmask is not None:
                # Structured output: disallowed tokens -> -inf before any sampling parameter, so
                # bias, penalties, temperature, top-p and logprobs all see the masked distribution.
                step_input.bitmask.apply(logits, sample_rows)
            params = [requests[i].sampling for i in sample_rows]
            generators = [self._generator(requests[i]) for i in sample_rows]
            histories = [_history(requests[i]) for i in sample_rows]
            result = sample(logits, params, generators, histories)
            for i, token_id in zip(sample_rows, result.token_ids):
                sampled[i] = token_id
            if result.logprobs is not None:
                logprobs = [None] * len(requests)
                for i, lp in zip(sample_rows, result.logprobs):
                    logprobs[i] = lp
        return StepOutput(sampled, logprobs)

    def _generator(self, request: ScheduledRequest) -> torch.Generator | None:
        """A per-request generator for seeded requests, so their samples ignore the batch."""
        seed = request.sampling.seed
        if seed is None or request.sampling.temperature == 0.0:
            return None
        gen = self._generators.get(request.request_id)
        if gen is None:
            gen = torch.Generator().manual_seed(seed)
            self._generators[request.request_id] = gen
        return gen


def _history(request: ScheduledRequest) -> tuple[list[int], list[int]] | None:
    if request.prompt_token_ids is None:
        return None
    return request.prompt_token_ids, request.output_token_ids or []
