"""Input limits and hostile bodies against a real server (default limits, ``SERVER_ARGS``).

Each limit is a 4xx in the OpenAI error shape naming the field; a body over the limit is a 413
before the server reads it (the reported failure: one 200 MB chat request drove the server past
16 GB RSS); hypothesis-generated hostile bodies never get a 5xx and the server stays up.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trillium.server.limits import MiB

CHAT = "/v1/chat/completions"
MAX_BODY = 8 * MiB  # the defaults, with SERVER_ARGS' --max-model-len 2048 and 0.25 GiB fp32 KV
MAX_PROMPT_CHARS = 64 * 1024
MAX_OUTPUT_TOKENS = 4 * 2048


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        line = next(line for line in f if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def assert_error(r: httpx.Response, status: int, param: str | None = None, code: str | None = "limit_exceeded"):
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    return error


def chat(content: str = "Hi", **kwargs):
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 2, **kwargs}


def one_long_string(size: int, chunk: int = MiB):
    """A chat body of ``size`` bytes (one long string), produced as it is sent."""
    head, tail = b'{"messages": [{"role": "user", "content": "', b'"}]}'
    yield head
    left = size - len(head) - len(tail)
    while left > 0:
        yield b"a" * min(chunk, left)
        left -= chunk
    yield tail


@pytest.mark.parametrize("with_length", [True, False], ids=["content-length", "chunked"])
def test_huge_body_is_a_413_before_it_is_read(server, with_length):
    """The reported failure, bounded: 200 MB with a Content-Length, 64 MB chunked."""
    size = (200 if with_length else 64) * MiB
    headers = {"Content-Type": "application/json"}
    if with_length:
        headers["Content-Length"] = str(size)
    rss_before = rss_bytes(server.proc.pid)
    start = time.monotonic()
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        r = client.post(CHAT, content=one_long_string(size), headers=headers)
        elapsed = time.monotonic() - start
        error = assert_error(r, 413, code="request_too_large")
        assert "--max-body-bytes" in error["message"]
        assert r.headers["connection"] == "close"
        assert elapsed < 10
        assert client.get("/health").status_code == 200
    # Starlette buffers at most the limit; the rest is never read.
    assert rss_bytes(server.proc.pid) - rss_before < 2 * MAX_BODY


def test_body_at_the_limit_is_read(http):
    body = json.dumps(chat(" " * (MAX_BODY - 100))).encode()  # spaces: prompt chars, not body size
    assert len(body) <= MAX_BODY
    assert_error(http.post(CHAT, content=body), 400, "messages")


def test_message_count(http):
    r = http.post(CHAT, json={"messages": [{"role": "user", "content": "a"}] * 2049, "max_tokens": 2})
    error = assert_error(r, 400, "messages")
    assert "--max-messages" in error["message"]
    assert_error(http.post("/tokenize", json={"messages": [{"role": "user", "content": "a"}] * 2049}), 400, "messages")


def test_prompt_characters_before_tokenization(http):
    big = "x" * (MAX_PROMPT_CHARS + 1)
    assert "--max-prompt-chars" in assert_error(http.post(CHAT, json=chat(big)), 400, "messages")["message"]
    assert_error(http.post("/v1/completions", json={"prompt": big, "max_tokens": 2}), 400, "prompt")
    assert_error(http.post("/tokenize", json={"prompt": big}), 400, "prompt")
    assert_error(http.post("/detokenize", json={"tokens": [1] * (MAX_PROMPT_CHARS + 1)}), 400, "tokens")
    # Split over messages counts the same.
    halves = [{"role": "user", "content": big[: len(big) // 2]}, {"role": "user", "content": big[len(big) // 2 :]}]
    assert_error(http.post(CHAT, json={"messages": halves, "max_tokens": 2}), 400, "messages")


def test_logit_bias_and_stop_sizes(http):
    bias = {str(i): 1.0 for i in range(1025)}
    assert_error(http.post(CHAT, json=chat(logit_bias=bias)), 400, "logit_bias")
    assert_error(http.post("/v1/completions", json={"prompt": "a", "stop": ["x" * 4097]}), 400, "stop")
    r = http.post(CHAT, json=chat(stop=["x" * 1000] * 4, logit_bias={str(i): 0.0 for i in range(1024)}))
    assert r.status_code == 200, r.text


def test_n_times_max_tokens_and_kv(http):
    # 5 x 1700 = 8500 output tokens > 4 x max_model_len.
    error = assert_error(http.post(CHAT, json=chat(n=5, max_tokens=1700)), 400, "max_tokens")
    assert "--max-output-tokens" in error["message"]
    # 3 x (prompt + 2000) tokens of KV > the pool (0.25 GiB of fp32 KV: ~5800 tokens).
    error = assert_error(http.post(CHAT, json=chat(n=3, max_tokens=2000)), 400, "max_tokens")
    assert "--max-kv-tokens" in error["message"]
    # Without max_tokens a chat choice may fill the context: 4 x ~2048 is over the pool too.
    assert_error(http.post(CHAT, json={**chat(n=4), "max_tokens": None}), 400, "max_tokens")


def nested_schema(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def test_grammar_size_and_depth(http):
    big = {"type": "string", "enum": ["v" * 1000] * 300}
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": big}}
    error = assert_error(http.post(CHAT, json=chat(response_format=rf)), 400, "response_format.json_schema.schema")
    assert "--max-grammar-bytes" in error["message"]
    r = http.post("/v1/completions", json={"prompt": "a", "structured_outputs": {"regex": "a" * 300_000}})
    assert_error(r, 400, "structured_outputs.regex")
    deep = {"json": nested_schema(70)}  # 71 levels of JSON objects
    error = assert_error(http.post(CHAT, json=chat(structured_outputs=deep)), 400, "structured_outputs.json")
    assert "--max-json-depth" in error["message"]
    deep_text = {"json": json.dumps(nested_schema(70))}
    assert_error(http.post(CHAT, json=chat(structured_outputs=deep_text)), 400, "structured_outputs.json")


def test_deeply_nested_and_malformed_bodies(http):
    for body in (
        b'{"messages": [{"role": "user", "content": "a"}], "x": ' + b"[" * 200_000 + b"]" * 200_000 + b"}",
        b"[" * 1_000_000,
        b'{"messages": [{"role": "user", "content": "\xff\xfe"}], "max_tokens": 2}',
        b'{"messages": [{"role": "user", "content": "\\ud800"}], "max_tokens": 2}',
    ):
        assert_error(http.post(CHAT, content=body), 400, code=None)
    r = http.post(CHAT, json=chat("a\x00b\x00"))  # NUL bytes are text
    assert r.status_code == 200, r.text


# ---- hypothesis: hostile bodies ----------------------------------------------------------------

ROUTES = [CHAT, "/v1/completions", "/tokenize", "/detokenize"]
FIELDS = [
    "model", "messages", "prompt", "tokens", "max_tokens", "max_completion_tokens", "n", "stop", "stream",
    "stream_options", "logit_bias", "logprobs", "top_logprobs", "temperature", "top_p", "top_k", "seed",
    "response_format", "structured_outputs", "echo", "min_tokens", "repetition_penalty", "cache_salt",
]  # fmt: skip
hostile_text = st.text(st.characters(exclude_categories=()), max_size=40) | st.sampled_from(
    ["", "\x00", "\ud800", "\udfff", "\ufeff", "<|im_end|>", "user", "text", "json_schema", "system"]
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | hostile_text
)
json_values = st.recursive(scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(hostile_text, c, max_size=4))
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", "bogus"]) | json_values},
    optional={"content": hostile_text | json_values | st.lists(st.fixed_dictionaries({"type": st.just("text")}))},
)
request_dicts = st.dictionaries(st.sampled_from(FIELDS), json_values | st.lists(message, max_size=3), max_size=8)


def json_bytes(value) -> bytes:
    """JSON text; lone surrogates as ``\\udXXX`` escapes (``ensure_ascii``), as a client may send them."""
    return json.dumps(value, ensure_ascii=True).encode()


@st.composite
def hostile_bodies(draw) -> bytes:
    kind = draw(st.sampled_from(["request", "request", "json", "bytes", "deep", "huge", "bad-utf8"]))
    if kind == "request":
        body = draw(request_dicts)
        if draw(st.booleans()):  # often enough a valid core, so that the other fields get checked
            body.setdefault("messages", [{"role": "user", "content": "hi"}])
            body.setdefault("prompt", "hi")
        # Bounded generation: a valid request would otherwise decode up to the context length.
        for key in ("max_tokens", "max_completion_tokens"):
            if isinstance(body.get(key), int) and 4 < body[key] < 2048:
                body[key] = 4
        body.setdefault("max_tokens", 4)
        return json_bytes(body)
    if kind == "json":
        return json_bytes(draw(json_values))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "deep":
        depth = draw(st.sampled_from([50, 65, 999, 1000, 5000, 300_000]))
        opener, closer = draw(st.sampled_from([(b"[", b"]"), (b'{"a":', b"}")]))
        inner = opener * depth + b"1" + closer * depth
        field = draw(st.sampled_from(["x", "messages", "response_format", "structured_outputs", "logit_bias"]))
        return b'{"' + field.encode() + b'": ' + inner + b', "prompt": "a", "max_tokens": 2}'
    if kind == "huge":
        size = draw(st.sampled_from([MAX_PROMPT_CHARS + 1, 3 * MiB, MAX_BODY + 1]))
        field = draw(st.sampled_from(["content", "prompt", "stop", "model"]))
        filler = "a" * size
        body = chat(filler) if field == "content" else {**chat(), field: filler, "prompt": "a"}
        return json_bytes(body)
    valid = json_bytes(chat("hello"))  # bad-utf8: invalid bytes inside a string
    junk = draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf", b"\x00"]))
    return valid.replace(b"hello", b"he" + junk + b"llo")


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(route=st.sampled_from(ROUTES), body=hostile_bodies())
def test_hostile_bodies_never_a_5xx(server, route, body):
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        r = client.post(route, content=body, headers={"Content-Type": "application/json"})
        assert r.status_code < 500, (route, body[:300], r.text[:500])
        if r.status_code >= 400:
            error = r.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}, r.text
        elif r.headers["content-type"].startswith("text/event-stream"):
            assert '"internal_error"' not in r.text
        assert client.get("/health").status_code == 200
    assert server.proc.poll() is None
