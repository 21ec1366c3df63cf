"""Server-sent events framing for OpenAI streams."""

from __future__ import annotations

from typing import Any

import msgspec

_encoder = msgspec.json.Encoder()

DONE = b"data: [DONE]\n\n"


def event(payload: dict[str, Any]) -> bytes:
    """One ``data:`` event carrying a JSON object."""
    return b"data: " + _encoder.encode(payload) + b"\n\n"
