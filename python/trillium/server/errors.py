"""OpenAI-style errors: ``{"error": {"message", "type", "param", "code"}}`` with a 4xx/5xx status."""

from __future__ import annotations

import re
from typing import Any

import msgspec
from starlette.responses import Response


class APIError(Exception):
    """An error the client should see. ``param`` names the offending request field."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> Response:
        return Response(msgspec.json.encode(self.body()), self.status, self.headers, media_type="application/json")


def overloaded(message: str) -> APIError:
    return APIError(
        message, status=503, type="server_overloaded", code="server_overloaded", headers={"Retry-After": "1"}
    )


_PATH = re.compile(r"at `\$\.?([^`]*)`")


def from_validation_error(exc: msgspec.ValidationError) -> APIError:
    """msgspec says e.g. "Expected `int`, got `str` - at `$.max_tokens`": name that field."""
    text = str(exc)
    match = _PATH.search(text)
    param = match.group(1) if match else None
    if param is None:
        missing = re.search(r"missing required field `([^`]*)`", text)
        param = missing.group(1) if missing else None
    return APIError(text, param=param, code="invalid_value")
