"""Input limits (server/limits.py): each check names its field, the body limit is a 413 sent
before the body is read, and hostile JSON is a 400 from ``decode_body``, never a crash."""

from __future__ import annotations

import dataclasses

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trillium.protocol import StructuredOutputs
from trillium.server.errors import APIError
from trillium.server.limits import BodySizeLimit, InputLimits, json_depth
from trillium.server.schema import ChatCompletionRequest, CompletionRequest, decode_body


def nested(depth: int) -> object:
    value: object = 1
    for i in range(depth):
        value = [value] if i % 2 else {"a": value}
    return value


def test_json_depth_counts_containers_and_stops_early():
    assert json_depth(1, 10) == 0
    assert json_depth([], 10) == 1
    assert json_depth({"a": [1, {"b": []}]}, 10) == 4
    assert json_depth(nested(50), 100) == 50
    assert json_depth(nested(5000), 64) == 65  # stops at the first level past the limit


@given(st.recursive(st.none() | st.integers(), lambda c: st.lists(c) | st.dictionaries(st.text(), c)))
def test_json_depth_matches_a_recursive_count(value):
    def depth(v):
        children = v.values() if isinstance(v, dict) else v if isinstance(v, list) else None
        return 0 if children is None else 1 + max((depth(c) for c in children), default=0)

    assert json_depth(value, 10**6) == depth(value)


def limits(**kwargs) -> InputLimits:
    return InputLimits(**kwargs).for_engine(max_model_len=1000, num_kv_tokens=4000)


def test_engine_defaults():
    lim = limits()
    assert lim.max_prompt_chars == 64 * 1024  # 16 x 1000 is below the floor
    assert lim.max_output_tokens == 4000
    assert lim.max_kv_tokens == 4000
    big = InputLimits().for_engine(max_model_len=8192, num_kv_tokens=None)
    assert big.max_prompt_chars == 16 * 8192
    assert big.max_kv_tokens is None
    assert InputLimits(max_kv_tokens=7).for_engine(8192, 100).max_kv_tokens == 7  # a set value is kept


def test_a_limit_below_one_is_a_config_error():
    with pytest.raises(ValueError, match="--max-messages must be at least 1"):
        InputLimits(max_messages=0)


def error(call) -> APIError:
    with pytest.raises(APIError) as info:
        call()
    assert info.value.status == 400
    assert info.value.code == "limit_exceeded"
    return info.value


def test_counts_name_their_field():
    lim = limits(max_messages=2, max_logit_bias=2, max_stop_chars=5)
    lim.check_body(messages=[1, 2], logit_bias={"1": 1.0, "2": 1.0}, stop=["ab", "cde"])
    assert error(lambda: lim.check_body(messages=[1, 2, 3])).param == "messages"
    assert error(lambda: lim.check_body(logit_bias={str(i): 0.0 for i in range(3)})).param == "logit_bias"
    assert error(lambda: lim.check_body(stop="abcdef")).param == "stop"
    err = error(lambda: lim.check_body(stop=["abc", "def"]))
    assert err.param == "stop" and "--max-stop-chars" in err.message


def test_prompt_characters_and_token_ids():
    lim = limits(max_prompt_chars=10)
    lim.check_prompt_chars("x" * 10, "prompt")
    lim.check_prompt_chars([{"role": "user", "content": "x" * 6}], "messages")
    assert error(lambda: lim.check_prompt_chars("x" * 11, "prompt")).param == "prompt"
    messages = [{"role": "user", "content": "x" * 4}, {"role": "assistant", "content": ""}]
    assert error(lambda: lim.check_prompt_chars(messages, "messages")).param == "messages"
    assert error(lambda: lim.check_token_ids(list(range(11)), "tokens")).param == "tokens"


def test_output_and_kv_tokens():
    lim = limits(max_output_tokens=100, max_kv_tokens=300)
    lim.check_tokens(num_prompt_tokens=50, max_tokens=50, n=2, num_kv_tokens=4000)  # 100 out, 200 KV
    err = error(lambda: lim.check_tokens(num_prompt_tokens=1, max_tokens=51, n=2, num_kv_tokens=4000))
    assert err.param == "max_tokens" and "--max-output-tokens" in err.message
    err = error(lambda: lim.check_tokens(num_prompt_tokens=110, max_tokens=50, n=2, num_kv_tokens=4000))
    assert "--max-kv-tokens" in err.message
    # One choice that could never fit the pool, whatever the per-request limit says.
    lim = limits(max_kv_tokens=10**6, max_output_tokens=10**6)
    err = error(lambda: lim.check_tokens(num_prompt_tokens=3000, max_tokens=1001, n=1, num_kv_tokens=4000))
    assert "KV cache holds (4000 tokens)" in err.message


