"""The chat page route (server/page.py) without a browser: served at ``/``, self-contained, and
its Content-Security-Policy allows exactly the page's own inline style and script. The page in
a real browser: tests/browser/test_chat_page.py."""

from __future__ import annotations

import base64
import hashlib
import re
import types

import trio
from starlette.testclient import TestClient

from trillium.server.app import build_app
from trillium.server.page import content_security_policy


def _get_page():
    client = types.SimpleNamespace(model_name="m", stats=dict)  # the page calls nothing on it
    with TestClient(build_app(client, trio.Event())) as http:  # type: ignore[arg-type]
        return http.get("/")


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def test_the_page_is_served_at_the_root_with_its_policy():
    r = _get_page()
    assert r.status_code == 200 and r.headers["content-type"] == "text/html; charset=utf-8"
    html = r.text
    (script,) = re.findall(r"<script>(.*?)</script>", html, re.S)
    (style,) = re.findall(r"<style>(.*?)</style>", html, re.S)
    policy = dict(d.strip().split(" ", 1) for d in r.headers["content-security-policy"].split(";"))
    assert policy["script-src"] == _sha256(script) and policy["style-src"] == _sha256(style)
    assert policy["default-src"] == "'none'" and policy["connect-src"] == "'self'"
    assert r.headers["x-content-type-options"] == "nosniff"
    for needed in ("message-input", "send", "stop", "system-prompt", "temperature", "max-tokens", "api-key"):
        assert f'id="{needed}"' in html


def test_nothing_loads_from_outside():
    """Outside the script (which builds links to what the model writes), every src/href is a
    data: URL, and the style imports nothing."""
    html = _get_page().text
    markup = re.sub(r"<script>.*?</script>", "", html, flags=re.S)
    urls = re.findall(r"""\b(?:src|href)\s*=\s*["']?([^"'\s>]*)""", markup)
    assert urls and all(u.startswith("data:") for u in urls), urls
    assert "@import" not in html and "url(" not in html
    assert not re.search(r"<(?:script|link|img|iframe)\b[^>]*\bsrc=", html)


def test_policy_hashes_every_inline_element_and_ignores_comments():
    html = "<!-- <script>x</script> --><style>a{}</style><script>1</script><script>2</script>"
    policy = content_security_policy(html)
    assert f"script-src {_sha256('1')} {_sha256('2')};" in policy and f"style-src {_sha256('a{}')};" in policy
    assert _sha256("x") not in policy
    assert "script-src 'none'" in content_security_policy("<p>no script</p>")
