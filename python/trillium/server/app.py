"""The starlette application: routes and error handlers."""

from __future__ import annotations

import logging

import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from trillium.engine_client import EngineClient
from trillium.metering.metrics import Metrics
from trillium.server.accounting import Accounting
from trillium.server.errors import APIError
from trillium.server.ops_routes import OpsRoutes
from trillium.server.routes import Routes, json_response

log = logging.getLogger("trillium.server")


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return exc.response()


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
    return json_response(
        {
            "error": {
                "message": f"internal error: {type(exc).__name__}",
                "type": "internal_error",
                "param": None,
                "code": "internal_error",
            }
        },
        500,
    )


def build_app(client: EngineClient, draining: trio.Event, accounting: Accounting | None = None) -> Starlette:
    """``accounting`` defaults to an open server (no keys, no ledger) with its own metrics."""
    if accounting is None:
        accounting = Accounting(client.model_name, Metrics(client.model_name, client.stats))
    routes = Routes(client, draining, accounting)
    ops = OpsRoutes(accounting)
    return Starlette(
        routes=[
            Route("/health", routes.health, methods=["GET"]),
            Route("/stats", routes.stats, methods=["GET"]),
            Route("/metrics", ops.metrics, methods=["GET"]),
            Route("/v1/usage", ops.usage, methods=["GET"]),
            Route("/v1/models", routes.models, methods=["GET"]),
            Route("/v1/chat/completions", routes.chat_completions, methods=["POST"]),
            Route("/v1/completions", routes.completions, methods=["POST"]),
            Route("/tokenize", routes.tokenize, methods=["POST"]),
            Route("/detokenize", routes.detokenize, methods=["POST"]),
        ],
        exception_handlers={APIError: _api_error, Exception: _internal_error},
    )
