"""Overload: 10x more concurrent requests than the waiting queue's bound; every one is answered
(200, or 503 with Retry-After), none hangs, and the server serves normally afterwards."""

from __future__ import annotations

import httpx
import trio

from tests.integration.conftest import MAX_WAITING


def body(i: int, *, stream: bool, user: str) -> dict:
    return {
        "messages": [{"role": "user", "content": f"Count to {i}."}],
        "max_tokens": 4,
        "temperature": 0,
        "stream": stream,
        "user": user,
    }


async def one(client: httpx.AsyncClient, i: int) -> httpx.Response:
    # Two tenants (the open server's tenant is the `user` field), half of the requests streamed.
    payload = body(i, stream=i % 2 == 0, user="flood" if i % 5 else "steady")
    response = await client.post("/v1/chat/completions", json=payload)
    await response.aread()
    return response


def test_ten_times_the_queue_bound_all_answered(small_queue_server):
    responses: list[httpx.Response] = []

    async def main() -> None:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(base_url=small_queue_server.base_url, timeout=60, limits=limits) as client:

            async def run(i: int) -> None:
                responses.append(await one(client, i))

            with trio.fail_after(90):  # none hangs
                async with trio.open_nursery() as nursery:
                    for i in range(10 * MAX_WAITING):
                        nursery.start_soon(run, i)

    trio.run(main)
    statuses = [r.status_code for r in responses]
    assert len(statuses) == 10 * MAX_WAITING
    assert set(statuses) <= {200, 429, 503}, statuses
    assert 200 in statuses and 503 in statuses, statuses
    for r in responses:
        if r.status_code != 200:
            assert r.headers["Retry-After"], r.headers
            assert r.json()["error"]["type"] == "server_overloaded"
        elif r.headers["content-type"].startswith("text/event-stream"):
            assert r.text.rstrip().endswith("data: [DONE]") and '"error"' not in r.text

    with httpx.Client(base_url=small_queue_server.base_url, timeout=60) as http:
        stats = http.get("/stats").json()
        assert stats["num_requests_waiting"] == 0 and stats["num_requests_running"] == 0
        after = http.post("/v1/chat/completions", json=body(1, stream=False, user="steady"))
        assert after.status_code == 200, after.text


def test_priority_is_range_checked(small_queue_server):
    with httpx.Client(base_url=small_queue_server.base_url, timeout=60) as http:
        bad = http.post("/v1/chat/completions", json={**body(1, stream=False, user="u"), "priority": 2**40})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "priority"
        good = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "priority": -3})
        assert good.status_code == 200, good.text
