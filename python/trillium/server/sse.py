"""Server-sent events framing for OpenAI streams."""

from __future__ import annotations

import msgspec

_encoder = msgspec.json.Encoder()

DONE = b"data: [DONE]\n\n"


def event(payload: dict) -> bytes:
    """One ``data:`` event carrying a JSON object."""
    return b"data: " + _encoder.encode(payload) + b"\n\n"
