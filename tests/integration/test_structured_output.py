"""Structured output end to end, on the real server and model: JSON Schemas of varied features
validate with ``jsonschema``, regex / choice / grammar outputs match, ``n > 1`` and mixed batches
keep every choice and every free request right, logprobs describe the masked distribution, and
malformed constraints are 400s naming the field."""

from __future__ import annotations

import json
import math
import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import pytest

SCHEMAS = {
    "nested_required_closed": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name", "id"],
                "properties": {
                    "name": {"type": "string", "maxLength": 20},
                    "id": {"type": "integer", "minimum": 1, "maximum": 9999},
                },
            },
            "active": {"type": "boolean"},
        },
        "required": ["user", "active"],
        "additionalProperties": False,
    },
    "array_bounds": {
        "type": "object",
        "properties": {
            "colors": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 2, "maxItems": 4}
        },
        "required": ["colors"],
        "additionalProperties": False,
    },
    "enum_and_number": {
        "type": "object",
        "properties": {
            "sentiment": {"enum": ["positive", "negative", "neutral"]},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        },
        "required": ["sentiment", "confidence"],
        "additionalProperties": False,
    },
    "any_of_and_null": {
        "type": "object",
        "properties": {
            "value": {"anyOf": [{"type": "integer", "maximum": 1000}, {"type": "string", "maxLength": 10}]},
            "unit": {"type": ["string", "null"], "maxLength": 5},
        },
        "required": ["value", "unit"],
        "additionalProperties": False,
    },
    "string_formats": {
        "type": "object",
        "properties": {
            "email": {"type": "string", "format": "email", "maxLength": 40},
            "birthday": {"type": "string", "format": "date"},
            "id": {"type": "string", "format": "uuid"},
        },
        "required": ["email", "birthday", "id"],
        "additionalProperties": False,
    },
    "integer_bounds": {
        "type": "object",
        "properties": {
            "age": {"type": "integer", "minimum": 18, "maximum": 99},
            "score": {"type": "number", "exclusiveMinimum": 0, "maximum": 10},
            "count": {"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 100},
        },
        "required": ["age", "score", "count"],
        "additionalProperties": False,
    },
}


WEIGHT = r"(0|[1-9]\d{0,2})(\.\d{1,2})? (kg|lb)"


def ask_json(schema: dict) -> str:
    return f"Reply with a JSON object with these fields: {', '.join(schema['properties'])}."


def validate(text: str, schema: dict) -> None:
    jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.FormatChecker())


def chat(http: httpx.Client, content: str, **fields) -> dict:
    r = http.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": content}], "temperature": 0, **fields}
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_every_schema_yields_valid_json(http):
    forced_before = http.get("/stats").json()["num_forced_tokens"]

    def one(item):
        name, schema = item
        body = chat(
            http,
            ask_json(schema),
            max_tokens=150,
            response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}},
        )
        return name, body["choices"][0]

    with ThreadPoolExecutor(len(SCHEMAS)) as pool:  # one batch: constrained rows side by side
        results = list(pool.map(one, SCHEMAS.items()))
    for name, choice in results:
        assert choice["finish_reason"] == "stop", (name, choice)
        validate(choice["message"]["content"], SCHEMAS[name])
    assert http.get("/stats").json()["num_forced_tokens"] > forced_before  # jump-forward took part


# A recursive definition with a keyword beside its $ref (2019-09: both apply): each child's name
# must also be a date.
TREE_WITH_SIBLINGS = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 16},
                "children": {
                    "type": "array",
                    "maxItems": 2,
                    "items": {"$ref": "#/$defs/node", "properties": {"name": {"format": "date"}}},
                },
            },
            "required": ["name"],
            "additionalProperties": False,
        }
    },
    "$ref": "#/$defs/node",
}


def test_recursive_ref_with_siblings_is_served_and_validates(http):
    body = chat(
        http,
        "Reply with a JSON family tree: each person has a name and children; children are named by birth date.",
        max_tokens=120,
        response_format={"type": "json_schema", "json_schema": {"name": "tree", "schema": TREE_WITH_SIBLINGS}},
    )
    choice = body["choices"][0]
    assert "unsatisfied_check" not in choice, choice
    validate(choice["message"]["content"], TREE_WITH_SIBLINGS)


