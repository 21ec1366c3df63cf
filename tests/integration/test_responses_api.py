"""The Responses API (``/v1/responses``) through the official ``openai`` client on a real server:
text and message input, instructions, streaming events, JSON Schema output, function tools,
``previous_response_id`` continuations, retrieval and deletion, and the 400s for what is not
supported."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

MODEL = "SmolLM2-135M-Instruct"
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"]},
}


def test_text_input_with_instructions(openai_client, http):
    r = openai_client.responses.create(
        model=MODEL, input="Name three colors.", instructions="Answer briefly.", max_output_tokens=24, temperature=0
    )
    assert r.id.startswith("resp_") and r.object == "response"
    assert r.status in ("completed", "incomplete")
    assert r.output_text
    assert r.usage.input_tokens > 10 and 0 < r.usage.output_tokens <= 24
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    # the prompt is the instructions and the input, once each
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name three colors."}]
    tokenized = http.post("/tokenize", json={"messages": messages}).json()
    assert r.usage.input_tokens == tokenized["count"]
    cut = openai_client.responses.create(model=MODEL, input="Tell me a long story.", max_output_tokens=3)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage.output_tokens == 3


def test_streamed_events_add_up_to_the_response(openai_client):
    events = list(
        openai_client.responses.create(
            model=MODEL, input="Say hello.", max_output_tokens=16, temperature=0, stream=True
        )
    )
    types = [e.type for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert types[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert text and text == final.output_text
    whole = openai_client.responses.create(model=MODEL, input="Say hello.", max_output_tokens=16, temperature=0)
    assert whole.output_text == text
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_json_schema_output_validates(openai_client):
    for seed in range(4):
        r = openai_client.responses.create(
            model=MODEL,
            input=[{"role": "user", "content": [{"type": "input_text", "text": "Describe a person as JSON."}]}],
            text={"format": {"type": "json_schema", "name": "person", "schema": PERSON}},
            temperature=1.0,
            max_output_tokens=60,
            extra_body={"seed": seed},
        )
        assert r.status == "completed"
        jsonschema.validate(json.loads(r.output_text), PERSON)


def test_previous_response_id_continues_the_conversation(openai_client):
    first = openai_client.responses.create(model=MODEL, input="My name is Ada.", max_output_tokens=12, temperature=0)
    second = openai_client.responses.create(
        model=MODEL, input="What is my name?", previous_response_id=first.id, max_output_tokens=12, temperature=0
    )
    alone = openai_client.responses.create(model=MODEL, input="What is my name?", max_output_tokens=1)
    # the second prompt holds the first turn (its input and its answer) before the new question
    assert second.usage.input_tokens >= alone.usage.input_tokens + first.usage.output_tokens + 5
    assert second.previous_response_id == first.id
    assert openai_client.responses.retrieve(second.id).output_text == second.output_text
    openai_client.responses.delete(second.id)
    with pytest.raises(openai.NotFoundError):
        openai_client.responses.retrieve(second.id)
    with pytest.raises(openai.BadRequestError) as err:
        openai_client.responses.create(model=MODEL, input="x", previous_response_id=second.id)
    assert err.value.body["param"] == "previous_response_id"


def test_function_tools_round_trip(openai_client):
    r = openai_client.responses.create(
        model=MODEL, input="Weather in Oslo?", tools=[WEATHER_TOOL], tool_choice="required", max_output_tokens=60
    )
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and all(c.name == "get_weather" for c in calls)
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER_TOOL["parameters"])
    follow = openai_client.responses.create(
        model=MODEL,
        previous_response_id=r.id,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 21 C"}],
        tools=[WEATHER_TOOL],
        tool_choice="none",
        max_output_tokens=20,
    )
    assert follow.output_text and not [o for o in follow.output if o.type == "function_call"]
    streamed = list(
        openai_client.responses.create(
            model=MODEL,
            input="Weather in Oslo?",
            tools=[WEATHER_TOOL],
            tool_choice={"type": "function", "name": "get_weather"},
            parallel_tool_calls=False,
            max_output_tokens=60,
            stream=True,
        )
    )
    done = [e.arguments for e in streamed if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1
    jsonschema.validate(json.loads(done[0]), WEATHER_TOOL["parameters"])


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"reasoning": {"effort": "high"}}, "reasoning"),
        ({"background": True}, "background"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0].type",
        ),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ],
)
def test_unsupported_and_bad_fields_are_named(http, extra, param):
    r = http.post("/v1/responses", json={"model": MODEL, "input": "hi", **extra})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
