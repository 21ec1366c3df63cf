"""Real concurrency against a real server: 16 streams, disconnects, a responsive event loop, shutdown."""

from __future__ import annotations

import json
import signal
import time

import httpx
import pytest
import trio

from tests.integration.conftest import SERVER_ARGS, ServerProcess

MODEL = "SmolLM2-135M-Instruct"
TOPICS = [
    "the sea",
    "a robot",
    "winter",
    "coffee",
    "a city at night",
    "mountains",
    "a cat",
    "music",
    "the moon",
    "a library",
    "rain",
    "an old friend",
    "trains",
    "a garden",
    "fire",
    "bread",
]


def body(topic: str, max_tokens: int = 16, stream: bool = True) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"Write one sentence about {topic}."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }


async def stream_text(client: httpx.AsyncClient, payload: dict) -> tuple[str, str]:
    text, finish = [], None
    async with client.stream("POST", "/v1/chat/completions", json=payload) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line or line == "data: [DONE]":
                continue
            choice = json.loads(line[len("data: ") :])["choices"][0]
            text.append(choice["delta"].get("content") or "")
            finish = choice["finish_reason"] or finish
    return "".join(text), finish


async def wait_idle(client: httpx.AsyncClient, timeout: float = 10) -> dict:
    with trio.fail_after(timeout):
        while True:
            stats = (await client.get("/stats")).json()
            if stats["num_blocks_in_use"] == 0 and stats["num_requests_running"] == 0:
                return stats
            await trio.sleep(0.05)


async def test_sixteen_concurrent_streams_match_sequential_outputs(server):
    async with httpx.AsyncClient(base_url=server.base_url, timeout=300) as client:
        alone = {}
        for topic in TOPICS:
            r = await client.post("/v1/chat/completions", json=body(topic, stream=False))
            alone[topic] = r.json()["choices"][0]["message"]["content"]
        together = {}

        async def one(topic):
            together[topic] = await stream_text(client, body(topic))

        async with trio.open_nursery() as nursery:
            for topic in TOPICS:
                nursery.start_soon(one, topic)
        for topic in TOPICS:
            assert together[topic][0] == alone[topic], topic
            assert together[topic][1] in ("stop", "length")
        await wait_idle(client)


async def test_client_disconnect_frees_blocks(server):
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
        await wait_idle(client)
        async with client.stream(
            "POST", "/v1/chat/completions", json={**body("the sea", 1500), "ignore_eos": True}
        ) as r:
            seen = 0
            async for line in r.aiter_lines():
                seen += bool(line)
                if seen >= 5:
                    break
            stats = (await client.get("/stats")).json()
            assert stats["num_blocks_in_use"] > 0  # it really was holding KV
        # leaving the `with` closed the connection mid-stream: its blocks are released at once
        await wait_idle(client, timeout=5)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_a_client_that_gives_up_on_a_whole_response_frees_its_blocks(server, path):
    """Not streamed: the response would come only at the end, so nothing is ever sent that could
    fail; the server must notice the disconnect itself (server/disconnect.py)."""
    payload = {"model": MODEL, "max_tokens": 1500, "ignore_eos": True}
    payload |= (
        {"messages": [{"role": "user", "content": "Tell a long story."}]} if "chat" in path else {"prompt": "Once"}
    )
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
        await wait_idle(client)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: client.post(path, json=payload))
            with trio.fail_after(30):
                while (await client.get("/stats")).json()["num_blocks_in_use"] == 0:
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()  # the client gives up: its connection closes
        stats = await wait_idle(client, timeout=5)  # 1,500 tokens would take far longer
        assert stats["num_requests_running"] == 0


async def test_health_answers_while_the_engine_is_busy(server):
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as client:
        latencies = []

        async def load():
            payload = {"model": MODEL, "prompt": "tell me a story " * 400, "max_tokens": 64, "ignore_eos": True}
            await client.post("/v1/completions", json=payload)

        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(load)
            with trio.fail_after(30):  # until the long prefills are running
                while (await client.get("/stats")).json()["num_requests_running"] == 0:
                    await trio.sleep(0.02)
            for _ in range(10):
                t0 = time.perf_counter()
                assert (await client.get("/health")).status_code == 200
                latencies.append(time.perf_counter() - t0)
                await trio.sleep(0.05)
        latencies.sort()
        # A blocked event loop would stall /health for a whole prefill step (~1 s here).
        assert latencies[len(latencies) // 2] < 0.25, latencies


def test_sigterm_finishes_in_flight_streams_and_exits_cleanly():
    srv = ServerProcess(*SERVER_ARGS)
    try:
        with httpx.Client(base_url=srv.base_url, timeout=60) as client:
            with client.stream(
                "POST",
                "/v1/completions",
                json={"model": MODEL, "prompt": "Count:", "max_tokens": 40, "ignore_eos": True, "stream": True},
            ) as r:
                lines = r.iter_lines()
                first = next(line for line in lines if line)
                assert first.startswith("data: ")
                srv.proc.send_signal(signal.SIGTERM)
                rest = [line for line in lines if line]
            assert rest[-1] == "data: [DONE]"  # the in-flight stream was finished, not cut
            tokens = 1 + sum(1 for line in rest[:-1] if "text_completion" in line)
            assert tokens >= 2
        assert srv.proc.wait(30) == 0
    finally:
        srv.stop()
    assert "shutting down" in srv.log()