def test_unknown_format_is_accepted_with_a_warning_header(http):
    schema = {
        "type": "object",
        "properties": {"file": {"type": "string", "format": "path", "maxLength": 20}},
        "required": ["file"],
        "additionalProperties": False,
    }
    r = http.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "Name a file."}],
            "max_tokens": 40,
            "response_format": {"type": "json_schema", "json_schema": {"name": "f", "schema": schema}},
        },
    )
    assert r.status_code == 200, r.text
    assert '"path"' in r.headers["x-trillium-warning"]
    validate(r.json()["choices"][0]["message"]["content"], schema)
    with http.stream(
        "POST",
        "/v1/completions",
        json={"prompt": "file:", "max_tokens": 20, "stream": True, "structured_outputs": {"json": schema}},
    ) as streamed:
        assert streamed.status_code == 200 and '"path"' in streamed.headers["x-trillium-warning"]
        streamed.read()
    r = http.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 60,
            "structured_outputs": {"json": {"type": "string", "format": "uuid"}},
        },
    )
    assert r.status_code == 200 and "x-trillium-warning" not in r.headers


def test_openai_client_response_format_and_vllm_structured_outputs(openai_client):
    schema = SCHEMAS["enum_and_number"]
    out = openai_client.chat.completions.create(
        model=openai_client.models.list().data[0].id,
        max_tokens=60,
        temperature=0,
        messages=[{"role": "user", "content": "How do you feel about rainy days? Answer as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "mood", "schema": schema}},
    )
    validate(out.choices[0].message.content, schema)
    obj = openai_client.chat.completions.create(
        model=out.model,
        max_tokens=80,
        temperature=0,
        response_format={"type": "json_object"},
        messages=[{"role": "user", "content": "Describe a cat as JSON."}],
    )
    if obj.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(obj.choices[0].message.content), dict)
    else:  # length mid-structure: a JSON object that was cut off
        assert obj.choices[0].message.content.startswith("{")
    phone = openai_client.completions.create(
        model=out.model,
        prompt="Call me at",
        max_tokens=20,
        temperature=0,
        extra_body={"structured_outputs": {"regex": r" \d{3}-\d{3}-\d{4}"}},
    )
    assert re.fullmatch(r" \d{3}-\d{3}-\d{4}", phone.choices[0].text) and phone.choices[0].finish_reason == "stop"


def test_streamed_completion_follows_the_schema(http):
    schema = SCHEMAS["array_bounds"]
    text, reasons = [], []
    with http.stream(
        "POST",
        "/v1/completions",
        json={
            "prompt": "A JSON list of colors: ",
            "max_tokens": 80,
            "temperature": 0,
            "stream": True,
            "structured_outputs": {"json": schema},
        },
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"][0]
                text.append(choice["text"])
                reasons.append(choice["finish_reason"])
    assert reasons[-1] == "stop"
    validate("".join(text), schema)


@pytest.mark.parametrize(
    "constraint,check",
    [
        ({"choice": ["positive", "negative", "neutral"]}, lambda t: t in ("positive", "negative", "neutral")),
        ({"regex": WEIGHT}, lambda t: re.fullmatch(WEIGHT, t)),
        (
            {"grammar": 'start: "The answer is " ANSWER "."\nANSWER: "yes" | "no"'},
            lambda t: t in ("The answer is yes.", "The answer is no."),
        ),
        ({"grammar": 'root ::= ("red" | "green") " " [0-9]'}, lambda t: re.fullmatch(r"(red|green) \d", t)),
    ],
)
def test_regex_choice_and_grammar_outputs_match(http, constraint, check):
    body = chat(http, "Is the sky blue? How heavy is a cat?", max_tokens=30, structured_outputs=constraint)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop" and check(choice["message"]["content"]), choice


def test_n_choices_each_follow_the_schema(http):
    schema = SCHEMAS["integer_bounds"]
    body = chat(
        http, ask_json(schema), max_tokens=60, n=3, temperature=1.0, seed=7, structured_outputs={"json": schema}
    )
    assert len(body["choices"]) == 3
    for choice in body["choices"]:
        assert choice["finish_reason"] == "stop", choice
        validate(choice["message"]["content"], schema)


def test_mixed_batch_leaves_free_requests_unchanged(http):
    free = {"messages": [{"role": "user", "content": "Name three rivers."}], "max_tokens": 24, "temperature": 0}
    alone = http.post("/v1/chat/completions", json=free).json()["choices"][0]["message"]["content"]
    schema = SCHEMAS["nested_required_closed"]

    def constrained(_):
        return chat(http, ask_json(schema), max_tokens=80, structured_outputs={"json": schema})["choices"][0]

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(constrained, i) for i in range(3)]
        together = pool.submit(lambda: http.post("/v1/chat/completions", json=free).json())
        outs = [f.result() for f in futures]
    assert together.result()["choices"][0]["message"]["content"] == alone  # its row was never masked
    for choice in outs:
        validate(choice["message"]["content"], schema)


def test_max_tokens_mid_structure_is_cut_when_closing_is_off(http):
    schema = SCHEMAS["nested_required_closed"]
    choice = chat(
        http, ask_json(schema), max_tokens=5, structured_outputs={"json": schema}, close_structured_output=False
    )["choices"][0]
    assert choice["finish_reason"] == "length" and "closed_early" not in choice
    with pytest.raises(json.JSONDecodeError):
        json.loads(choice["message"]["content"])


def test_an_allowance_below_the_shortest_output_is_a_400_naming_max_tokens(http):
    schema = SCHEMAS["nested_required_closed"]
    r = http.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "structured_outputs": {"json": schema}},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text


