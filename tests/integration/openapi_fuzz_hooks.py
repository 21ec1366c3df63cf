"""schemathesis hooks and checks for the fuzz run (``SCHEMATHESIS_HOOKS`` names this module;
tests/integration/test_openapi_fuzz.py). ``TRILLIUM_FUZZ_URL`` is the server under test."""

from __future__ import annotations

import os
from typing import Any

import httpx
import schemathesis

MAX_NEW_TOKENS = 3
MAX_N = 2
MAX_PROMPTS = 4  # prompts in one completions request
_GENERATE = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages")
# Any name starting with this is the served model on the Messages routes.
CLAUDE = "claude-fuzz"


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    """Cap what a generation request asks for: the document allows up to the context length,
    which the fuzz budget cannot afford. Only ints too large are changed, so a case that is
    invalid (a wrong type) stays invalid and a valid one stays valid."""
    body = case.body
    if case.path.startswith("/v1/messages") and isinstance(body, dict) and isinstance(body.get("model"), str):
        body["model"] = CLAUDE  # a random name is a 404 before anything else is looked at
    if case.path not in _GENERATE or not isinstance(body, dict):
        return
    caps = {
        "max_tokens": MAX_NEW_TOKENS,
        "max_completion_tokens": MAX_NEW_TOKENS,
        "max_output_tokens": MAX_NEW_TOKENS,
        "min_tokens": MAX_NEW_TOKENS,
        "n": MAX_N,
    }
    for field, cap in caps.items():
        if type(body.get(field)) is int and body[field] > cap:
            body[field] = cap
    if case.path == "/v1/responses":
        if body.get("max_output_tokens") is None:
            body["max_output_tokens"] = MAX_NEW_TOKENS  # the default is all the context left
    elif case.path == "/v1/messages":
        pass  # max_tokens is required there: a case without it is refused
    elif body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = MAX_NEW_TOKENS  # chat's default is all the context left
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) and len(prompt) > MAX_PROMPTS:
        del prompt[MAX_PROMPTS:]  # a batch of prompts (still at least one)


@schemathesis.check
def openai_error_shape(ctx: Any, response: Any, case: Any) -> None:
    """Every error is OpenAI's ``{"error": {"message", "type", "param", "code"}}``, on the Messages
    routes Anthropic's ``{"type": "error", "error": {"type", "message"}}`` (the health probes
    answer 503 with their own body, as documented)."""
    if response.status_code < 400 or case.path.startswith("/health"):
        return
    try:
        body = response.json()
        error = body.get("error")
    except ValueError:
        body = error = None
    if case.path.startswith("/v1/messages"):
        assert isinstance(error, dict) and body["type"] == "error", f"not an Anthropic error: {response.text[:500]!r}"
        assert set(error) == {"type", "message"} and error["message"], f"error fields: {sorted(error)}"
        return
    assert isinstance(error, dict), f"{response.status_code} is not an OpenAI error object: {response.text[:500]!r}"
    assert set(error) == {"message", "type", "param", "code"}, f"error fields: {sorted(error)}"
    assert isinstance(error["message"], str) and error["message"], "empty error message"


@schemathesis.check
def server_still_healthy(ctx: Any, response: Any, case: Any) -> None:
    """The server is live after every case (a crash or a wedged actor fails the case that caused it)."""
    r = httpx.get(os.environ["TRILLIUM_FUZZ_URL"] + "/health", timeout=30)
    assert r.status_code == 200, f"/health after this case: {r.status_code} {r.text[:500]}"
