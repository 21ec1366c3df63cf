"""Reasoning output through the official ``openai`` client, against one server started with
``--reasoning-parser qwen3`` on the default model.

The default model does not think: its answers must come through as content exactly as the model
wrote them, with no reasoning. A think section is forced with a regex constraint (a constrained
output has reasoning when it opens a think section itself): it must come out as
``reasoning_content``, streamed and whole, with its tokens counted in the usage. The split itself,
on any text and token sequence, is unit tested (tests/unit/test_reasoning.py).
"""

from __future__ import annotations

import re

import httpx
import pytest

from tests.integration.conftest import SERVER_ARGS, ServerProcess

MODEL = "SmolLM2-135M-Instruct"
ASK = [{"role": "user", "content": "Say hello to me."}]
THINK = "The user says hi."
FORCED = {"regex": r"<think>\nThe user says hi\.\n</think>\n\n[A-Z][a-z]+( [a-z]+){1,5}\."}


@pytest.fixture(scope="module")
def reasoning_server():
    srv = ServerProcess(*SERVER_ARGS, "--reasoning-parser", "qwen3")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(reasoning_server):
    import openai

    return openai.OpenAI(base_url=reasoning_server.base_url + "/v1", api_key="unused", timeout=120)


def streamed(client, **kwargs) -> tuple[str, str, str | None, dict | None]:
    """(reasoning, content, finish reason, usage) of a streamed chat completion."""
    reasoning, content, reason, usage = [], [], None, None
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs):
        if chunk.usage is not None:
            usage = chunk.usage.model_dump()
        for choice in chunk.choices:
            reasoning.append(getattr(choice.delta, "reasoning_content", None) or "")
            content.append(choice.delta.content or "")
            reason = choice.finish_reason or reason
    return "".join(reasoning), "".join(content), reason, usage


def test_an_answer_without_thinking_is_content_as_written(client, reasoning_server):
    """No <think> at the start: the whole output is content, the same text a plain completion of
    the same prompt gives, and no token is counted as reasoning."""
    chat = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=24, temperature=0)
    message = chat.choices[0].message
    assert message.content and getattr(message, "reasoning_content", None) is None
    assert chat.usage.completion_tokens_details.reasoning_tokens == 0
    prompt = httpx.post(reasoning_server.base_url + "/v1/chat/completions/render", json={"messages": ASK}).json()
    raw = client.completions.create(model=MODEL, prompt=prompt["token_ids"], max_tokens=24, temperature=0)
    assert message.content == raw.choices[0].text
    reasoning, content, _, usage = streamed(client, model=MODEL, messages=ASK, max_tokens=24, temperature=0)
    assert (reasoning, content) == ("", message.content)
    assert usage is not None and usage["completion_tokens_details"]["reasoning_tokens"] == 0


def test_a_think_section_is_reasoning_content_streamed_and_whole(client):
    kwargs = {"model": MODEL, "messages": ASK, "max_tokens": 60, "temperature": 0}
    chat = client.chat.completions.create(**kwargs, extra_body={"structured_outputs": FORCED})
    message = chat.choices[0].message
    assert chat.choices[0].finish_reason == "stop"
    assert message.reasoning_content == THINK
    assert re.fullmatch(r"[A-Z][a-z]+( [a-z]+){1,5}\.", message.content)
    details = chat.usage.completion_tokens_details
    assert 0 < details.reasoning_tokens < chat.usage.completion_tokens
    reasoning, content, reason, usage = streamed(client, **kwargs, extra_body={"structured_outputs": FORCED})
    assert (reasoning, content, reason) == (THINK, message.content, "stop")
    assert usage is not None and 0 < usage["completion_tokens_details"]["reasoning_tokens"] < usage["completion_tokens"]


def test_a_length_stop_inside_the_thinking_is_all_reasoning(client):
    kwargs = {"model": MODEL, "messages": ASK, "max_tokens": 6, "temperature": 0}
    chat = client.chat.completions.create(**kwargs, extra_body={"structured_outputs": FORCED})
    message = chat.choices[0].message
    assert chat.choices[0].finish_reason == "length"
    assert message.content is None and message.reasoning_content and THINK.startswith(message.reasoning_content)
    assert chat.usage.completion_tokens_details.reasoning_tokens == chat.usage.completion_tokens
    reasoning, content, reason, _ = streamed(client, **kwargs, extra_body={"structured_outputs": FORCED})
    assert (reasoning, content, reason) == (message.reasoning_content, "", "length")


def test_responses_api_without_thinking_has_no_reasoning_item(client):
    response = client.responses.create(model=MODEL, input="Say hello to me.", max_output_tokens=16, temperature=0)
    assert [item.type for item in response.output] == ["message"]
    assert response.output_text
    assert response.usage.output_tokens_details.reasoning_tokens == 0


def test_chat_template_kwargs(client, reasoning_server):
    """Passed to the template (SmolLM2's ignores enable_thinking: the prompt is the same); not an
    object, or replacing one of the template's own arguments: 400 naming the field."""
    url = reasoning_server.base_url
    plain = httpx.post(url + "/v1/chat/completions/render", json={"messages": ASK}).json()["token_ids"]
    counted = httpx.post(
        url + "/tokenize", json={"messages": ASK, "chat_template_kwargs": {"enable_thinking": False}}
    ).json()
    assert counted["tokens"] == plain
    chat = client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=4, extra_body={"chat_template_kwargs": {"enable_thinking": False}}
    )
    assert chat.choices[0].message.content is not None
    for kwargs, param in (("no", "chat_template_kwargs"), ({"messages": []}, "chat_template_kwargs.messages")):
        r = httpx.post(
            url + "/v1/chat/completions", json={"messages": ASK, "max_tokens": 4, "chat_template_kwargs": kwargs}
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_required_tool_call_under_a_reasoning_parser(client):
    """The call grammar lets a think section in before the call (the default model writes none):
    the call comes back whole, with no reasoning and no content."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        }
    ]
    chat = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=tools,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=60,
        temperature=0,
    )
    message = chat.choices[0].message
    assert chat.choices[0].finish_reason == "tool_calls"
    assert [c.function.name for c in message.tool_calls] == ["get_weather"]
    assert message.content is None and getattr(message, "reasoning_content", None) is None
