"""Tool calling through the official ``openai`` client against a real server on the default
model (its template has no tools section: the fallback prompt and the Hermes parser).

``required`` and a named ``tool_choice`` are generated under the tools' grammar, so every call's
arguments validate against its schema, whatever the sampling; streamed calls reassemble to the
non-streamed ones."""

from __future__ import annotations

import json

import jsonschema
import pytest

MODEL = "SmolLM2-135M-Instruct"
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
}
TIME = {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 20}}, "required": ["tz"]}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather in a city", "parameters": WEATHER},
    },
    {"type": "function", "function": {"name": "get_time", "description": "Time in a time zone", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather like in Paris right now?"}]


def check_calls(message) -> list:
    for call in message.tool_calls or []:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    return message.tool_calls or []


@pytest.mark.parametrize(
    "tool_choice, names",
    [("required", {"get_weather", "get_time"}), ({"type": "function", "function": {"name": "get_time"}}, {"get_time"})],
)
def test_constrained_calls_always_validate(openai_client, tool_choice, names):
    r = openai_client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice=tool_choice,
        parallel_tool_calls=False,
        temperature=1.0,
        seed=11,
        n=8,  # eight seeds
        max_tokens=120,
    )
    for choice in r.choices:
        calls = check_calls(choice.message)
        assert choice.finish_reason == "tool_calls", choice
        assert len(calls) == 1 and calls[0].function.name in names
        assert choice.message.content is None


def test_parallel_calls(openai_client):
    seen = 0
    r = openai_client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather in Paris, Rome and Oslo?"}],
        tools=TOOLS,
        tool_choice="required",
        temperature=1.0,
        seed=5,
        n=8,
        max_tokens=200,
    )
    for choice in r.choices:
        seen = max(seen, len(check_calls(choice.message)))
        assert check_calls(choice.message)
    assert seen >= 2, "no choice made more than one call"


def test_round_trip(openai_client):
    first = openai_client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_tokens=80
    )
    (call,) = check_calls(first.choices[0].message)
    history = [
        *ASK,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21, "sky": "sunny"})},
    ]
    final = openai_client.chat.completions.create(
        model=MODEL, messages=history, tools=TOOLS, tool_choice="none", max_tokens=40, temperature=0
    )
    assert final.choices[0].message.content
    assert not final.choices[0].message.tool_calls
    # the tool's answer reached the prompt: the same history without it is shorter
    without = openai_client.chat.completions.create(
        model=MODEL, messages=history[:-1], tools=TOOLS, tool_choice="none", max_tokens=1
    )
    assert final.usage.prompt_tokens > without.usage.prompt_tokens + 10


def test_auto_may_answer_in_text(openai_client):
    r = openai_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello."}], tools=TOOLS, max_tokens=30, temperature=0
    )
    choice = r.choices[0]
    check_calls(choice.message)
    assert choice.message.content or choice.message.tool_calls


def test_streamed_calls_reassemble_to_the_same_calls(openai_client):
    kwargs = {
        "model": MODEL,
        "messages": ASK,
        "tools": TOOLS,
        "tool_choice": "required",
        "temperature": 1.0,
        "seed": 7,
        "max_tokens": 160,
    }
    whole = openai_client.chat.completions.create(**kwargs)
    calls: dict[int, dict] = {}
    finish = None
    for chunk in openai_client.chat.completions.create(**kwargs, stream=True):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                entry = calls.setdefault(delta.index, {"name": "", "arguments": "", "id": None})
                entry["id"] = delta.id or entry["id"]
                entry["name"] += delta.function.name or ""
                entry["arguments"] += delta.function.arguments or ""
    expected = [(c.function.name, c.function.arguments) for c in check_calls(whole.choices[0].message)]
    assert [(c["name"], c["arguments"]) for _, c in sorted(calls.items())] == expected
    assert all(c["id"] for c in calls.values())
    assert finish == whole.choices[0].finish_reason


@pytest.mark.parametrize("max_tokens", [1, 16, 96])
def test_a_call_cut_by_max_tokens_leaks_no_markup(openai_client, max_tokens):
    """tool_choice required writes nothing but calls: whatever max_tokens cuts (the opener, the
    arguments, the closing tag), content stays empty on every API, and only whole calls come out."""
    kwargs = {"model": MODEL, "messages": ASK, "tools": TOOLS, "tool_choice": "required", "temperature": 1.0}
    whole = openai_client.chat.completions.create(**kwargs, seed=3, n=4, max_tokens=max_tokens)
    assert "length" in {c.finish_reason for c in whole.choices}  # some call was cut
    for choice in whole.choices:
        assert not choice.message.content, choice.message.content
        check_calls(choice.message)
    content = ""
    for chunk in openai_client.chat.completions.create(**kwargs, seed=3, max_tokens=max_tokens, stream=True):
        content += "".join(c.delta.content or "" for c in chunk.choices)
    assert content == ""
    response = openai_client.responses.create(
        model=MODEL,
        input=ASK[0]["content"],
        tools=[{"type": "function", **t["function"]} for t in TOOLS],
        tool_choice="required",
        temperature=1.0,
        max_output_tokens=max_tokens,
    )
    assert response.output_text == ""
    for item in response.output:
        assert item.type == "function_call" or not "".join(p.text for p in item.content), item


@pytest.mark.parametrize(
    "body, param",
    [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools"),
        ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "tool_choice"),
        (
            {
                "messages": [
                    {"role": "user", "content": "x"},
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{oops"}}
                        ],
                    },
                ]
            },
            "messages[1].tool_calls[0].function.arguments",
        ),
    ],
)
def test_bad_tool_requests_name_the_field(http, body, param):
    r = http.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


PAINT = {
    "type": "object",
    "properties": {
        "colors": {
            "type": "array",
            "items": {"enum": ["red", "green", "blue", "cyan"]},
            "minItems": 3,
            "maxItems": 4,
            "uniqueItems": True,
        },
        "label": {"type": "string", "maxLength": 12, "not": {"pattern": "^[aeiou]"}},
    },
    "required": ["colors", "label"],
}


def test_tool_schema_keywords_beyond_the_grammar_are_enforced(openai_client, http):
    """``uniqueItems`` and ``not`` in a tool's parameters (no grammar expresses them; refused with
    a 400 before): checked as the call is generated, so every call's arguments validate; streamed,
    the calls are the same (what a check takes back was never sent)."""
    kwargs = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Paint the fence in three colors and label it."}],
        "tools": [{"type": "function", "function": {"name": "paint", "parameters": PAINT}}],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "temperature": 1.0,
        "seed": 3,
        "n": 8,
        "max_tokens": 120,
    }
    before = http.get("/stats").json()["num_rejected_tokens"]
    whole = openai_client.chat.completions.create(**kwargs)
    for choice in whole.choices:
        assert choice.finish_reason == "tool_calls", choice
        (call,) = choice.message.tool_calls
        jsonschema.validate(json.loads(call.function.arguments), PAINT)
    # the model did repeat a color or start a label with a vowel, and the checks took it back
    assert http.get("/stats").json()["num_rejected_tokens"] > before
    streamed: dict[int, str] = {}
    for chunk in openai_client.chat.completions.create(**kwargs, stream=True):
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                streamed[choice.index] = streamed.get(choice.index, "") + (delta.function.arguments or "")
    assert streamed == {c.index: c.message.tool_calls[0].function.arguments for c in whole.choices}
