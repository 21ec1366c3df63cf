"""Operator endpoints: ``GET /metrics`` (Prometheus text) and ``GET /v1/usage`` (admin key).

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
from trillium.metering.timespec import parse_time
from trillium.protocol.usage import UsageQuery
from trillium.server.accounting import Accounting
from trillium.server.errors import APIError


class OpsRoutes:
    def __init__(self, accounting: Accounting) -> None:
        self.accounting = accounting

    async def metrics(self, request: Request) -> Response:
        return Response(self.accounting.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

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
