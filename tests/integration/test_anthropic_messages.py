"""Anthropic's Messages API (``/v1/messages``, ``/v1/messages/count_tokens``) through the official
``anthropic`` client on a real server: a plain message, the stream and its event helpers, forced
tool use and a tool_result turn, token counting, stop sequences, errors in Anthropic's shape, and
``x-api-key`` against a server with keys (the same tenants and ledger as every route)."""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import pytest

from tests.integration.metered import KEYS

CLAUDE = "claude-sonnet-4-5"  # any claude* name is the served model
SERVED = "SmolLM2-135M-Instruct"
WEATHER = {
    "name": "get_weather",
    "description": "Weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}, "days": {"type": "integer", "minimum": 1}},
        "required": ["city"],
    },
    "cache_control": {"type": "ephemeral"},
}
COLORS = [{"role": "user", "content": "Name three colors."}]
# Sampling fields the SDK no longer has keyword arguments for; older clients send them.
GREEDY = {"extra_body": {"temperature": 0}}


@pytest.fixture
def client(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", timeout=120, max_retries=0)


def total_input(usage) -> int:
    """The prompt's tokens: Anthropic counts those read from the cache apart."""
    return usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)


def test_create(client, http):
    r = client.messages.create(
        model=CLAUDE,
        max_tokens=24,
        system=[{"type": "text", "text": "Answer briefly.", "cache_control": {"type": "ephemeral"}}],
        messages=COLORS,
        extra_body={"temperature": 0, "top_p": 0.9, "top_k": 40},
        metadata={"user_id": "user-1"},
        extra_headers={"anthropic-beta": "prompt-caching-2024-07-31"},
    )
    assert r.id.startswith("msg_") and r.type == "message" and r.role == "assistant" and r.model == CLAUDE
    assert [b.type for b in r.content] == ["text"] and r.content[0].text
    assert r.stop_reason in ("end_turn", "max_tokens") and r.stop_sequence is None
    assert 0 < r.usage.output_tokens <= 24
    # the prompt is the system prompt and the message, once each, through the chat template
    messages = [{"role": "system", "content": "Answer briefly."}, *COLORS]
    assert total_input(r.usage) == http.post("/tokenize", json={"messages": messages}).json()["count"]
    again = client.messages.create(model=SERVED, max_tokens=24, system="Answer briefly.", messages=COLORS, **GREEDY)
    assert again.model == SERVED and again.content[0].text == r.content[0].text
    # the same prompt again: most of it is read from the prefix cache
    assert again.usage.cache_read_input_tokens >= 16 and total_input(again.usage) == total_input(r.usage)
    cut = client.messages.create(model=CLAUDE, max_tokens=3, messages=[{"role": "user", "content": "Tell a story."}])
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3


def test_max_tokens_0_warms_the_prefix_cache(client):
    poem = [{"role": "user", "content": "Recite a long poem about lighthouses, storms and ships at night."}]
    warm = client.messages.create(model=CLAUDE, max_tokens=0, messages=poem)
    assert warm.content == [] and warm.stop_reason == "max_tokens" and warm.usage.output_tokens == 0
    r = client.messages.create(model=CLAUDE, max_tokens=2, messages=poem)
    # every full block of the prompt is cached now (blocks of 16 tokens; the last is always computed)
    assert r.usage.cache_read_input_tokens > warm.usage.cache_read_input_tokens
    assert r.usage.cache_read_input_tokens >= total_input(warm.usage) - 16


def test_output_config_format_is_json_valid_against_its_schema(client):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    r = client.messages.create(
        model=CLAUDE,
        max_tokens=60,
        messages=[{"role": "user", "content": "Describe a person as JSON."}],
        output_config={"format": {"type": "json_schema", "schema": schema}},
    )
    jsonschema.validate(json.loads(r.content[0].text), schema)


def test_stop_sequence_is_reported(client):
    story = [{"role": "user", "content": "Write a sentence about the sea."}]
    whole = client.messages.create(model=CLAUDE, max_tokens=32, messages=story, **GREEDY).content[0].text
    stop = whole.split()[3]
    r = client.messages.create(model=CLAUDE, max_tokens=32, messages=story, stop_sequences=[stop, "@@"], **GREEDY)
    assert (r.stop_reason, r.stop_sequence) == ("stop_sequence", stop)
    assert r.content[0].text == whole[: whole.index(stop)]


def test_stream_helpers_add_up_to_the_message(client):
    params = {"model": CLAUDE, "max_tokens": 20, "messages": COLORS, **GREEDY}
    with client.messages.stream(**params) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].text == text
    assert final.stop_reason in ("end_turn", "max_tokens") and 0 < final.usage.output_tokens <= 20
    whole = client.messages.create(**params)
    assert whole.content[0].text == text and total_input(final.usage) == total_input(whole.usage)
    assert final.usage.output_tokens == whole.usage.output_tokens
    events = [e.type for e in client.messages.create(**params, stream=True)]
    assert events[:2] == ["message_start", "content_block_start"]
    assert set(events[2:-3]) == {"content_block_delta"}
    assert events[-3:] == ["content_block_stop", "message_delta", "message_stop"]


