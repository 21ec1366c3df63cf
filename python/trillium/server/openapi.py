"""The OpenAPI 3.1 document served at ``GET /openapi.json``.

Generated, so that it cannot drift: request bodies are the msgspec Structs the routes decode
(``schema.py``), response bodies the Structs of ``response_schema.py`` (the fuzz test checks
real responses against them) and of ``protocol/`` (``/stats``, ``/v1/usage``). The paths are the
app's own routes: :func:`openapi_route` documents each route from :data:`OPERATIONS` and refuses
(at ``build_app``) a route that has no entry there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from trillium.protocol.stats import GrammarStats, SchedulerStats
from trillium.server import anthropic_shapes as anthropic
from trillium.server import response_schema as out
from trillium.server.responses_body import ResponsesRequest
from trillium.server.schema import ChatCompletionRequest, CompletionRequest, DetokenizeBody, TokenizeBody

OPENAPI_PATH = "/openapi.json"
_REF = "#/components/schemas/{name}"

# Every error status the server answers, and when. The body is an ErrorResponse.
_ERRORS = {
    400: "Malformed JSON, a value of the wrong type or out of range; `error.param` names the field.",
    401: "Missing or unknown API key (only when the server runs with `--config`).",
    403: "A tenant's API key where the admin key is needed.",
    404: "Unknown `model` (the server serves one), no usage ledger, or no `--config` file.",
    413: "The request body is too large.",
    422: "The config file is invalid (the message names the entry); the config in force stays.",
    429: "Over one of the tenant's limits, or too many failed authentications from this address; "
    "retry after `Retry-After` seconds.",
    500: "Generation failed, or a server bug.",
    503: "Overloaded or shutting down; retry after `Retry-After` seconds.",
}
_RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait.", "required": True, "schema": {"type": "integer"}}}
_HEADERS = {
    401: {"WWW-Authenticate": {"required": True, "schema": {"type": "string"}}},
    429: _RETRY_AFTER,
    503: _RETRY_AFTER,
}
_GENERATE_ERRORS = (400, 401, 404, 413, 429, 500, 503)
_TOKENIZE_ERRORS = (400, 401, 404, 413, 429, 500, 503)


@dataclasses.dataclass(frozen=True)
class Operation:
    """One route's entry in the document."""

    operation_id: str
    summary: str
    ok: tuple[type, ...] = ()  # the 200 JSON body: all of these Structs' fields; () with ``raw``
    raw: tuple[str, dict[str, Any]] | None = None  # a 200 body that is no Struct: (media type, schema)
    body: type | None = None  # the JSON request body
    stream: type | None = None  # with ``"stream": true``, each SSE event's ``data`` is one of these
    errors: tuple[int, ...] = ()  # statuses answered with an ErrorResponse
    auth: bool = False  # takes ``Authorization: Bearer <key>`` or ``x-api-key`` (required with ``--config``)
    query: tuple[tuple[str, str], ...] = ()  # optional string query parameters: (name, description)
    probe: bool = False  # a health probe: a 503 has the 200 body's shape, not an ErrorResponse
    path: tuple[tuple[str, str], ...] = ()  # string path parameters: (name, description)
    headers: tuple[tuple[str, str], ...] = ()  # optional string request headers: (name, description)
    error_body: type = out.ErrorResponse  # every error's body (Anthropic's on the Messages routes)
    named_events: bool = False  # the stream's events have an ``event:`` name and no ``[DONE]`` ends it


_RESPONSE_PATH = "/v1/responses/{response_id}"
_RESPONSE_ID = (("response_id", "The response's id (resp_...)."),)
_ANTHROPIC_HEADERS = (
    ("anthropic-version", "Accepted and not needed (one version of the API is served)."),
    ("anthropic-beta", "Accepted and not needed."),
)

