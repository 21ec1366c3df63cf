"""A request as the scheduler sees it: tokens, progress through them, and its blocks."""

from __future__ import annotations

import enum
import time
from typing import TYPE_CHECKING, Any

from trillium.protocol import FinishReason, SamplingParams

if TYPE_CHECKING:
    from trillium.structured.controller import OutputController


class RequestStatus(enum.IntEnum):
    WAITING = 0  # not admitted yet, or preempted (its KV was dropped; it recomputes)
    RUNNING = 1  # holds blocks and is scheduled every step
    FINISHED = 2


class Request:
    """Scheduler-side state of one request.

    ``num_computed_tokens`` counts tokens whose K/V are in the request's blocks; each step
    moves it towards ``num_tokens`` (prompt + output so far). A request samples a new token
    only when a step brings it level with ``num_tokens``.

    A request owed prompt logprobs (``pending_prompt_logprobs`` not None) computes every prompt
    position (no prefix-cache reuse) and collects them chunk by chunk until its first token.
    """

    __slots__ = (
        "request_id",
        "prompt_token_ids",
        "output_token_ids",
        "sampling",
        "max_tokens",
        "reply",
        "status",
        "num_computed_tokens",
        "block_ids",
        "finish_reason",
        "arrival_time",
        "first_scheduled_time",
        "cache_namespace",
        "cache_handle",
        "rest_handle",
        "public_len",
        "public_namespace",
        "rest_namespace",
        "num_inserted_blocks",
        "num_cached_tokens",
        "structured",
        "tenant",
        "priority",
        "pending",
        "pending_prompt_logprobs",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: SamplingParams,
        max_tokens: int,
        reply: Any = None,
        arrival_time: float | None = None,
        cache_namespace: int = 0,
        structured: OutputController | None = None,
        tenant: str = "",
        priority: int = 0,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.output_token_ids: list[int] = []
        self.sampling = sampling
        self.max_tokens = max_tokens  # resolved: never None, fits the context
        self.reply = reply
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.block_ids: list[int] = []
        self.finish_reason: FinishReason | None = None
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.first_scheduled_time: float | None = None  # monotonic time of its first step
        self.cache_namespace = cache_namespace  # prefix-cache namespace (model + tenant salt)
        self.cache_handle: int | None = None  # locked prefix-cache node while blocks are held
        # Declared public prefixes (KVBlockManager.set_public_prefix): the leading prompt tokens,
        # whole blocks, cached in ``public_namespace`` for every tenant; the rest of the sequence
        # goes in ``rest_namespace``, whose locked node is ``rest_handle``. 0: none.
        self.public_len = 0
        self.public_namespace = 0
        self.rest_namespace = 0
        self.rest_handle: int | None = None
        self.num_inserted_blocks = 0  # leading blocks already offered to the prefix cache
        self.num_cached_tokens: int | None = None  # prompt tokens reused at first admission
        self.structured = structured  # a constrained request's structured output: its verdicts decide each step
        self.tenant = tenant  # whose share of the waiting queue and running slots it uses (fair_queue.py)
        self.priority = priority  # inside its tenant: lower goes first (vLLM's ``priority``)
        # Its last step's verdict is being decided off the event loop (policy.Deferred): it sits
        # out steps, is never preempted, and only its controller touches its output meanwhile.
        self.pending = False
        # While prompt logprobs are owed (asked for, prefill not finished): those of prompt
        # positions 1 .. computed so far, delivered with the first token; None otherwise.
        self.pending_prompt_logprobs: list[tuple[float, list[tuple[int, float]]]] | None = (
            [] if sampling.prompt_logprobs is not None else None
        )

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    def token_ids_slice(self, start: int, end: int) -> list[int]:
        """Tokens ``[start, end)`` of prompt + output, without concatenating both lists."""
        n_prompt = len(self.prompt_token_ids)
        if end <= n_prompt:
            return self.prompt_token_ids[start:end]
        if start >= n_prompt:
            return self.output_token_ids[start - n_prompt : end - n_prompt]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n_prompt]

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.name}, computed={self.num_computed_tokens}"
            f"/{self.num_tokens}, blocks={len(self.block_ids)})"
        )