def test_forced_tool_use_then_a_tool_result_turn(client):
    question = [{"role": "user", "content": "What is the weather in Oslo?"}]
    r = client.messages.create(
        model=CLAUDE,
        max_tokens=60,
        messages=question,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        extra_body={"temperature": 1.0},
    )
    (use,) = [b for b in r.content if b.type == "tool_use"]
    assert use.name == "get_weather" and r.stop_reason == "tool_use"
    jsonschema.validate(use.input, WEATHER["input_schema"])
    results = [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny, 21 C"}]
    follow_up = [*question, {"role": "assistant", "content": r.content}, {"role": "user", "content": results}]
    answer = client.messages.create(
        model=CLAUDE, max_tokens=20, messages=follow_up, tools=[WEATHER], tool_choice={"type": "none"}, **GREEDY
    )
    assert [b.type for b in answer.content] == ["text"] and answer.content[0].text
    assert answer.stop_reason in ("end_turn", "max_tokens")
    # the follow-up's prompt holds the call and its result (the tools are left out with tool_choice none)
    alone = client.messages.count_tokens(model=CLAUDE, messages=question).input_tokens
    assert total_input(answer.usage) >= alone + 15


def test_streamed_tool_use(client):
    with client.messages.stream(
        model=CLAUDE,
        max_tokens=60,
        messages=[{"role": "user", "content": "Weather in Lima for 2 days?"}],
        tools=[WEATHER],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    ) as stream:
        deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert "input_json_delta" in deltas and final.stop_reason == "tool_use"
    (use,) = [b for b in final.content if b.type == "tool_use"]
    jsonschema.validate(use.input, WEATHER["input_schema"])


def test_count_tokens_is_the_prompt_a_message_runs(client):
    params = {"model": CLAUDE, "system": "You forecast weather.", "messages": [{"role": "user", "content": "Oslo?"}]}
    counted = client.messages.count_tokens(**params, tools=[WEATHER]).input_tokens
    r = client.messages.create(**params, tools=[WEATHER], max_tokens=1)
    assert counted == total_input(r.usage)
    # the tools are in the template's prompt, unless tool_choice is none
    assert counted > client.messages.count_tokens(**params).input_tokens
    none = client.messages.count_tokens(**params, tools=[WEATHER], tool_choice={"type": "none"}).input_tokens
    assert none == client.messages.count_tokens(**params).input_tokens


def test_errors_are_in_anthropics_shape(client, http):
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model=CLAUDE, max_tokens=4, messages=[{"role": "system", "content": "Hi"}])
    assert err.value.status_code == 400
    body = err.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith("messages[0].role")
    with pytest.raises(anthropic.NotFoundError) as err:
        client.messages.create(model="gpt-4o", max_tokens=4, messages=COLORS)
    assert err.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model=CLAUDE, max_tokens=100_000, messages=COLORS)
    assert err.value.body["error"]["message"].startswith("max_tokens")
    for path, body, status, field in [
        ("/v1/messages", {"model": CLAUDE, "messages": COLORS}, 400, "max_tokens"),
        (
            "/v1/messages",
            {"model": CLAUDE, "max_tokens": 4, "messages": COLORS, "tools": [{"name": "x y"}]},
            400,
            "tools",
        ),
        ("/v1/messages/count_tokens", {"model": CLAUDE, "messages": [{"role": "user"}]}, 400, "messages[0]"),
        ("/v1/messages", b"{not json", 400, None),
    ]:
        r = http.post(path, **({"content": body} if isinstance(body, bytes) else {"json": body}))
        assert r.status_code == status, r.text
        error = r.json()
        assert set(error) == {"type", "error"} and set(error["error"]) == {"type", "message"}
        assert field is None or field in error["error"]["message"], error
    r = http.get("/v1/messages")
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"


def test_x_api_key_on_a_server_with_keys(metered_server):
    keyed = anthropic.Anthropic(base_url=metered_server.base_url, api_key=KEYS["open"], max_retries=0, timeout=120)
    r = keyed.messages.create(model=CLAUDE, max_tokens=4, messages=COLORS)
    assert keyed.messages.count_tokens(model=CLAUDE, messages=COLORS).input_tokens == total_input(r.usage)
    (row,) = [row for row in metered_server.ledger_rows("open") if row["request_id"] == r.id]
    assert row["endpoint"] == "messages" and row["completion_tokens"] == r.usage.output_tokens
    assert row["prompt_tokens"] == total_input(r.usage) and row["cached_tokens"] == r.usage.cache_read_input_tokens
    bearer = httpx.post(
        metered_server.base_url + "/v1/messages",
        json={"model": CLAUDE, "max_tokens": 1, "messages": COLORS},
        headers={"Authorization": f"Bearer {KEYS['open']}"},
    )
    assert bearer.status_code == 200, bearer.text
    for headers in ({}, {"x-api-key": "sk-test-nobody"}):
        r = httpx.post(metered_server.base_url + "/v1/messages/count_tokens", json={}, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", r.text
    nobody = anthropic.Anthropic(base_url=metered_server.base_url, api_key="sk-test-nobody", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as err:
        nobody.messages.create(model=CLAUDE, max_tokens=1, messages=COLORS)
    assert err.value.body["error"]["type"] == "authentication_error"
