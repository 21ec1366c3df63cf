"""Per-request accounting in the frontend: who is asking (auth), whether they may (quotas), and
what they used (one :class:`UsageRecord` to the metering actor, Prometheus metrics).

A route handler runs inside ``with accounting.admit(request, chat=...) as account:``:

- ``admit`` authenticates (401), checks the tenant's concurrency and requests-per-minute
  limits (429) and reserves the request's slot in the metering inbox (503 if none), before
  the body is even decoded;
- ``account.limit_tokens`` checks tokens-per-request and reserves tokens-per-minute (429)
  once the prompt is tokenized, before the scheduler sees the request;
- leaving the ``with`` block finishes the account (record, metrics, refund), unless a
  streamed response took it over with ``account.streaming_response``: then the stream finishes
  it at its end, and the response's ASGI call finishes it in any case (a client gone before
  the first byte included). :meth:`RequestAccount.finish` is idempotent, so every admitted
  request yields exactly one record.

A response that completes commits its record before its last bytes go out: the route calls
:meth:`RequestAccount.finish_committed` once it knows the final usage and only then sends the
JSON body, the usage chunk and ``[DONE]``, or the final Responses event. So a client that read
a whole response finds its request in the ledger even after a SIGKILL of the server (the
metering actor's group commit; metering/actor.py). Every other end (rejected, aborted,
failed: no completed response) sends its record without waiting, as :meth:`~RequestAccount.finish`.
"""

from __future__ import annotations

import math
import time
import uuid
from types import TracebackType
from typing import TYPE_CHECKING, Any

import msgspec
from starlette.requests import Request
from starlette.responses import ContentStream, StreamingResponse
from starlette.types import Receive, Scope, Send

from trillium.metering.actor import UsageSink
from trillium.metering.metrics import Metrics
from trillium.metering.quotas import LimitExceeded, Quotas, TenantQuota
from trillium.metering.tenants import AccessConfig
from trillium.protocol import FinishReason, SamplingParams
from trillium.protocol.usage import ABORTED, COMPLETED, FAILED, REJECTED, UsageRecord
from trillium.server.auth import Authenticator
from trillium.server.errors import APIError, overloaded

if TYPE_CHECKING:
    from trillium.server.openai_shapes import ChoiceFanout

# Worst first: the record of an n > 1 request carries the worst of its choices' reasons.
_REASON_RANK = {FinishReason.ERROR: 3, FinishReason.ABORT: 2, FinishReason.LENGTH: 1, FinishReason.STOP: 0}
# Retry-After for a request over a limit it can never fit (max tokens per request, or more
# tokens than a minute's bucket holds): the window of the per-minute limits.
NEVER_RETRY_AFTER = 60
# What a request's response tells the client of what the server did not do as asked (a JSON
# schema's formats it does not know and ignored), the warnings joined by "; ".
WARNING_HEADER = "X-Trillium-Warning"


def rate_limited(exc: LimitExceeded) -> APIError:
    """429 in OpenAI's shape; ``param`` names the limit, ``type`` is ``requests`` or ``tokens``."""
    seconds = NEVER_RETRY_AFTER if math.isinf(exc.retry_after) else max(1, math.ceil(exc.retry_after))
    return APIError(
        exc.message,
        status=429,
        type=exc.kind,
        param=exc.limit,
        code="rate_limit_exceeded",
        headers={"Retry-After": str(seconds)},
    )


