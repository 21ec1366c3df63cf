"""The chat page at ``GET /``: ``static/chat.html``, one self-contained file (inline CSS and
JS, no build step) that is a client of ``/v1/models`` and ``/v1/chat/completions`` like any
other, keys and quotas included.

The file is read once, when the app is built. Its Content-Security-Policy allows exactly the
page's own inline ``<style>`` and ``<script>`` (by SHA-256) and requests to this server: nothing
loads from outside, and no markup in a model's answer (the page renders it as Markdown, escaped
first) could run a script even if the renderer let some through.
"""

from __future__ import annotations

import base64
import hashlib
import re
from importlib.resources import files

from starlette.requests import Request
from starlette.responses import Response

PAGE = "static/chat.html"  # relative to this package; ships in the wheel (pyproject.toml)
_INLINE = re.compile(r"<(script|style)>(.*?)</\1>", re.S)
_COMMENT = re.compile(r"<!--.*?-->", re.S)


def content_security_policy(html: str) -> str:
    """The policy for ``html``: its inline ``<script>`` and ``<style>`` elements (written with
    no attributes) by hash, this origin for requests, nothing else."""
    hashes: dict[str, list[str]] = {"script": [], "style": []}
    for tag, body in _INLINE.findall(_COMMENT.sub("", html)):
        digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
        hashes[tag].append(f"'sha256-{digest}'")
    return "; ".join(
        [
            "default-src 'none'",
            "script-src " + (" ".join(hashes["script"]) or "'none'"),
            "style-src " + (" ".join(hashes["style"]) or "'none'"),
            "connect-src 'self'",
            "img-src 'self' data:",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        ]
    )


class ChatPage:
    """Serves the page from memory; ``serve`` is the route's endpoint."""

    def __init__(self) -> None:
        html = files("trillium.server").joinpath(PAGE).read_text(encoding="utf-8")
        self._body = html.encode()
        self._headers = {
            "Content-Security-Policy": content_security_policy(html),
            "X-Content-Type-Options": "nosniff",
            "Cache-Control": "no-cache",  # a new server version's page, not a stale copy
        }

    async def serve(self, request: Request) -> Response:
        return Response(self._body, media_type="text/html; charset=utf-8", headers=self._headers)
