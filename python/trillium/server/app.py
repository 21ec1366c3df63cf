"""The starlette application: routes and error handlers."""

from __future__ import annotations

import logging
import os

import msgspec
import trio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from trillium.engine_client import EngineClient
from trillium.metering.metrics import Metrics
from trillium.runtime import Health, Snapshot, faults
from trillium.server.accounting import Accounting
from trillium.server.anthropic_errors import error_response, speaks_anthropic
from trillium.server.errors import APIError
from trillium.server.limits import BodySizeLimit, InputLimits
from trillium.server.messages import MessagesRoutes
from trillium.server.openapi import openapi_route
from trillium.server.ops_routes import OpsRoutes
from trillium.server.page import ChatPage
from trillium.server.reload import ConfigReloader
from trillium.server.response_store import ResponseStore
from trillium.server.responses import ResponsesRoutes
from trillium.server.routes import Routes, json_response

log = logging.getLogger("trillium.server")


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return error_response(exc, request.url.path)


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own errors (404 no such route, 405 wrong method) in the path's API's error shape."""
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    message = f"{exc.detail}: {request.method} {request.url.path}"
    error = APIError(message, status=exc.status_code, code=code, headers=dict(exc.headers or {}))
    return error_response(error, request.url.path)


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
    if speaks_anthropic(request.url.path):
        error = APIError(f"internal error: {type(exc).__name__}", status=500, type="internal_error")
        return error_response(error, request.url.path)
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


class _ArmFault(msgspec.Struct):
    point: str
    action: str = "raise"  # or "hang"
    times: int = 1
    hang_s: float = 3600.0


async def debug_faults(request: Request) -> Response:
    """Test-only (``TRILLIUM_FAULT_INJECTION=1``): ``POST {"point", "action", "times", "hang_s"}``
    arms a fault point (see ``trillium.runtime.faults``); ``DELETE`` clears them all."""
    if request.method == "DELETE":
        faults.clear()
        return json_response({"cleared": True})
    try:
        body = msgspec.json.decode(await request.body(), type=_ArmFault)
        faults.arm(body.point, body.action, times=body.times, hang_s=body.hang_s)  # type: ignore[arg-type]
    except (msgspec.DecodeError, ValueError) as exc:
        raise APIError(str(exc)) from None
    return json_response({"armed": body.point})


def build_app(
    client: EngineClient,
    draining: trio.Event,
    accounting: Accounting | None = None,
    health: Snapshot[Health] | None = None,
    limits: InputLimits | None = None,
    reloader: ConfigReloader | None = None,
) -> Starlette:
    """``accounting`` defaults to an open server (no keys, no ledger) with its own metrics;
    ``health`` (the supervisor's watchdog snapshot) to always live and ready; ``limits`` to
    :class:`InputLimits`' defaults; ``reloader`` (``POST /v1/admin/reload``) to none (404)."""
    limits = limits or InputLimits()
    if accounting is None:
        accounting = Accounting(client.model_name, Metrics(client.model_name, client.stats))
    routes = Routes(client, draining, accounting, health or Snapshot(Health(ready=True)), limits)
    ops = OpsRoutes(accounting, reloader)
    responses = ResponsesRoutes(routes, ResponseStore())
    messages = MessagesRoutes(routes)
    api = [
        Route("/", ChatPage().serve, methods=["GET"]),
        Route("/health", routes.health, methods=["GET"]),
        Route("/health/ready", routes.ready, methods=["GET"]),
        Route("/stats", routes.stats, methods=["GET"]),
        Route("/get_load", routes.load, methods=["GET"]),
        Route("/flush_cache", routes.flush_cache, methods=["POST"]),
        Route("/get_server_info", routes.server_info, methods=["GET"]),
        Route("/metrics", ops.metrics, methods=["GET"]),
        Route("/v1/usage", ops.usage, methods=["GET"]),
        Route("/v1/admin/reload", ops.reload, methods=["POST"]),
        Route("/v1/models", routes.models, methods=["GET"]),
        Route("/v1/chat/completions", routes.chat_completions, methods=["POST"]),
        Route("/v1/completions", routes.completions, methods=["POST"]),
        Route("/v1/chat/completions/render", routes.render_chat, methods=["POST"]),
        Route("/v1/completions/render", routes.render_completion, methods=["POST"]),
        Route("/v1/responses", responses.create, methods=["POST"]),
        Route("/v1/responses/{response_id}", responses.stored, methods=["GET", "DELETE"]),
        Route("/v1/messages", messages.create, methods=["POST"]),
        Route("/v1/messages/count_tokens", messages.count_tokens, methods=["POST"]),
        Route("/tokenize", routes.tokenize, methods=["POST"]),
        Route("/detokenize", routes.detokenize, methods=["POST"]),
    ]

    async def operator_debug_faults(request: Request) -> Response:
        ops.accounting.auth.require_operator(request)
        return await debug_faults(request)

    # Test-only and undocumented: not in the OpenAPI document.
    debug = (
        [Route("/debug/faults", operator_debug_faults, methods=["POST", "DELETE"])]
        if os.environ.get(faults.ENABLE_ENV) == "1"
        else []
    )
    return Starlette(
        # GET /openapi.json documents every route; one without an entry in openapi.OPERATIONS fails here.
        routes=[*api, openapi_route(api), *debug],
        exception_handlers={APIError: _api_error, HTTPException: _http_error, Exception: _internal_error},
        # Inside the error handlers: a chunked body's 413 is raised while a route reads it.
        middleware=[Middleware(BodySizeLimit, max_body_bytes=limits.max_body_bytes)],
    )