class Accounting:
    """Server-wide state: the authenticator, every tenant's quota, the metrics and the usage
    sink (``None`` when nothing is written: no config and no request log)."""

    def __init__(
        self, model_name: str, metrics: Metrics, access: AccessConfig | None = None, sink: UsageSink | None = None
    ) -> None:
        self.model_name = model_name
        self.metrics = metrics
        self.auth = Authenticator(access, metrics)
        self.quotas = Quotas(access.limits) if access is not None else None
        self.sink = sink
        metrics.cache_scope_of = self.cache_scope

    def cache_scope(self, tenant: str) -> str | None:
        """The prefix-cache (and grammar-cache) namespace of ``tenant``'s requests: its own, or its
        ``[prefix_cache.groups]`` group's, read from the access config in force; None on an open
        server (one shared namespace, as without tenants)."""
        access = self.auth.access
        if access is None:
            return None
        return access.cache_scopes.get(tenant, f"tenant:{tenant}")

    def reload(self, access: AccessConfig) -> list[str]:
        """Put a re-read access config in force for every new request: keys, admin keys, tenant
        limits, ``[auth]`` and whatever else reads ``auth.access`` (cache namespaces). One
        synchronous swap on the event loop, so no request sees half of each. Requests already
        admitted finish as they began (their streams run on); a tenant that stays keeps its
        buckets and in-flight count (:meth:`Quotas.update`). The ledger stays where it is (the
        metering actor opened it at start): a changed ``[ledger] path`` is ignored until a
        restart, and said so in the returned warnings."""
        old = self.auth.access
        assert old is not None and self.quotas is not None, "a server started without --config has nothing to reload"
        warnings = []
        if access.ledger_path != old.ledger_path:
            warnings.append(
                f"ledger.path changed to {access.ledger_path}: the ledger stays {old.ledger_path} until a restart"
            )
            access = msgspec.structs.replace(access, ledger_path=old.ledger_path)
        self.quotas.update(access.limits)
        self.auth.configure(access)
        return warnings

    def admit(self, request: Request, *, chat: bool, endpoint: str | None = None) -> RequestAccount:
        """Authenticate and admit a new request. Raises APIError (401, 429, 503). ``endpoint``
        (``responses``, ``messages``) overrides the ledger's endpoint name and the id's prefix that
        ``chat`` picks."""
        tenant = self.auth.tenant(request)
        if self.sink is not None and not self.sink.has_room():
            raise overloaded("the usage ledger is behind; retry shortly")
        quota = self.quotas[tenant] if self.quotas is not None else None
        if quota is not None:
            try:
                quota.admit()
            except LimitExceeded as exc:
                self.metrics.rate_limited(tenant, exc.limit)
                raise rate_limited(exc) from None
        if self.sink is not None:
            self.sink.admit()
        endpoint = endpoint or ("chat" if chat else "completions")
        prefix = {"chat": "chatcmpl-", "completions": "cmpl-", "responses": "resp_", "messages": "msg_"}[endpoint]
        return RequestAccount(self, f"{prefix}{uuid.uuid4().hex}", tenant, quota, endpoint)


