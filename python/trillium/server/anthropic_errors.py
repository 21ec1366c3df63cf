"""Errors in the shape of the API a path speaks: Anthropic's on the Messages routes
(``{"type": "error", "error": {"type", "message"}}``), OpenAI's everywhere else.

Every error of a request under :data:`MESSAGES_PATH` -- a bad body, a missing key, a limit, an
overloaded server, a route or method that does not exist, a server bug -- goes through
:func:`error_response` (the app's error handlers and the body-size middleware call it), so an
Anthropic client never meets an OpenAI error body. The status codes are the server's own on
every route (503 + ``Retry-After`` when overloaded, where Anthropic's API says 529).
"""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.responses import Response

from trillium.server.errors import APIError

MESSAGES_PATH = "/v1/messages"

# Anthropic's error type for each status; another 4xx is an invalid request, another 5xx an api_error.
_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def speaks_anthropic(path: str) -> bool:
    """Whether a request to ``path`` is answered in Anthropic's shape."""
    return path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")


def anthropic_error(exc: APIError) -> dict[str, Any]:
    """``exc`` as Anthropic's error object; the message starts with the field at fault, if any
    (as Anthropic's do: ``max_tokens: Field required``)."""
    kind = _TYPES.get(exc.status, "invalid_request_error" if exc.status < 500 else "api_error")
    message = exc.message
    if exc.param and not message.startswith(exc.param):
        message = f"{exc.param}: {message}"
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_response(exc: APIError, path: str) -> Response:
    """The response to an error of a request to ``path``."""
    if not speaks_anthropic(path):
        return exc.response()
    body = msgspec.json.encode(anthropic_error(exc))
    return Response(body, exc.status, exc.headers, media_type="application/json")