@pytest.mark.parametrize("max_tokens", [18, 24])
def test_a_tight_allowance_returns_closed_valid_json_streamed_with_n_and_logprobs(http, max_tokens):
    """At temperature 1 a small model rarely finishes a nested object in 18-24 tokens: each
    choice is closed by the grammar's shortest completion (``closed_early``, finish ``length``),
    parses and validates; logprobs cover the sampled tokens only."""
    schema = SCHEMAS["nested_required_closed"]
    body = {
        "messages": [{"role": "user", "content": "Describe a user in JSON with a long name."}],
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "n": 3,
        "seed": 7,
        "logprobs": True,
        "stream": True,
        "structured_outputs": {"json": schema},
    }
    texts, closed, reasons, lp_tokens = ["", "", ""], [False] * 3, [None] * 3, [0] * 3
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[6:])["choices"]:
                i = choice["index"]
                texts[i] += choice["delta"].get("content") or ""
                closed[i] |= choice.get("closed_early", False)
                assert "unsatisfied_check" not in choice  # no checks beyond the grammar here
                reasons[i] = choice["finish_reason"] or reasons[i]
                lp_tokens[i] += len((choice.get("logprobs") or {}).get("content") or [])
    for text, was_closed, reason, n_lp in zip(texts, closed, reasons, lp_tokens):
        validate(text, schema)
        assert reason in ("stop", "length") and was_closed == (reason == "length")
        assert n_lp <= max_tokens
    assert any(closed), "no choice needed closing: the test does not exercise it"


def test_logprobs_are_those_of_the_masked_distribution(http):
    choices = ["yes", "no"]
    body = chat(
        http, "Is water wet?", max_tokens=5, logprobs=True, top_logprobs=5, structured_outputs={"choice": choices}
    )
    content = body["choices"][0]["logprobs"]["content"]
    assert "".join(t["token"] for t in content) in choices
    first = content[0]
    assert all(any(c.startswith(t["token"]) for c in choices) for t in first["top_logprobs"])
    # The allowed first tokens carry all the probability mass, and no more than 5 exist here.
    assert math.isclose(sum(math.exp(t["logprob"]) for t in first["top_logprobs"]), 1.0, rel_tol=1e-3)


@pytest.mark.parametrize(
    "fields,param",
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}}},
            "response_format.json_schema.schema",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format.json_schema.schema",
        ),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        (
            {
                "structured_outputs": {
                    "json": {
                        "type": "object",
                        "properties": {"a": {"enum": [1], "not": {"const": 1}}},
                        "required": ["a"],
                    }
                }
            },
            "structured_outputs.json",
        ),
        ({"structured_outputs": {"json": {"$ref": "#/definitions/missing"}}}, "structured_outputs.json"),
        ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs.regex"),
        ({"structured_outputs": {"grammar": "start: ((("}}, "structured_outputs.grammar"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
        ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs"),
        ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}}, "structured_outputs"),
    ],
)
def test_invalid_constraints_are_400_naming_the_field(http, fields, param):
    r = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], **fields})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    r = http.post("/v1/completions", json={"prompt": "hi", **fields})
    assert r.status_code == 400 and r.json()["error"]["param"] == param
