"""API keys and tenant limits through a real server: 401 without a known key, 429 with
``Retry-After`` and OpenAI's error JSON naming the limit, and concurrent bursts that get at most
one request more than a limit allows (a bucket refilling during the burst)."""

from __future__ import annotations

import httpx
import openai
import pytest
import trio

from tests.integration.metered import KEYS, LIMITS, MODEL, auth, sample, scrape, tenant_auth


@pytest.fixture
def http(metered_server):
    with httpx.Client(base_url=metered_server.base_url, timeout=120) as client:
        yield client


def completion(max_tokens: int = 1, **extra) -> dict:
    # A one-token prompt given as token ids: its size does not depend on the tokenizer.
    return {"model": MODEL, "prompt": [1], "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, **extra}


def assert_error(r: httpx.Response, status: int, code: str, param: str | None = None, type_: str | None = None):
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["code"] == code and error["param"] == param
    if type_ is not None:
        assert error["type"] == type_
    return error


def assert_rate_limited(r: httpx.Response, limit: str, kind: str, max_retry_after: int) -> dict:
    error = assert_error(r, 429, "rate_limit_exceeded", param=limit, type_=kind)
    assert 1 <= int(r.headers["retry-after"]) <= max_retry_after, r.headers
    return error


# ---- 401 ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "method, path, body",
    [
        ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}),
        ("POST", "/v1/completions", completion()),
        ("GET", "/v1/models", None),
        ("POST", "/tokenize", {"prompt": "hi"}),
        ("POST", "/detokenize", {"tokens": [1]}),
    ],
)
def test_every_api_route_needs_a_known_key(http, method, path, body):
    missing = http.request(method, path, json=body)
    assert_error(missing, 401, "missing_api_key")
    assert missing.headers["www-authenticate"] == "Bearer"
    for header in ({"Authorization": "Basic c2stdGVzdC1vcGVu"}, {"Authorization": "Bearer"}):
        assert_error(http.request(method, path, json=body, headers=header), 401, "missing_api_key")
    assert_error(http.request(method, path, json=body, headers=auth("sk-test-nobody")), 401, "invalid_api_key")
    assert http.request(method, path, json=body, headers=tenant_auth("open")).status_code == 200


def test_admin_key_is_not_a_tenant_key(http, metered_server):
    assert_error(
        http.post("/v1/completions", json=completion(), headers=auth(metered_server.admin_key)), 401, "invalid_api_key"
    )


def test_health_and_metrics_need_no_key(http):
    assert http.get("/health").status_code == 200
    assert http.get("/metrics").status_code == 200


def test_official_client_errors(metered_server):
    kwargs = {"base_url": metered_server.base_url + "/v1", "timeout": 60, "max_retries": 0}
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(api_key="sk-test-nobody", **kwargs).completions.create(model=MODEL, prompt="hi", max_tokens=1)
    with pytest.raises(openai.RateLimitError) as info:
        openai.OpenAI(api_key=KEYS["big"], **kwargs).completions.create(model=MODEL, prompt=[1], max_tokens=100)
    assert info.value.status_code == 429 and info.value.body["param"] == "max_tokens_per_request"


# ---- 429 ----------------------------------------------------------------------------------------


async def burst(base_url: str, tenant: str, payloads: list[dict]) -> list[httpx.Response]:
    """Send every payload at once; the responses in completion order."""
    responses = []
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:

        async def one(payload):
            responses.append(await client.post("/v1/completions", json=payload, headers=tenant_auth(tenant)))

        async with trio.open_nursery() as nursery:
            for payload in payloads:
                nursery.start_soon(one, payload)
    return responses


