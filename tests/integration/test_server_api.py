"""The OpenAI API through a real server: official client, streaming, usage, finish reasons."""

from __future__ import annotations

import json
import time

import pytest

MODEL = "SmolLM2-135M-Instruct"


def test_models_lists_the_served_model(openai_client):
    ids = [m.id for m in openai_client.models.list().data]
    assert ids == [MODEL]


def test_chat_completion_not_streamed(openai_client):
    r = openai_client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=40,
        temperature=0,
    )
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert "Paris" in choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 10
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.object == "chat.completion" and r.model == MODEL


def test_finish_reason_length_at_max_tokens(openai_client):
    r = openai_client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=7, temperature=0)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 7


def test_finish_reason_stop_on_eos(openai_client):
    r = openai_client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=200,
        temperature=0,
    )
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens < 200
    assert "<|im_end|>" not in r.choices[0].message.content


def test_streamed_chat_matches_non_streamed(openai_client):
    kwargs = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Name three colors."}],
        "max_tokens": 30,
        "temperature": 0,
    }
    full = openai_client.chat.completions.create(**kwargs)
    chunks = list(openai_client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_streamed_completion_ends_with_done(http):
    with http.stream(
        "POST",
        "/v1/completions",
        json={"model": MODEL, "prompt": "The sky is", "max_tokens": 8, "temperature": 0, "stream": True},
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    payloads = [json.loads(e[len("data: ") :]) for e in events[:-1]]
    assert all(p["object"] == "text_completion" for p in payloads)
    assert payloads[-1]["choices"][0]["finish_reason"] == "length"
    assert "".join(p["choices"][0]["text"] for p in payloads).strip()


def test_stop_string_is_not_returned(openai_client):
    base = openai_client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0)
    text = base.choices[0].text
    assert " 6" in text, text  # the model counts on
    stopped = openai_client.completions.create(
        model=MODEL, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0, stop=[" 6"]
    )
    assert stopped.choices[0].text == text[: text.index(" 6")]
    assert stopped.choices[0].finish_reason == "stop"


def test_sampling_with_temperature_and_seed_is_reproducible(openai_client):
    kwargs = {
        "model": MODEL,
        "prompt": "My favourite food is",
        "max_tokens": 12,
        "temperature": 1.0,
        "top_p": 0.9,
        "seed": 1234,
    }
    a = openai_client.completions.create(**kwargs).choices[0].text
    b = openai_client.completions.create(**kwargs).choices[0].text
    assert a == b


def test_health_and_stats(http):
    assert http.get("/health").json() == {"status": "ok"}
    stats = http.get("/stats").json()
    assert stats["num_total_blocks"] > 0


BAD_REQUESTS = [
    ("/v1/chat/completions", b"{not json", 400, None),
    ("/v1/chat/completions", {"model": MODEL}, 400, "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": "hi"}, 400, "messages"),
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
        400,
        "max_tokens",
    ),
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": "ten"},
        400,
        "max_tokens",
    ),
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": 3},
        400,
        "temperature",
    ),
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "top_p": 0},
        400,
        "top_p",
    ),
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]},
        400,
        "messages[0].role",
    ),
    ("/v1/chat/completions", {"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]}, 404, "model"),
    ("/v1/completions", {"model": MODEL, "prompt": "word " * 3000}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 5000}, 400, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": "\x04"}, 400, "prompt"),  # no token for it
    ("/v1/completions", {"model": MODEL, "prompt": [1, 2, 10**9]}, 400, "prompt"),
]


@pytest.mark.parametrize("path,body,status,param", BAD_REQUESTS)
def test_bad_input_gets_openai_error_json(http, path, body, status, param):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = http.post(path, content=content, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    assert error["param"] == param
    if status == 404:
        assert error["code"] == "model_not_found"


def test_server_still_serves_after_bad_input(openai_client):
    r = openai_client.completions.create(model=MODEL, prompt="Hello", max_tokens=3)
    assert r.usage.completion_tokens == 3


def test_openai_client_raises_bad_request_on_400(openai_client):
    import openai

    with pytest.raises(openai.BadRequestError):
        openai_client.chat.completions.create(model=MODEL, messages=[], max_tokens=5)
    with pytest.raises(openai.NotFoundError):
        openai_client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])


def _load_settles_at_zero(http, timeout_s: float = 30) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = http.get("/get_load")
        assert r.status_code == 200 and isinstance(r.json()["load"], int)
        if r.json()["load"] == 0:
            return True
        time.sleep(0.1)
    return False


def test_a_router_sees_the_load_the_server_info_and_vllms_gauge_names(http, openai_client):
    """What vllm-router reads from a worker: ``/get_load`` (power_of_two: a streaming request counts
    until its client goes away), ``/get_server_info``
    (model and KV block size) and vLLM's gauge names in ``/metrics``, next to trillium's own."""
    assert _load_settles_at_zero(http)  # an earlier test's cut-off request may still be ending
    body = {"prompt": "Count:", "max_tokens": 200, "ignore_eos": True, "stream": True}
    with http.stream("POST", "/v1/completions", json=body) as stream:
        next(line for line in stream.iter_lines() if line.startswith("data: {"))  # it is decoding
        assert http.get("/get_load").json() == {"load": 1}
    assert _load_settles_at_zero(http)  # the client went away: its request stops counting
    info = http.get("/get_server_info").json()
    assert info["engine"] == "trillium" and info["model_id"] == openai_client.models.list().data[0].id
    assert info["kv_block_size"] == 16 and info["kv_cache_tokens"] % 16 == 0 and info["max_model_len"] > 0
    metrics = http.get("/metrics").text
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        assert f"vllm:{name}{{" in metrics and f"trillium:{name}{{" in metrics
