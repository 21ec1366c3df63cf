"""The OpenAPI document (server/openapi.py): a valid OpenAPI 3.1 document that documents
exactly the app's routes. That responses match it is the fuzz test's job
(tests/integration/test_openapi_fuzz.py)."""

from __future__ import annotations

import types

import jsonschema
import msgspec
import pytest
import trio
from schemathesis.specs.openapi.definitions import OPENAPI_31  # the OpenAPI 3.1 meta-schema
from starlette.routing import Route
from starlette.testclient import TestClient

from trillium.server.app import build_app
from trillium.server.openapi import OPENAPI_PATH, OPERATIONS, build_document, openapi_route, route_endpoints


def _app():
    client = types.SimpleNamespace(model_name="m", stats=dict)  # building routes calls nothing on it
    return build_app(client, trio.Event())  # type: ignore[arg-type]


def test_document_is_valid_openapi_3_1():
    doc = build_document(list(OPERATIONS))
    jsonschema.Draft202012Validator(OPENAPI_31).validate(doc)
    for schema in doc["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(schema)
    # every $ref resolves
    refs = {v for v in _walk(doc) if isinstance(v, str) and v.startswith("#/components/schemas/")}
    assert refs and {r.rsplit("/", 1)[1] for r in refs} <= set(doc["components"]["schemas"])


def test_app_serves_the_document_of_its_own_routes():
    app = _app()
    documented = {
        (m.upper(), p) for p, item in build_document(route_endpoints(app.routes))["paths"].items() for m in item
    }
    served = {(m, r.path) for r in app.routes if isinstance(r, Route) for m in (r.methods or set()) - {"HEAD"}}
    assert documented == served and ("GET", OPENAPI_PATH) in served
    with TestClient(app) as http:
        r = http.get(OPENAPI_PATH)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    doc = msgspec.json.decode(r.content)
    assert set(doc["paths"]) == {p for _, p in served}


def test_an_undocumented_route_is_refused():
    async def handler(request):  # pragma: no cover - never served
        raise AssertionError

    with pytest.raises(LookupError, match="POST /v1/embeddings has no entry"):
        openapi_route([Route("/v1/embeddings", handler, methods=["POST"])])


def test_errors_and_bodies_are_documented():
    doc = build_document(list(OPERATIONS))
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ChatCompletionRequest"
    }
    assert {"200", "400", "401", "404", "413", "429", "500", "503"} <= set(chat["responses"])
    assert set(chat["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
    assert chat["responses"]["503"]["headers"]["Retry-After"]["required"] is True
    error = doc["components"]["schemas"]["ErrorDetail"]
    assert set(error["required"]) == {"message", "type", "param", "code"}
    stats = doc["paths"]["/stats"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert stats == {
        "allOf": [{"$ref": "#/components/schemas/SchedulerStats"}, {"$ref": "#/components/schemas/GrammarStats"}]
    }


def _walk(value):
    yield value
    if isinstance(value, dict):
        for v in value.values():
            yield from _walk(v)
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v)
