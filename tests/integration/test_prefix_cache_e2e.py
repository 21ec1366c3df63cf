"""Prefix caching through the real server: same outputs, cached_tokens reported, tenants isolated."""

from __future__ import annotations

import json
import time

import httpx
import pytest
import trio

from tests.integration.conftest import SERVER_ARGS, ServerProcess

MODEL = "SmolLM2-135M-Instruct"
SYSTEM = " ".join(f"Rule {i}: answer politely and briefly, citing rule {i}." for i in range(1, 80))


@pytest.fixture(scope="module")
def uncached_server():
    srv = ServerProcess(*SERVER_ARGS, "--no-prefix-cache")
    yield srv
    srv.stop()


def chat(base_url: str, messages, **kw) -> dict:
    r = httpx.post(
        base_url + "/v1/chat/completions",
        timeout=120,
        json={"model": MODEL, "messages": messages, "temperature": 0, "max_tokens": 24, **kw},
    )
    assert r.status_code == 200, r.text
    return r.json()


def completion(base_url: str, prompt: str, **kw) -> dict:
    r = httpx.post(
        base_url + "/v1/completions",
        timeout=120,
        json={"model": MODEL, "prompt": prompt, "temperature": 0, "max_tokens": 16, **kw},
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_greedy_outputs_identical_with_cache_on_and_off(server, uncached_server):
    base = "The history of the printing press begins in"
    # prompts sharing a prefix that ends inside a block, in an order that hits partial blocks
    prompts = [
        base + " Europe.",
        base + " China, where",
        base,
        base + " Europe. Then",
        "Completely different text about cats.",
        base + " China, where",
    ]
    for prompt in prompts:
        cached = completion(server.base_url, prompt)
        plain = completion(uncached_server.base_url, prompt)
        assert cached["choices"][0]["text"] == plain["choices"][0]["text"], prompt
        assert plain["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_shared_system_prompt_is_reused_by_concurrent_requests(server):
    first = chat(server.base_url, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi 0"}])
    assert first["usage"]["prompt_tokens"] > 1000
    results = {}

    async def one(i):
        async with httpx.AsyncClient(base_url=server.base_url, timeout=300) as client:
            r = await client.post(
                "/v1/chat/completions",
                json={
                    "model": MODEL,
                    "temperature": 0,
                    "max_tokens": 8,
                    "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Question {i}?"}],
                },
            )
            results[i] = r.json()["usage"]

    async def all_():
        async with trio.open_nursery() as nursery:
            for i in range(1, 20):
                nursery.start_soon(one, i)

    trio.run(all_)
    for usage in results.values():
        assert usage["prompt_tokens_details"]["cached_tokens"] >= 960, usage


def test_multi_turn_chat_reuses_the_previous_turn(server):
    turn1 = [{"role": "user", "content": "Tell me a fact about the Moon. " + SYSTEM[:600]}]
    answer = chat(server.base_url, turn1, max_tokens=40)
    text = answer["choices"][0]["message"]["content"]
    turn2 = [*turn1, {"role": "assistant", "content": text}, {"role": "user", "content": "And about Mars?"}]
    second = chat(server.base_url, turn2)
    # the first turn's prompt and (most of) its answer come from the cache
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= answer["usage"]["prompt_tokens"] - 16


def test_cache_salt_isolates_tenants(server):
    prompt = "Tenant secret preamble: " + "blue " * 100
    completion(server.base_url, prompt, cache_salt="tenant-a")
    same_tenant = completion(server.base_url, prompt, cache_salt="tenant-a")
    other_tenant = completion(server.base_url, prompt, cache_salt="tenant-b")
    assert same_tenant["usage"]["prompt_tokens_details"]["cached_tokens"] > 64
    assert other_tenant["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert same_tenant["choices"][0]["text"] == other_tenant["choices"][0]["text"]


def test_streamed_usage_reports_cached_tokens(server):
    prompt = "Streaming preamble " * 40
    completion(server.base_url, prompt)
    with httpx.stream(
        "POST",
        server.base_url + "/v1/completions",
        timeout=60,
        json={
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": 4,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: {")]
    usage = json.loads(lines[-1][6:])["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] >= usage["prompt_tokens"] - 16


def test_flush_cache_drops_the_cached_prefixes(server):
    """``POST /flush_cache`` (vllm-router fans it out to every worker): what was cached is gone,
    so the same prompt is computed again."""
    messages = [{"role": "user", "content": "Flush test. " + SYSTEM[:800]}]
    chat(server.base_url, messages)
    assert chat(server.base_url, messages)["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    r = httpx.post(server.base_url + "/flush_cache", timeout=30)
    assert r.status_code == 200 and r.json() == {"status": "flushing"}
    for _ in range(100):
        if httpx.get(server.base_url + "/stats", timeout=30).json()["num_cached_blocks"] == 0:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the prefix cache still holds blocks after /flush_cache")
    assert chat(server.base_url, messages)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