# (method, path) -> its entry. A route in app.py without one here fails build_app.
OPERATIONS: dict[tuple[str, str], Operation] = {
    ("GET", "/"): Operation(
        "chatPage",
        "The chat page: one self-contained HTML page, a client of /v1/models and /v1/chat/completions.",
        raw=("text/html", {"type": "string"}),
    ),
    ("GET", "/health"): Operation(
        "health", "Liveness: 503 when a step hangs or an actor stopped.", ok=(out.Liveness,), probe=True
    ),
    ("GET", "/health/ready"): Operation(
        "ready", "Readiness: 503 while starting, draining or restarting an actor.", ok=(out.Readiness,), probe=True
    ),
    ("GET", "/get_load"): Operation("get_load", "Requests running plus waiting (vllm-router's load).", ok=(out.Load,)),
    ("POST", "/flush_cache"): Operation(
        "flush_cache",
        "Drop every cached prefix no running request holds (vllm-router fans it out to workers). "
        "Admin key with `--config`.",
        ok=(out.CacheFlushed,),
        errors=(401, 403, 429, 503),
        auth=True,
    ),
    ("GET", "/get_server_info"): Operation(
        "get_server_info", "The served model, context length and KV block size.", ok=(out.ServerInfo,)
    ),
    ("GET", "/stats"): Operation(
        "stats",
        "Scheduler, KV-pool and grammar counters. Admin key with `--config`.",
        ok=(SchedulerStats, GrammarStats),
        errors=(401, 403, 429),
        auth=True,
    ),
    ("GET", "/metrics"): Operation(
        "metrics",
        "Prometheus metrics. With `--config`, the per-tenant series (`trillium:tenant_*`) only with the "
        "admin key; without a key, the others.",
        raw=("text/plain", {"type": "string"}),
        errors=(401, 403, 429),
        auth=True,
    ),
    ("POST", "/v1/admin/reload"): Operation(
        "reloadConfig",
        "Re-read the `--config` file and the TLS certificate files (as SIGHUP does): new keys work at "
        "once, removed keys get 401, running streams finish; an invalid file is refused (422) and the "
        "config in force stays (admin key).",
        ok=(out.ConfigReloaded,),
        errors=(401, 403, 404, 422, 429),
        auth=True,
    ),
    ("GET", "/v1/usage"): Operation(
        "usage",
        "Per-tenant usage totals from the ledger (admin key).",
        ok=(out.UsageReport,),
        errors=(400, 401, 403, 404, 429, 503),
        auth=True,
        query=(
            ("since", "Start: a unix time, an ISO date/time, or an age such as `24h` (default: all)."),
            ("until", "End, in the same forms (default: now)."),
            ("tenant", "Only this tenant."),
        ),
    ),
    ("GET", "/v1/models"): Operation(
        "listModels", "The one model this server serves.", ok=(out.ModelList,), errors=(401, 429), auth=True
    ),
    ("POST", "/v1/chat/completions"): Operation(
        "createChatCompletion",
        "OpenAI chat completion (vLLM's extensions: top_k, min_p, structured_outputs, ...).",
        ok=(out.ChatCompletion,),
        body=ChatCompletionRequest,
        stream=out.ChatCompletionChunk,
        errors=_GENERATE_ERRORS,
        auth=True,
    ),
    ("POST", "/v1/completions"): Operation(
        "createCompletion",
        "OpenAI legacy completion of a text prompt or of token ids.",
        ok=(out.Completion,),
        body=CompletionRequest,
        stream=out.Completion,
        errors=_GENERATE_ERRORS,
        auth=True,
    ),
    ("POST", "/v1/responses"): Operation(
        "createResponse",
        "OpenAI Responses API: text or message input, instructions, text.format, function tools, "
        "previous_response_id (responses kept in memory, bounded).",
        ok=(out.ResponseObject,),
        body=ResponsesRequest,
        stream=out.ResponseStreamEvent,
        errors=_GENERATE_ERRORS,
        auth=True,
    ),
    ("GET", _RESPONSE_PATH): Operation(
        "getResponse",
        "A stored response (store=true), while this server keeps it.",
        ok=(out.ResponseObject,),
        errors=(401, 404, 429),
        auth=True,
        path=_RESPONSE_ID,
    ),
    ("DELETE", _RESPONSE_PATH): Operation(
        "deleteResponse",
        "Forget a stored response.",
        ok=(out.ResponseDeleted,),
        errors=(401, 404, 429),
        auth=True,
        path=_RESPONSE_ID,
    ),
    ("POST", "/v1/messages"): Operation(
        "createMessage",
        "Anthropic's Messages API: system prompt, text, tool_use and tool_result blocks, tools and "
        "tool_choice, stop_sequences, streaming events. Any model name starting with `claude` is the "
        "served model. Errors in Anthropic's shape.",
        ok=(anthropic.AnthropicMessage,),
        body=anthropic.MessagesRequest,
        stream=anthropic.AnthropicStreamEvent,
        errors=_GENERATE_ERRORS,
        auth=True,
        headers=_ANTHROPIC_HEADERS,
        error_body=anthropic.AnthropicErrorResponse,
        named_events=True,
    ),
    ("POST", "/v1/messages/count_tokens"): Operation(
        "countMessageTokens",
        "Anthropic's count_tokens: the prompt tokens a /v1/messages request with these messages, "
        "system prompt and tools would run (chat template applied).",
        ok=(anthropic.AnthropicTokenCount,),
        body=anthropic.CountTokensRequest,
        errors=_TOKENIZE_ERRORS,
        auth=True,
        headers=_ANTHROPIC_HEADERS,
        error_body=anthropic.AnthropicErrorResponse,
    ),
    ("POST", "/tokenize"): Operation(
        "tokenize",
        "vLLM's tokenize: a prompt, or chat messages through the chat template.",
        ok=(out.TokenizeResponse,),
        body=TokenizeBody,
        errors=_TOKENIZE_ERRORS,
        auth=True,
    ),
    ("POST", "/v1/chat/completions/render"): Operation(
        "renderChatCompletion",
        "vLLM's render: a chat request's prompt token ids (template and tools applied), not run. "
        "vllm-router's kv_aware policy scores replicas by them.",
        ok=(out.RenderedPrompt,),
        body=ChatCompletionRequest,
        errors=_TOKENIZE_ERRORS,
        auth=True,
    ),
    ("POST", "/v1/completions/render"): Operation(
        "renderCompletion",
        "vLLM's render: a completion request's (first) prompt token ids, not run.",
        ok=(out.RenderedPrompt,),
        body=CompletionRequest,
        errors=_TOKENIZE_ERRORS,
        auth=True,
    ),
    ("POST", "/detokenize"): Operation(
        "detokenize",
        "vLLM's detokenize: token ids to text.",
        ok=(out.DetokenizeResponse,),
        body=DetokenizeBody,
        errors=_TOKENIZE_ERRORS,
        auth=True,
    ),
    ("GET", OPENAPI_PATH): Operation(
        "openapi", "This document.", raw=("application/json", {"type": "object", "description": "OpenAPI 3.1"})
    ),
}


