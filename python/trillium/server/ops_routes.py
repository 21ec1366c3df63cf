"""Operator endpoints: ``GET /metrics`` (Prometheus text), ``GET /v1/usage`` and
``POST /v1/admin/reload`` (admin key).

With an access config, ``/metrics`` without an ``Authorization`` header shows the load gauges
alone (``metering/metrics.py``, ``LOAD_GAUGES``: what routers and autoscalers read); with the
admin key (``authorization: {credentials: ...}`` in Prometheus' scrape config) every series; any
other key is refused (401, 403) and counts as a failed authentication.

``/v1/usage?since=24h&until=...&tenant=acme`` returns the per-tenant totals that
``trillium usage`` prints, read through the metering actor so that every request finished
before the query is counted.
"""

from __future__ import annotations

import time

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from trillium.metering.metrics import CONTENT_TYPE_LATEST
from trillium.metering.tenants import ConfigError
from trillium.metering.timespec import parse_time
from trillium.protocol.usage import UsageQuery
from trillium.server.accounting import Accounting
from trillium.server.errors import APIError
from trillium.server.reload import ConfigReloader
from trillium.server.response_schema import ConfigReloaded


class OpsRoutes:
    def __init__(self, accounting: Accounting, reloader: ConfigReloader | None = None) -> None:
        self.accounting = accounting
        self.reloader = reloader

    async def metrics(self, request: Request) -> Response:
        auth = self.accounting.auth
        everything = True
        if auth.access is not None:
            if "authorization" in request.headers:
                auth.require_admin(request)
            else:
                everything = False
        return Response(self.accounting.metrics.exposition(everything=everything), media_type=CONTENT_TYPE_LATEST)

    async def reload(self, request: Request) -> Response:
        """Re-read ``--config`` (and the TLS files): 200 once in force, 422 naming the error with
        the old config kept; 404 without ``--config``."""
        self.accounting.auth.require_admin(request)
        if self.reloader is None or self.reloader.config_path is None:
            raise APIError(
                "this server has no --config file to reload", status=404, type="NotFoundError", code="not_found"
            )
        try:
            done = await self.reloader.reload()
        except ConfigError as exc:
            raise APIError(
                f"config refused, the one in force stays: {exc}", status=422, code="invalid_config"
            ) from None
        body = ConfigReloaded(tenants=done.num_tenants, tls=done.tls, warnings=done.warnings)
        return Response(msgspec.json.encode(body), media_type="application/json")

    async def usage(self, request: Request) -> Response:
        self.accounting.auth.require_admin(request)
        sink = self.accounting.sink
        if sink is None:
            raise APIError("no usage ledger is configured", status=404, type="NotFoundError", code="not_found")
        now = time.time()
        bounds = {}
        for name in ("since", "until"):
            text = request.query_params.get(name)
            if text is not None:
                try:
                    bounds[name] = parse_time(text, now=now)
                except ValueError as exc:
                    raise APIError(str(exc), param=name, code="invalid_value") from None
        query = UsageQuery(tenant=request.query_params.get("tenant"), **bounds)
        try:
            totals = await sink.query(query)
        except RuntimeError as exc:
            raise APIError(
                str(exc), status=503, type="server_overloaded", code="server_overloaded", headers={"Retry-After": "1"}
            ) from None
        return Response(
            msgspec.json.encode(
                {
                    "object": "list",
                    "since": bounds.get("since"),
                    "until": bounds.get("until", now),
                    "data": [msgspec.structs.asdict(t) for t in totals],
                }
            ),
            media_type="application/json",
        )
