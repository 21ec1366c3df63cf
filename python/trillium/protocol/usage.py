"""Messages to the metering actor: one ``UsageRecord`` per finished HTTP request, and queries.

A record describes what the client was told: its token counts are those of the ``usage``
object returned to the client (summed over the ``n`` choices), or, for a request cut short,
those delivered before it ended.
"""

from __future__ import annotations

from typing import Any

import msgspec

# ``UsageRecord.status``
COMPLETED = "completed"  # every choice finished with stop or length
ABORTED = "aborted"  # the client went away, or the server aborted it while shutting down
FAILED = "failed"  # the engine (or the handler) failed it: the client got a 5xx or an error event
REJECTED = "rejected"  # refused after admission, before generating (bad input, context too long, overload)
STATUSES = (COMPLETED, ABORTED, FAILED, REJECTED)


class UsageRecord(msgspec.Struct, kw_only=True, gc=False):
    """One finished request. Times are seconds; ``None`` where the request never got that far."""

    request_id: str
    tenant: str  # "anonymous" without an access config
    model: str
    endpoint: str  # "chat" | "completions"
    created: float  # unix time at which the request finished
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix cache (choice 0)
    completion_tokens: int = 0  # over all choices
    num_choices: int = 1
    queue_time: float | None = None  # scheduler: arrival to first step (choice 0)
    ttft: float | None = None  # request received to first token (choice 0)
    tpot: float | None = None  # mean time per output token after the first (choice 0)
    e2e: float = 0.0  # request received to finished
    finish_reason: str | None = None  # stop | length | abort | error (the worst over choices)
    status: str = COMPLETED  # one of STATUSES
    http_status: int = 200


class UsageQuery(msgspec.Struct, kw_only=True, gc=False):
    """Frontend -> metering actor: per-tenant totals of records finished in ``[since, until)``.

    Answered after every record sent before it is written, on ``reply`` (a one-shot
    ``trio.MemorySendChannel``) with a list of :class:`TenantUsage` or an error string.
    """

    since: float | None = None
    until: float | None = None
    tenant: str | None = None
    reply: Any = None


class TenantUsage(msgspec.Struct, kw_only=True):
    """Totals of one tenant over a time range (``trillium usage``, ``GET /v1/usage``)."""

    tenant: str
    requests: int
    completed: int
    aborted: int
    failed: int
    rejected: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    total_tokens: int