def openapi_route(routes: Sequence[BaseRoute]) -> Route:
    """``GET /openapi.json``, documenting ``routes`` and itself; the document is built and
    encoded once, here. Raises LookupError naming a route that :data:`OPERATIONS` lacks."""
    encoded = msgspec.json.encode(build_document([*route_endpoints(routes), ("GET", OPENAPI_PATH)]))

    async def serve(request: Request) -> Response:
        return Response(encoded, media_type="application/json")

    return Route(OPENAPI_PATH, serve, methods=["GET"])


def route_endpoints(routes: Sequence[BaseRoute]) -> list[tuple[str, str]]:
    """(method, path) of each plain Starlette route, without the HEAD starlette adds to GET."""
    endpoints: list[tuple[str, str]] = []
    for route in routes:
        if not isinstance(route, Route):
            raise LookupError(f"{route!r}: only plain routes can be documented")
        endpoints.extend((method, route.path) for method in sorted((route.methods or set()) - {"HEAD"}))
    return endpoints


def build_document(endpoints: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """The OpenAPI document of these (method, path) endpoints. Raises LookupError naming one
    that :data:`OPERATIONS` lacks."""
    found: list[tuple[str, str, Operation]] = []
    for method, path in endpoints:
        op = OPERATIONS.get((method, path))
        if op is None:
            raise LookupError(f"route {method} {path} has no entry in server/openapi.py OPERATIONS")
        found.append((path, method.lower(), op))
    types = sorted(
        {out.ErrorResponse}
        | {t for _, _, op in found for t in (*op.ok, op.body, op.stream, op.error_body) if t is not None},
        key=lambda t: t.__name__,
    )
    refs, components = msgspec.json.schema_components(types, ref_template=_REF)
    ref = dict(zip(types, refs))
    paths: dict[str, dict[str, Any]] = {}
    for path, method, op in found:
        paths.setdefault(path, {})[method] = _operation(op, ref)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "trillium",
            "version": package_version(),
            "description": "An OpenAI-compatible LLM inference server. Errors are OpenAI's "
            '`{"error": {"message", "type", "param", "code"}}`, on the Messages routes Anthropic\'s '
            '`{"type": "error", "error": {"type", "message"}}`. A key goes in `Authorization: Bearer` '
            "or `x-api-key`.",
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            },
        },
    }