def test_requests_per_minute_burst(metered_server):
    limit = LIMITS["rpm"]["requests_per_minute"]
    responses = trio.run(burst, metered_server.base_url, "rpm", [completion()] * 8)
    ok = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code != 200]
    # The bucket starts full; during the burst it refills 1 request per 20 s at most.
    assert limit <= len(ok) <= limit + 1, [r.status_code for r in responses]
    for r in refused:
        error = assert_rate_limited(r, "requests_per_minute", "requests", max_retry_after=60 // limit)
        assert "requests per minute" in error["message"] and "'rpm'" in error["message"]
    with httpx.Client(timeout=60) as client:
        samples = scrape(client, metered_server.base_url, metered_server.admin_key)
        # Refused at admission: counted in the metrics, no usage record (nothing was admitted).
        assert sample(
            samples, "trillium:tenant_rate_limited_requests_total", tenant="rpm", limit="requests_per_minute"
        ) == len(refused)
        assert metered_server.usage(client, tenant="rpm")[0]["requests"] == len(ok)


def test_tokens_per_minute_burst(metered_server):
    # 1 prompt + 8 completion tokens each (ignore_eos: the reservation is used up, no refund).
    responses = trio.run(burst, metered_server.base_url, "tpm", [completion(max_tokens=8)] * 8)
    ok = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code != 200]
    assert 4 <= len(ok) <= 5, [r.status_code for r in responses]
    assert all(r.json()["usage"]["total_tokens"] == 9 for r in ok)
    for r in refused:
        error = assert_rate_limited(r, "tokens_per_minute", "tokens", max_retry_after=14)  # 9 tokens at 40/min
        assert "tokens per minute" in error["message"] and "requested 9" in error["message"]
    with httpx.Client(base_url=metered_server.base_url, timeout=60) as client:
        # More than the bucket holds: it can never fit, so the wait is the whole window.
        never = client.post("/v1/completions", json=completion(max_tokens=40), headers=tenant_auth("tpm"))
        error = assert_rate_limited(never, "tokens_per_minute", "tokens", max_retry_after=60)
        assert never.headers["retry-after"] == "60" and "never fit" in error["message"]
        # Refused after admission (the prompt had to be tokenized): each has a 'rejected' record.
        totals = metered_server.wait_for_requests(client, "tpm", len(responses) + 1)
        assert (totals["completed"], totals["rejected"]) == (len(ok), len(refused) + 1)
        assert totals["total_tokens"] == 9 * len(ok)
        assert {r["http_status"] for r in metered_server.ledger_rows("tpm") if r["status"] == "rejected"} == {429}


async def hold_streams(base_url: str, tenant: str, count: int) -> tuple[list[int], list[httpx.Response]]:
    """Open ``count`` long streams at once and keep the accepted ones generating until every
    request has its answer; then hang up. The statuses, and the refused responses."""
    statuses: list[int] = []
    refused: list[httpx.Response] = []
    answered, release = trio.Event(), trio.Event()

    async def one(client):
        payload = completion(max_tokens=500, stream=True)
        async with client.stream("POST", "/v1/completions", json=payload, headers=tenant_auth(tenant)) as r:
            statuses.append(r.status_code)
            if len(statuses) == count:
                answered.set()
            if r.status_code != 200:
                await r.aread()
                refused.append(r)
                return
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    break  # generating: hold the slot until every request has its answer
            await release.wait()
        # Leaving the block mid-stream closes the connection: the server aborts the request.

    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client, trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(one, client)
        with trio.fail_after(60):
            await answered.wait()
        release.set()
    return statuses, refused


def test_concurrent_requests_limit(metered_server):
    limit = LIMITS["conc"]["max_concurrent_requests"]
    statuses, refused = trio.run(hold_streams, metered_server.base_url, "conc", 3 * limit)
    assert sorted(statuses) == [200] * limit + [429] * (2 * limit)
    for r in refused:
        assert_rate_limited(r, "max_concurrent_requests", "requests", max_retry_after=1)
    with httpx.Client(base_url=metered_server.base_url, timeout=60) as client:
        totals = metered_server.wait_for_requests(client, "conc", limit)
        assert totals["aborted"] == limit  # the client hung up mid-stream
        # Their slots are free again.
        assert client.post("/v1/completions", json=completion(), headers=tenant_auth("conc")).status_code == 200
        metered_server.wait_for_requests(client, "conc", limit + 1)
        samples = scrape(client, metered_server.base_url, metered_server.admin_key)
        assert (
            sample(
                samples, "trillium:tenant_rate_limited_requests_total", tenant="conc", limit="max_concurrent_requests"
            )
            == 2 * limit
        )


def test_max_tokens_per_request(http):
    headers = tenant_auth("big")
    cap = LIMITS["big"]["max_tokens_per_request"]
    over = http.post("/v1/completions", json=completion(max_tokens=cap), headers=headers)  # 1 + 48 > 48
    error = assert_rate_limited(over, "max_tokens_per_request", "tokens", max_retry_after=60)
    assert over.headers["retry-after"] == "60" and f"max tokens per request {cap}" in error["message"]
    # n choices count n times.
    assert_rate_limited(
        http.post("/v1/completions", json=completion(max_tokens=16, n=3), headers=headers),
        "max_tokens_per_request",
        "tokens",
        max_retry_after=60,
    )
    ok = http.post("/v1/completions", json=completion(max_tokens=8, n=2), headers=headers)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 16
    # Without max_tokens, chat gets what the limit leaves after the prompt.
    chat = http.post(
        "/v1/chat/completions",
        headers=headers,
        json={"model": MODEL, "messages": [{"role": "user", "content": "Tell me a long story."}], "temperature": 0},
    )
    assert chat.status_code == 200, chat.text
    assert chat.json()["usage"]["total_tokens"] <= cap
