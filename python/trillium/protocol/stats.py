"""Counters that actors publish as immutable snapshots (``runtime.Snapshot``).

Readers (``GET /stats``, the Prometheus collector, benchmarks) see the latest published value;
they never call into an actor. Field names are the keys of ``/stats``.
"""

from __future__ import annotations

import msgspec


class SchedulerStats(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Published by the scheduler after every step and every message it applies."""

    num_requests_running: int = 0  # holding blocks, scheduled every step
    num_requests_waiting: int = 0  # queued or preempted
    num_free_blocks: int = 0  # on the allocator's free list
    num_total_blocks: int = 0  # size of the KV pool
    num_cached_blocks: int = 0  # held by the prefix cache
    num_blocks_in_use: int = 0  # held by requests: neither free nor reclaimable from the prefix cache
    kv_cache_usage_perc: float = 0.0  # num_blocks_in_use / num_total_blocks, 0-1
    num_preemptions: int = 0  # requests preempted (recompute) since start
    num_steps: int = 0  # forward passes run
    num_step_tokens: int = 0  # tokens computed by those steps (prompt + output)
    step_seconds: float = 0.0  # time inside the executor, summed over steps
    num_forced_tokens: int = 0  # structured output: appended by jump-forward, never sampled
    num_closed_outputs: int = 0  # JSON outputs closed by their grammar's shortest completion before max_tokens
    num_witness_closings: int = 0  # of those, closings that wrote an open value as a witness of its schema
    num_witness_values: int = 0  # values written as witnesses of their schema after failing checks too often
    num_rejected_tokens: int = 0  # output tokens taken back because a value failed a schema check
    grammar_steps: int = 0  # steps with at least one constrained sampling row
    grammar_masks: int = 0  # constrained rows masked, summed over steps
    grammar_fill_seconds: float = 0.0  # grammar thread filling masks (overlaps the forward pass)
    grammar_wait_seconds: float = 0.0  # model thread waiting for a fill (ideally ~0)
    spec_num_drafts: int = 0  # speculation: verify rows (a request speculating in a step)
    spec_num_draft_tokens: int = 0  # draft tokens proposed
    spec_num_accepted_tokens: int = 0  # draft tokens the model accepted
    spec_accepted_per_pos: list[int] = msgspec.field(default_factory=list)  # acceptances of draft j
    spec_acceptance_rate: float = 0.0  # accepted / proposed draft tokens (0 before any)
    spec_disable_by_batch_size: int = 0  # no request speculates once this many run (0: speculation off)
    spec_draft_num_free_blocks: int = 0  # method draft: the draft model's own KV pool (0: none)
    spec_draft_num_total_blocks: int = 0
    kv_events_published: int = 0  # --kv-events-endpoint: prefix-cache event batches sent (0: off)
    kv_events_dropped: int = 0  # batches dropped because the sender was behind (the router sees a gap)


class GrammarStats(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Published by the grammar actor after every compile request it answers."""

    grammars_compiled: int = 0
    grammar_cache_hits: int = 0
    grammar_compile_timeouts: int = 0
