"""Per-tenant limits, checked before any engine work is spent on a request.

Admission (before the body is decoded): the concurrency limit, then one unit of the
requests-per-minute bucket. Once the prompt is tokenized (before the scheduler sees it): the
tokens-per-request limit, then ``prompt + n * max_tokens`` units of the tokens-per-minute
bucket, reserved because the completion's length is unknown; :meth:`TenantQuota.finish` refunds
what the request did not use. Every check and take is synchronous on the event loop, so a burst
of concurrent requests cannot overshoot a limit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from trillium.metering.buckets import TokenBucket
from trillium.metering.tenants import TenantLimits

# Retry-After for the concurrency limit: a slot frees when one of the tenant's requests ends,
# which we cannot predict.
CONCURRENCY_RETRY_AFTER = 1.0


class LimitExceeded(Exception):
    """A request is over one of its tenant's limits (HTTP 429).

    ``limit`` is the config name of the limit, ``kind`` is OpenAI's error type (``requests`` or
    ``tokens``), ``retry_after`` the seconds until the request could fit (``math.inf``: never).
    """

    def __init__(self, limit: str, kind: str, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.limit = limit
        self.kind = kind
        self.message = message
        self.retry_after = retry_after


def _wait_text(seconds: float) -> str:
    if math.isinf(seconds):
        return "This request can never fit; make it smaller."
    return f"Please try again in {max(1, math.ceil(seconds))}s."


class TenantQuota:
    """One tenant's buckets and in-flight count. Owned by the event loop (not thread-safe)."""

    def __init__(self, name: str, limits: TenantLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.limits = limits
        self._clock = clock
        self.requests = TokenBucket(limits.requests_per_minute, clock=clock) if limits.requests_per_minute else None
        self.tokens = TokenBucket(limits.tokens_per_minute, clock=clock) if limits.tokens_per_minute else None
        self.num_in_flight = 0

    def update(self, limits: TenantLimits) -> None:
        """New limits from a reloaded config, in force for the next check. The requests in
        flight stay counted; a per-minute bucket whose limit is unchanged keeps its level, one
        whose limit changed starts full at the new size."""
        old, self.limits = self.limits, limits
        if limits.requests_per_minute != old.requests_per_minute:
            rpm = limits.requests_per_minute
            self.requests = TokenBucket(rpm, clock=self._clock) if rpm else None
        if limits.tokens_per_minute != old.tokens_per_minute:
            tpm = limits.tokens_per_minute
            self.tokens = TokenBucket(tpm, clock=self._clock) if tpm else None

    def admit(self) -> None:
        """Count a new request in flight, or raise :class:`LimitExceeded` (nothing taken)."""
        cap = self.limits.max_concurrent_requests
        if cap is not None and self.num_in_flight >= cap:
            raise LimitExceeded(
                "max_concurrent_requests",
                "requests",
                f"Too many concurrent requests for tenant '{self.name}': limit {cap}. "
                f"{_wait_text(CONCURRENCY_RETRY_AFTER)}",
                CONCURRENCY_RETRY_AFTER,
            )
        if self.requests is not None:
            wait = self.requests.try_take(1)
            if wait:
                raise LimitExceeded(
                    "requests_per_minute",
                    "requests",
                    f"Rate limit reached for tenant '{self.name}' on requests per minute: "
                    f"limit {self.limits.requests_per_minute}. {_wait_text(wait)}",
                    wait,
                )
        self.num_in_flight += 1

    def default_max_tokens(self, num_prompt_tokens: int, room: int, n: int = 1) -> int:
        """The ``max_tokens`` of a request that set none: the context's ``room``, cut to what the
        tenant's token limits allow (at least 1, so that an over-limit prompt gets a 429)."""
        allowed = room
        for limit in (self.limits.max_tokens_per_request, self.limits.tokens_per_minute):
            if limit is not None:
                allowed = min(allowed, (limit - num_prompt_tokens) // n)
        return max(1, allowed)

    def reserve(self, num_prompt_tokens: int, num_completion_tokens: int) -> int:
        """Take prompt + completion tokens from the tokens-per-minute bucket and return how many
        were taken, or raise :class:`LimitExceeded` (nothing taken)."""
        total = num_prompt_tokens + num_completion_tokens
        cap = self.limits.max_tokens_per_request
        if cap is not None and total > cap:
            raise LimitExceeded(
                "max_tokens_per_request",
                "tokens",
                f"Request too large for tenant '{self.name}': {num_prompt_tokens} prompt + "
                f"{num_completion_tokens} completion tokens > max tokens per request {cap}. "
                "Lower max_tokens or shorten the prompt.",
                math.inf,
            )
        if self.tokens is not None:
            wait = self.tokens.try_take(total)
            if wait:
                raise LimitExceeded(
                    "tokens_per_minute",
                    "tokens",
                    f"Rate limit reached for tenant '{self.name}' on tokens per minute: "
                    f"limit {self.limits.tokens_per_minute}, requested {total}. {_wait_text(wait)}",
                    wait,
                )
        return total

    def finish(self, reserved: int, used: int) -> None:
        """The request ended: it is no longer in flight, and the tokens it reserved but did not
        use go back to the bucket."""
        self.num_in_flight -= 1
        if self.tokens is not None and reserved > used:
            self.tokens.refund(reserved - used)


class Quotas:
    """Every tenant's :class:`TenantQuota`, by tenant name."""

    def __init__(self, limits: dict[str, TenantLimits], clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.tenants = {name: TenantQuota(name, lim, clock) for name, lim in limits.items()}

    def update(self, limits: dict[str, TenantLimits]) -> None:
        """A reloaded config's tenants: one that stays keeps its quota (:meth:`TenantQuota.update`),
        a new one gets a fresh quota, a removed one is dropped (its requests in flight finish on
        the quota they hold)."""
        self.tenants = {name: self._updated(self.tenants.get(name), name, lim) for name, lim in limits.items()}

    def _updated(self, quota: TenantQuota | None, name: str, limits: TenantLimits) -> TenantQuota:
        if quota is None:
            return TenantQuota(name, limits, self._clock)
        quota.update(limits)
        return quota

    def __getitem__(self, tenant: str) -> TenantQuota:
        return self.tenants[tenant]