def test_grammar_size_any_kind():
    lim = limits(max_grammar_bytes=100)
    lim.check_structured(None, "x")
    lim.check_structured(StructuredOutputs(json_object=True), "response_format")
    lim.check_structured(StructuredOutputs(regex="a" * 90), "structured_outputs.regex")
    for constraint, param in [
        (StructuredOutputs(regex="a" * 200), "structured_outputs.regex"),
        (StructuredOutputs(grammar="a" * 200), "structured_outputs.grammar"),
        (StructuredOutputs(choice=["ab"] * 40), "structured_outputs.choice"),
        (StructuredOutputs(json={"enum": list(range(100))}), "response_format.json_schema.schema"),
    ]:
        err = error(lambda c=constraint, p=param: lim.check_structured(c, p))
        assert err.param == param and "--max-grammar-bytes" in err.message


def test_schema_depth_as_object_or_text():
    lim = limits(max_json_depth=8)
    lim.check_structured(StructuredOutputs(json=nested(8)), "s")
    for schema in (nested(9), msgspec.json.encode(nested(9)).decode(), nested(100_000)):
        err = error(lambda s=schema: lim.check_structured(StructuredOutputs(json=s), "structured_outputs.json"))
        assert err.param == "structured_outputs.json" and "--max-json-depth" in err.message
    lim.check_structured(StructuredOutputs(json="{not json"), "s")  # the compiler reports that


@pytest.mark.parametrize(
    "body",
    [
        b'{"messages": [{"role": "user", "content": "\xff"}]}',  # invalid UTF-8
        b'{"messages": [{"role": "user", "content": "\xed\xa0\x80"}]}',  # an encoded surrogate
        b'{"messages": [{"role": "user", "content": "\\ud800"}]}',  # a lone surrogate escape
        b'{"messages": [{"role": "user", "content": "\\udc00x"}]}',
        b'{"messages": [{"role": "user", "content": "a"}], "x": ' + b"[" * 10**5 + b"]" * 10**5 + b"}",  # ignored
        b'{"messages": [{"role": "user", "content": "a"}], "response_format": {"type": "json_schema", '
        b'"json_schema": {"schema": ' + b"[" * 5000 + b"]" * 5000 + b"}}}",
        b"[" * 1_000_000,
        b"",
        b"\x00",
    ],
)
def test_hostile_json_is_a_400(body):
    with pytest.raises(APIError) as info:
        decode_body(body, ChatCompletionRequest)
    assert info.value.status == 400


def test_nul_bytes_are_text():
    body = decode_body(b'{"prompt": "a\\u0000b"}', CompletionRequest)
    assert body.prompt == "a\x00b"


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=300) | st.text(max_size=300).map(lambda s: s.encode("utf-8", "surrogatepass")))
def test_decode_body_raises_only_api_errors(body):
    for kind in (ChatCompletionRequest, CompletionRequest):
        try:
            decode_body(body, kind)
        except APIError as exc:
            assert exc.status == 400


# ---- the body-size middleware, at the ASGI level ---------------------------------------------


class Recorder:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)
        self.num_received = 0
        self.sent: list[dict] = []

    async def receive(self):
        self.num_received += 1
        chunk = self.chunks.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(self.chunks)}

    async def send(self, message):
        self.sent.append(message)

    @property
    def status(self) -> int:
        return self.sent[0]["status"]


def scope(content_length: int | None) -> dict:
    headers = [(b"content-type", b"application/json")]
    if content_length is not None:
        headers.append((b"content-length", str(content_length).encode()))
    return {"type": "http", "method": "POST", "path": "/", "headers": headers}


async def reading_app(scope, receive, send):
    """Reads the whole body (as ``request.body()`` does), then answers 200."""
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})


async def test_content_length_over_the_limit_is_a_413_before_reading():
    io = Recorder([b"x" * 10])
    await BodySizeLimit(reading_app, max_body_bytes=9)(scope(10), io.receive, io.send)
    assert io.status == 413
    assert io.num_received == 0
    headers = dict(io.sent[0]["headers"])
    assert headers[b"connection"] == b"close"
    body = msgspec.json.decode(io.sent[1]["body"])
    assert body["error"]["code"] == "request_too_large"


async def test_chunked_body_stops_at_the_limit():
    io = Recorder([b"x" * 4] * 100)
    with pytest.raises(APIError) as info:  # the app's APIError handler turns it into the response
        await BodySizeLimit(reading_app, max_body_bytes=9)(scope(None), io.receive, io.send)
    assert info.value.status == 413
    assert io.num_received == 3  # 12 bytes > 9: not one chunk more


async def test_within_the_limit_passes_through():
    for length in (9, None):
        io = Recorder([b"x" * 5, b"x" * 4])
        await BodySizeLimit(reading_app, max_body_bytes=9)(scope(length), io.receive, io.send)
        assert io.status == 200


def test_serve_flags_set_the_limits(capsys):
    from trillium.cli import _LIMIT_FLAGS, main

    assert set(_LIMIT_FLAGS) == {f.name for f in dataclasses.fields(InputLimits)}  # one flag per limit
    with pytest.raises(SystemExit) as info:
        main(["serve", "--max-messages", "0"])
    assert info.value.code == 2
    assert "--max-messages must be at least 1" in capsys.readouterr().err
