"""API keys: ``Authorization: Bearer <key>``, or ``x-api-key: <key>`` (Anthropic's header, which
its clients send), -> tenant name (401 when missing or unknown).

Keys are compared by their SHA-256 digest, the only form the config file holds. Without an
access config every request is the ``anonymous`` tenant, the operational routes are open and
``/v1/usage`` is not served. With one, every 401 counts against the client's address, and an
address past ``[auth] failures_per_minute`` gets 429 before its key is looked at
(server/auth_throttle.py). The access config in force is :attr:`Authenticator.access`, swapped
whole by :meth:`Authenticator.configure` (a reload): every check reads it once, on the event
loop, without awaiting, so no request sees half of an old config and half of a new one.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable

from starlette.requests import Request

from trillium.metering.metrics import Metrics
from trillium.metering.tenants import AccessConfig, AuthSettings
from trillium.server.auth_throttle import AuthThrottle, Network, client_address, parse_networks
from trillium.server.errors import APIError

ANONYMOUS = "anonymous"
_CHALLENGE = {"WWW-Authenticate": "Bearer"}
_MISSING = (
    "You didn't provide an API key. Send it in the Authorization header: 'Authorization: Bearer YOUR_KEY' "
    "(or in 'x-api-key: YOUR_KEY')."
)


def _bearer_key(request: Request) -> str | None:
    """The request's key: ``Authorization: Bearer``'s, else ``x-api-key``'s (the same keys)."""
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    key = key.strip()
    if scheme.lower() == "bearer" and key:
        return key
    return request.headers.get("x-api-key", "").strip() or None


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class Authenticator:
    """Who a request is (its key's tenant, or the admin), and the failed-authentication throttle.
    ``metrics`` counts the 401s and the throttled 429s. Event loop only."""

    def __init__(
        self, access: AccessConfig | None, metrics: Metrics | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.throttle = AuthThrottle(clock=clock)
        self._metrics = metrics
        self._trusted_proxies: tuple[Network, ...] = ()
        self.access = access
        self.configure(access)

    def configure(self, access: AccessConfig | None) -> None:
        """Put ``access`` in force from the next request on: keys, admin keys and ``[auth]``. The
        failure counts are kept (a reload does not forgive a key guesser)."""
        settings = access.auth if access is not None else AuthSettings()
        self.throttle.failures_per_minute = settings.failures_per_minute
        self._trusted_proxies = parse_networks(settings.trusted_proxies)
        self.access = access

    def client_address(self, request: Request) -> str:
        """The address failed authentications count against (server/auth_throttle.py)."""
        trusted = self._trusted_proxies
        forwarded = None
        if trusted:  # read only when it may count
            forwarded = ",".join(request.headers.getlist("x-forwarded-for")) or None
        peer = request.scope.get("client")  # (host, port); not request.client, a new tuple per call
        return client_address(peer[0] if peer else None, forwarded, trusted)

    def tenant(self, request: Request) -> str:
        """The tenant whose key the request carries. Raises APIError 401, or 429 while the
        client's address is throttled."""
        access = self.access
        if access is None:
            return ANONYMOUS
        address = self._not_throttled(request)
        key = _bearer_key(request)
        if key is None:
            raise self._failed(address, "missing")
        tenant = access.key_hashes.get(_digest(key))
        if tenant is None:
            raise self._failed(address, "invalid")
        return tenant

    def require_operator(self, request: Request) -> None:
        """The operational routes (``/flush_cache``, ``/stats``, ``/debug/*``): open without an
        access config, the admin key with one (as :meth:`require_admin`)."""
        if self.access is not None:
            self.require_admin(request)

    def require_admin(self, request: Request) -> None:
        """Raises APIError: 404 without an access config, 401 without the admin key, 403 for a
        tenant's key, 429 while the client's address is throttled."""
        access = self.access
        if access is None:
            raise APIError(
                "this endpoint needs an access config (trillium serve --config FILE)",
                status=404,
                type="NotFoundError",
                code="not_found",
            )
        address = self._not_throttled(request)
        key = _bearer_key(request)
        if key is None:
            raise self._failed(address, "missing", "This endpoint needs the admin API key.")
        digest = _digest(key)
        if digest in access.admin_key_hashes:
            return
        if digest in access.key_hashes:
            raise APIError(
                "This endpoint needs the admin API key, not a tenant's.",
                status=403,
                type="permission_error",
                code="permission_denied",
            )
        raise self._failed(address, "invalid")

    def _not_throttled(self, request: Request) -> str:
        """The client's address; raises APIError 429 (with Retry-After) while it is throttled."""
        address = self.client_address(request)
        wait = self.throttle.retry_after(address)
        if wait > 0:
            if self._metrics is not None:
                self._metrics.auth_throttled.inc()
            seconds = max(1, math.ceil(wait))
            raise APIError(
                f"Too many failed authentications from this address. Please try again in {seconds}s.",
                status=429,
                type="requests",
                param="failures_per_minute",
                code="rate_limit_exceeded",
                headers={"Retry-After": str(seconds)},
            )
        return address

    def _failed(self, address: str, reason: str, message: str | None = None) -> APIError:
        """Count a failed authentication; the 401 to raise. ``reason``: missing or invalid."""
        self.throttle.failed(address)
        if self._metrics is not None:
            self._metrics.auth_failures[reason].inc()
        if reason == "missing":
            return APIError(message or _MISSING, status=401, code="missing_api_key", headers=_CHALLENGE)
        return APIError("Incorrect API key provided.", status=401, code="invalid_api_key", headers=_CHALLENGE)