def _operation(op: Operation, ref: dict[type, dict[str, Any]]) -> dict[str, Any]:
    ok_schema = ref[op.ok[0]] if len(op.ok) == 1 else {"allOf": [ref[t] for t in op.ok]}
    ok_content: dict[str, Any] = {op.raw[0]: {"schema": op.raw[1]}} if op.raw else {}
    if op.ok:
        ok_content["application/json"] = {"schema": ok_schema}
    error = ref[op.error_body]
    if op.stream is not None:
        ok_content["text/event-stream"] = {"schema": _sse_event(ref[op.stream], error, op.named_events)}
    responses: dict[str, Any] = {"200": {"description": "OK", "content": ok_content}}
    if op.probe:
        responses["503"] = {
            "description": "Not live, or not ready; `reasons` says why.",
            "content": {"application/json": {"schema": ok_schema}},
            "headers": {"Retry-After": {**_RETRY_AFTER["Retry-After"], "required": False}},
        }
    for status in op.errors:
        response: dict[str, Any] = {
            "description": _ERRORS[status],
            "content": {"application/json": {"schema": error}},
        }
        if status in _HEADERS:
            response["headers"] = _HEADERS[status]
        responses[str(status)] = response
    doc: dict[str, Any] = {"operationId": op.operation_id, "summary": op.summary, "responses": responses}
    if op.body is not None:
        doc["requestBody"] = {"required": True, "content": {"application/json": {"schema": ref[op.body]}}}
    parameters = [
        {"name": name, "in": "path", "required": True, "description": text, "schema": {"type": "string"}}
        for name, text in op.path
    ] + [
        {"name": name, "in": where, "required": False, "description": text, "schema": {"type": "string"}}
        for where, params in (("query", op.query), ("header", op.headers))
        for name, text in params
    ]
    if parameters:
        doc["parameters"] = parameters
    if op.auth:
        doc["security"] = [{}, {"bearer": []}, {"apiKey": []}]  # none without --config
    return doc


def _sse_event(chunk: dict[str, Any], error: dict[str, Any], named: bool) -> dict[str, Any]:
    """One server-sent event (OpenAPI 3.1 has ``schema`` describe each event): ``data`` is a
    JSON chunk, an error as the last event of a failed stream, or the final ``[DONE]``; or, with
    ``named`` (Anthropic's framing), an ``event`` name (the chunk's ``type``) and no ``[DONE]``."""
    data: dict[str, Any] = {
        "type": "string",
        "contentMediaType": "application/json",
        "contentSchema": {"anyOf": [chunk, error]},
    }
    if named:
        properties = {"event": {"type": "string"}, "data": data}
        return {"type": "object", "properties": properties, "required": ["event", "data"]}
    return {"type": "object", "properties": {"data": {"anyOf": [{"const": "[DONE]"}, data]}}, "required": ["data"]}


def package_version() -> str:
    """The installed trillium's version ("0.0.0" when run from a source tree)."""
    try:
        return version("trillium")
    except PackageNotFoundError:  # running from a source tree
        return "0.0.0"
