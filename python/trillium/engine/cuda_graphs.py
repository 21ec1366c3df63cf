"""Decode and verify steps replayed from CUDA graphs.

A small model's decode step on a GPU is hundreds of kernel launches of a few microseconds each:
launched one by one from Python, the GPU mostly waits for the host. :class:`CudaGraphSteps`
captures the model's forward and output head once per step shape (``models.step_buckets``: a
batch bucket B and q new tokens per request, q = 1 for decode, k + 1 for a speculative verify
step) and replays it: one launch per step.

A graph reads its inputs from static buffers sized for the largest shape and writes its logits
into a tensor of its own, so each step copies its values into those buffers (asynchronously, from
pinned host memory) and replays. Inputs, per shape::

    input_ids, positions, slot_mapping   [B * q]
    context_lens                         [B]
    block_tables                         [B, W]   W = blocks of the longest context
    query_start_loc                      [B + 1]  0, q, 2q, ... (constant per shape)

Padding requests write nothing (slot -1) and attend to the first q positions of block 0
(context_len q); their logits are dropped. All graphs share one memory pool, captured largest
first; only one step runs at a time, so their temporaries may overlap.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import torch

from trillium.models.llama import KVCache, LlamaForCausalLM
from trillium.models.step_buckets import StepBuckets
from trillium.ops.attention import AttentionMetadata, slot_mapping

log = logging.getLogger("trillium.engine")


class _Graph:
    """One captured shape: the graph, its metadata (views of the static buffers) and its logits."""

    __slots__ = ("graph", "meta", "logits")

    def __init__(self, graph: torch.cuda.CUDAGraph, meta: AttentionMetadata, logits: torch.Tensor) -> None:
        self.graph = graph
        self.meta = meta
        self.logits = logits  # [B * q, V] fp32, rewritten by every replay


class CudaGraphSteps:
    """Captured steps of ``model`` over ``kv_caches`` (both must stay where they are).

    ``max_blocks_per_request`` is the block-table width W (the longest context over
    ``block_size``, rounded up). Not thread-safe: capture and replay on the thread that runs the
    model.
    """

    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_caches: Sequence[KVCache],
        block_size: int,
        max_blocks_per_request: int,
        buckets: StepBuckets,
    ) -> None:
        device = kv_caches[0][0].device
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need the KV pool on a GPU, not {device}")
        self.model = model
        self.kv_caches = list(kv_caches)
        self.block_size = block_size
        self.width = max_blocks_per_request
        self.buckets = buckets
        self.device = device
        rows = buckets.max_batch
        tokens = rows * buckets.tokens_per_request[-1]
        self._input_ids = torch.zeros(tokens, dtype=torch.int64, device=device)
        self._positions = torch.zeros(tokens, dtype=torch.int64, device=device)
        self._slots = torch.full((tokens,), -1, dtype=torch.int64, device=device)
        self._context_lens = torch.ones(rows, dtype=torch.int32, device=device)
        self._block_tables = torch.zeros(rows, self.width, dtype=torch.int32, device=device)
        self._graphs: dict[tuple[int, int], _Graph] = {}
        self._pool: Any = None  # torch.cuda.graph_pool_handle(), shared by every capture

    # ------------------------------------------------------------------------------- capture
    @torch.inference_mode()
    def capture(self) -> float:
        """Capture every shape (largest first); returns the seconds it took."""
        start = time.perf_counter()
        torch.cuda.synchronize(self.device)
        self._pool = torch.cuda.graph_pool_handle()
        for batch, q in self.buckets.shapes():
            self._capture(batch, q)
        torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - start
        log.info(
            "CUDA graphs: %d shapes (batch %s x %s tokens per request) captured in %.1f s",
            len(self._graphs),
            self.buckets.batch_sizes,
            self.buckets.tokens_per_request,
            seconds,
        )
        return seconds

    def _capture(self, batch: int, q: int) -> None:
        tokens = batch * q
        self._pad(0, batch, q)
        meta = AttentionMetadata(
            query_start_loc=torch.arange(0, tokens + 1, q, dtype=torch.int32, device=self.device),
            context_lens=self._context_lens[:batch],
            block_tables=self._block_tables[:batch],
            slot_mapping=self._slots[:tokens],
            block_size=self.block_size,
            max_query_len=q,
            max_context_len=self.width * self.block_size,
            query_lens=[q] * batch,
            # The host-side context lengths say "longest possible", never "all fresh": a path
            # specialised on prompts without a cached prefix must not be captured for all steps.
            context_lens_list=[self.width * self.block_size] * batch,
        )
        ids, positions = self._input_ids[:tokens], self._positions[:tokens]
        # Warm up outside the capture (on a side stream, as torch asks): the first run of each
        # kernel and of cuBLAS allocates workspaces, which a capture must not do.
        side = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self.model.compute_logits(self.model(ids, positions, self.kv_caches, meta))
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits = self.model.compute_logits(self.model(ids, positions, self.kv_caches, meta))
        self._graphs[(batch, q)] = _Graph(graph, meta, logits)

    def _pad(self, first: int, batch: int, q: int) -> None:
        """Requests ``first .. batch - 1`` become padding: token 0 at position 0, no KV written,
        context q in block 0."""
        if first >= batch:
            return
        self._input_ids[first * q : batch * q].zero_()
        self._positions[first * q : batch * q].zero_()
        self._slots[first * q : batch * q].fill_(-1)
        self._context_lens[first:batch].fill_(q)
        self._block_tables[first:batch].zero_()

    # ------------------------------------------------------------------------------- replay
    def match(self, query_lens: Sequence[int]) -> tuple[int, int] | None:
        """The captured shape a step with these per-request token counts replays, or None."""
        shape = self.buckets.match(query_lens)
        return shape if shape in self._graphs else None

    @torch.inference_mode()
    def run(
        self,
        shape: tuple[int, int],
        input_ids: list[int],
        positions: list[int],
        context_lens: list[int],
        block_tables: list[list[int]],
    ) -> torch.Tensor:  # [R * q, V] fp32: a view into the graph's output, valid until the next replay
        """One step of R requests in ``shape`` (from :meth:`match`): token i of request r is
        ``input_ids[r * q + i]`` at ``positions[r * q + i]`` (the last q of its ``context_lens[r]``
        tokens); ``block_tables[r]`` covers them (at most W blocks). ValueError as
        :func:`~trillium.ops.attention.slot_mapping`, or for a table wider than W."""
        batch, q = shape
        num_requests = len(context_lens)
        tokens = num_requests * q
        used = max(len(t) for t in block_tables)
        if used > self.width:
            raise ValueError(f"a block table of {used} blocks exceeds the captured width {self.width}")
        slots = slot_mapping([q] * num_requests, context_lens, block_tables, self.block_size)
        host = torch.tensor([input_ids, positions, slots], dtype=torch.int64).pin_memory()
        self._input_ids[:tokens].copy_(host[0], non_blocking=True)
        self._positions[:tokens].copy_(host[1], non_blocking=True)
        self._slots[:tokens].copy_(host[2], non_blocking=True)
        self._context_lens[:num_requests].copy_(
            torch.tensor(context_lens, dtype=torch.int32).pin_memory(), non_blocking=True
        )
        tables = torch.tensor([list(t) + [0] * (used - len(t)) for t in block_tables], dtype=torch.int32)
        # Columns past ``used`` keep an earlier step's (valid) block ids: no request reads them.
        self._block_tables[:num_requests, :used].copy_(tables.pin_memory(), non_blocking=True)
        self._pad(num_requests, batch, q)
        graph = self._graphs[shape]
        graph.graph.replay()
        return graph.logits[:tokens]