class RequestAccount:
    """One admitted request's reservations and outcome. Event loop only; nothing awaits but
    :meth:`finish_committed`."""

    def __init__(
        self, accounting: Accounting, request_id: str, tenant: str, quota: TenantQuota | None, endpoint: str
    ) -> None:
        self._accounting = accounting
        self.request_id = request_id
        self.tenant = tenant
        self._quota = quota
        self._endpoint = endpoint
        self._started = time.monotonic()
        self._reserved = 0  # tokens taken from the tenant's tokens-per-minute bucket
        self.fanout: ChoiceFanout | None = None  # once the request reached the engine
        self.http_status = 200
        self.warnings: list[str] = []  # for the client, in the response's WARNING_HEADER
        self._streaming = False
        self.finished = False

    def __enter__(self) -> RequestAccount:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is not None:
            self.finish(error=exc)
        elif not self._streaming:
            self.finish()

    def limit_tokens(self, sampling: SamplingParams, num_prompt_tokens: int, n: int, room: int) -> SamplingParams:
        """Check tokens per request and reserve ``prompt + n * max_tokens`` tokens per minute.
        An unset ``max_tokens`` becomes the most the tenant's limits allow (within ``room``, the
        context left). Returns the sampling to run with; raises APIError 429."""
        if self._quota is None:
            return sampling
        max_tokens = sampling.max_tokens
        if max_tokens is None:
            max_tokens = self._quota.default_max_tokens(num_prompt_tokens, room, n)
            sampling = msgspec.structs.replace(sampling, max_tokens=max_tokens)
        try:
            self._reserved = self._quota.reserve(num_prompt_tokens, n * max_tokens)
        except LimitExceeded as exc:
            self._accounting.metrics.rate_limited(self.tenant, exc.limit)
            raise rate_limited(exc) from None
        return sampling

    def streaming_response(self, body: ContentStream, **kwargs: Any) -> StreamingResponse:
        """A streamed response that owns this account from now on (see the module docstring)."""
        self._streaming = True
        return _AccountedStream(self, body, **kwargs)

    def finish(self, *, error: BaseException | None = None) -> None:
        """Release the reservations and send the record, written soon after (idempotent).
        ``error``: the exception that ended the handler (APIError, a cancellation, or a bug)."""
        record = self._close(error, None)
        sink = self._accounting.sink
        if record is not None and sink is not None:
            sink.send(record)

    async def finish_committed(self, usage: dict[str, Any] | None = None) -> None:
        """Finish a request whose response is complete, before its last bytes are sent: as
        :meth:`finish`, then wait until the ledger has committed the record (False from
        ``UsageSink.commit`` -- a failed or timed-out commit, logged there -- lets the response
        complete all the same). ``usage``: the usage object the response reports, where it is not
        the fanout's (echo with ``max_tokens: 0`` reports no completion tokens). A no-op once
        finished; a cancellation during the wait propagates, the record already handed over."""
        record = self._close(None, usage)
        sink = self._accounting.sink
        if record is not None and sink is not None:
            await sink.commit(record)

    def _close(self, error: BaseException | None, usage: dict[str, Any] | None) -> UsageRecord | None:
        """Release the reservations, update the metrics and return the record; None if finished."""
        if self.finished:
            return None
        self.finished = True
        now = time.monotonic()
        fanout = self.fanout
        if fanout is not None:
            fanout.abort()  # a no-op for finished choices; frees an abandoned request's blocks
        record = self._record(fanout, error, now, usage)
        if self._quota is not None:
            self._quota.finish(self._reserved, record.prompt_tokens + record.completion_tokens)
        self._accounting.metrics.observe(record, fanout.streams if fanout is not None else ())
        return record

    def _record(
        self, fanout: ChoiceFanout | None, error: BaseException | None, now: float, usage: dict[str, Any] | None
    ) -> UsageRecord:
        if isinstance(error, APIError):
            http_status = error.status
        elif _is_bug(error):
            http_status = 500
        elif error is not None:
            http_status = 499  # cancelled: the client closed the connection (nginx's code)
        else:
            http_status = self.http_status
        record = UsageRecord(
            request_id=self.request_id,
            tenant=self.tenant,
            model=self._accounting.model_name,
            endpoint=self._endpoint,
            created=time.time(),
            e2e=now - self._started,
            http_status=http_status,
        )
        if fanout is None:
            record.status = FAILED if _is_bug(error) else ABORTED if http_status == 499 else REJECTED
            return record
        if usage is None:
            usage = fanout.usage()
        record.prompt_tokens = usage["prompt_tokens"]
        record.cached_tokens = usage["prompt_tokens_details"]["cached_tokens"]
        record.completion_tokens = usage["completion_tokens"]
        record.num_choices = fanout.n
        reasons = [s.finish_reason for s in fanout.streams] + [None] * (fanout.n - len(fanout.streams))
        # Worst over the choices; a choice that never finished counts as aborted.
        worst = max((FinishReason.ABORT if r is None else r for r in reasons), key=_REASON_RANK.__getitem__)
        record.finish_reason = worst.openai_name
        if worst == FinishReason.ERROR or _is_bug(error):
            record.status = FAILED
        elif worst == FinishReason.ABORT:
            record.status = ABORTED
        else:
            record.status = COMPLETED
        first = fanout.streams[0]
        record.queue_time = first.queue_time
        if first.first_token_time is not None:
            record.ttft = first.first_token_time - self._started
            if first.num_completion_tokens > 1:
                assert first.last_token_time is not None  # set together with first_token_time
                record.tpot = (first.last_token_time - first.first_token_time) / (first.num_completion_tokens - 1)
        return record


def _is_bug(error: BaseException | None) -> bool:
    """A server-side failure: an exception that is not a client-facing APIError (nor a
    cancellation: a disconnect), or an APIError 500 (an actor failed while holding the request)."""
    if isinstance(error, APIError):
        return error.status == 500
    return isinstance(error, Exception)


class _AccountedStream(StreamingResponse):
    """Finishes the account when the ASGI call ends, however it ends (the SSE generator's own
    ``finally`` never runs if the client left before the generator started)."""

    def __init__(self, account: RequestAccount, body: ContentStream, **kwargs: Any) -> None:
        super().__init__(body, **kwargs)
        self._account = account

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._account.finish()
