"""API keys: ``Authorization: Bearer <key>`` -> tenant name (401 when missing or unknown).

Keys are compared by their SHA-256 digest, the only form the config file holds. Without an
access config every request is the ``anonymous`` tenant and ``/v1/usage`` is not served.
"""

from __future__ import annotations

import hashlib

from starlette.requests import Request

from trillium.metering.tenants import AccessConfig
from trillium.server.errors import APIError

ANONYMOUS = "anonymous"
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


def _bearer_key(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if not header:
        return None
    scheme, _, key = header.partition(" ")
    key = key.strip()
    return key if scheme.lower() == "bearer" and key else None


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class Authenticator:
    def __init__(self, access: AccessConfig | None) -> None:
        self.access = access

    def tenant(self, request: Request) -> str:
        """The tenant whose key the request carries. Raises APIError 401."""
        if self.access is None:
            return ANONYMOUS
        key = _bearer_key(request)
        if key is None:
            raise APIError(
                "You didn't provide an API key. Send it in the Authorization header: 'Authorization: Bearer YOUR_KEY'.",
                status=401,
                code="missing_api_key",
                headers=_CHALLENGE,
            )
        tenant = self.access.key_hashes.get(_digest(key))
        if tenant is None:
            raise APIError("Incorrect API key provided.", status=401, code="invalid_api_key", headers=_CHALLENGE)
        return tenant

    def require_admin(self, request: Request) -> None:
        """Raises APIError: 404 without an access config, 401 without the admin key, 403 for a
        tenant's key."""
        if self.access is None:
            raise APIError(
                "usage queries need an access config (trillium serve --config FILE)",
                status=404,
                type="NotFoundError",
                code="not_found",
            )
        key = _bearer_key(request)
        if key is None:
            raise APIError(
                "This endpoint needs the admin API key.", status=401, code="missing_api_key", headers=_CHALLENGE
            )
        digest = _digest(key)
        if digest in self.access.admin_key_hashes:
            return
        if digest in self.access.key_hashes:
            raise APIError(
                "This endpoint needs the admin API key, not a tenant's.",
                status=403,
                type="permission_error",
                code="permission_denied",
            )
        raise APIError("Incorrect API key provided.", status=401, code="invalid_api_key", headers=_CHALLENGE)
