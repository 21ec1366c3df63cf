"""Anthropic's Messages API without a server: the request as the chat request that serves it
(server/anthropic_convert.py), errors renamed to the request's own fields and in Anthropic's shape
(server/anthropic_errors.py), the content blocks and stream events of a response
(server/anthropic_builder.py), the ``x-api-key`` header, and the stop string a stream reports."""

from __future__ import annotations

import hashlib
import json

import msgspec
import pytest
from starlette.requests import Request

from trillium.engine_client import StreamOutput
from trillium.metering.tenants import AccessConfig, AuthSettings, TenantLimits
from trillium.protocol import FinishReason
from trillium.server.anthropic_builder import MessageBuilder, anthropic_usage, sse
from trillium.server.anthropic_convert import anthropic_params, chat_request, renamed, served_model
from trillium.server.anthropic_errors import anthropic_error, error_response
from trillium.server.anthropic_shapes import AnthropicMessage, AnthropicStreamEvent, MessagesRequest
from trillium.server.auth import Authenticator
from trillium.server.choice_split import OutputParsing
from trillium.server.errors import APIError
from trillium.server.reasoning import reasoning_format
from trillium.server.schema import NamedToolChoice, chat_messages, decode_body
from trillium.server.tool_calls import ToolCalling
from trillium.tokenizer.stop import StopStringMatcher
from trillium.tools import FunctionTool, ToolChoice, ToolFormat

WEATHER = {
    "name": "get_weather",
    "description": "Weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "cache_control": {"type": "ephemeral"},
}


def decode(**body) -> MessagesRequest:
    body = {"model": "claude-sonnet-4-5", "max_tokens": 16, **body}
    return decode_body(msgspec.json.encode(body), MessagesRequest)


def bad(**body) -> APIError:
    with pytest.raises(APIError) as info:
        chat_request(decode(**body))
    return info.value


# ---- the request as a chat request ----------------------------------------------------------------


def test_system_and_text_blocks_become_chat_messages():
    chat, origins = chat_request(
        decode(
            system=[
                {"type": "text", "text": "x-anthropic-billing-header: cc_version=2; cch=a5145;"},
                {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "\nAnswer in French."},
            ],
            messages=[
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": [{"type": "text", "text": "Bonjour"}]},
                {"role": "user", "content": [{"type": "text", "text": "Say "}, {"type": "text", "text": "more"}]},
            ],
        )
    )
    # the billing header (a per-request hash) is left out: it would defeat the prefix cache
    assert chat_messages(chat) == [
        {"role": "system", "content": "Be brief.\nAnswer in French."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Bonjour"},
        {"role": "user", "content": "Say more"},
    ]
    assert origins == ["system", "messages[0].content", "messages[1].content", "messages[2].content"]
    assert chat.tools is None and chat.tool_choice is None and chat.model is None  # the route checks the model


def test_sampling_fields_map_to_chat_fields():
    chat, _ = chat_request(
        decode(
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=7,
            stop_sequences=["END"],
            temperature=0.5,
            top_p=0.9,
            top_k=20,
            metadata={"user_id": "u-1"},
            stream=True,
            thinking={"type": "disabled"},
        )
    )
    assert (chat.max_tokens, chat.stop, chat.temperature, chat.top_p, chat.top_k) == (7, ["END"], 0.5, 0.9, 20)
    assert chat.user == "u-1" and chat.stream and chat.n == 1
    assert chat.chat_template_kwargs == {"enable_thinking": False}  # Qwen3's switch
    for thinking, kwargs in (({"type": "enabled", "budget_tokens": 1024}, {"enable_thinking": True}), (None, None)):
        body = {"messages": [{"role": "user", "content": "Hi"}], **({"thinking": thinking} if thinking else {})}
        assert chat_request(decode(**body))[0].chat_template_kwargs == kwargs
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    chat, _ = chat_request(
        decode(
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=0,  # a cache warm-up: one token is made, and dropped (MessageBuilder)
            output_config={"format": {"type": "json_schema", "schema": schema}, "effort": "low"},
        )
    )
    assert chat.max_tokens == 1
    assert chat.response_format.type == "json_schema" and chat.response_format.json_schema.schema_ == schema


def test_tool_use_and_tool_result_blocks_become_calls_and_tool_messages():
    chat, origins = chat_request(
        decode(
            tools=[WEATHER],
            messages=[
                {"role": "user", "content": "Weather in Paris?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "I should call the tool.", "signature": "s"},
                        {"type": "text", "text": "Let me look."},
                        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Thanks."},
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_2",
                            "content": [{"type": "text", "text": "no such city"}],
                            "is_error": True,
                        },
                    ],
                },
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_3"}]},
            ],
        )
    )
    messages = chat_messages(chat)
    call = {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
    # thinking is not rendered; results come before the turn's text; a turn of results alone adds no user message
    assert messages[1] == {"role": "assistant", "content": "Let me look.", "tool_calls": [call]}
    assert messages[2:] == [
        {"role": "tool", "content": "sunny", "tool_call_id": "toolu_1"},
        {"role": "tool", "content": "Error: no such city", "tool_call_id": "toolu_2"},
        {"role": "user", "content": "Thanks."},
        {"role": "tool", "content": "", "tool_call_id": "toolu_3"},
    ]
    assert origins[2:] == [
        "messages[2].content[1]",
        "messages[2].content[2]",
        "messages[2].content",
        "messages[3].content[0]",
    ]
    (tool,) = chat.tools
    assert tool.function.name == "get_weather" and tool.function.parameters == WEATHER["input_schema"]


@pytest.mark.parametrize(
    "choice, expected, parallel",
    [
        ({"type": "auto"}, "auto", True),
        ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
        ({"type": "none"}, "none", True),
        (
            {"type": "tool", "name": "get_weather"},
            NamedToolChoice(type="function", function={"name": "get_weather"}),
            True,
        ),
    ],
)
def test_tool_choice(choice, expected, parallel):
    chat, _ = chat_request(decode(tools=[WEATHER], tool_choice=choice, messages=[{"role": "user", "content": "Hi"}]))
    if isinstance(expected, NamedToolChoice):
        assert chat.tool_choice.function.name == "get_weather"
    else:
        assert chat.tool_choice == expected
    assert chat.parallel_tool_calls is parallel


# ---- bad requests name their field ----------------------------------------------------------------


def test_decode_errors_name_the_field():
    for body, param in [
        ({"model": "claude-x", "messages": [{"role": "user", "content": "Hi"}]}, "max_tokens"),
        ({"model": "claude-x", "max_tokens": -1, "messages": [{"role": "user", "content": "Hi"}]}, "max_tokens"),
        (
            {
                "model": "claude-x",
                "max_tokens": 4,
                "system": [{"text": "Hi"}],
                "messages": [{"role": "user", "content": "Hi"}],
            },
            "system[0]",
        ),
        ({"model": "claude-x", "max_tokens": 4, "messages": [{"role": "system", "content": "Hi"}]}, "messages[0].role"),
        (
            {"model": "claude-x", "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
            "messages[0].content[0].type",
        ),
        ({"model": "claude-x", "max_tokens": 4, "messages": []}, "messages"),
    ]:
        with pytest.raises(APIError) as info:
            decode_body(msgspec.json.encode(body), MessagesRequest)
        assert info.value.status == 400 and info.value.param == param, (body, info.value.message)


def test_unservable_requests_name_the_field():
    hi = [{"role": "user", "content": "Hi"}]
    assert bad(tools=[{"name": "web_search", "type": "web_search_20250305"}], messages=hi).param == "tools[0].type"
    assert bad(tools=[{"name": "f"}], messages=hi).param == "tools[0].input_schema"
    assert bad(tools=[WEATHER], tool_choice={"type": "tool"}, messages=hi).param == "tool_choice.name"
    result = {"type": "tool_result", "tool_use_id": "t", "content": "x"}
    assert bad(messages=[{"role": "assistant", "content": [result]}]).param == "messages[0].content[0]"
    use = {"type": "tool_use", "id": "t", "name": "f", "input": {}}
    assert bad(messages=[{"role": "user", "content": [use]}]).param == "messages[0].content[0]"


def test_chat_errors_are_renamed_to_the_request_fields():
    origins = ["system", "messages[0].content", "messages[1].content[2]"]
    assert renamed("messages[2].content", origins) == "messages[1].content[2]"
    assert renamed("messages[9]", origins) == "messages"
    assert renamed("tools[1].function.parameters", origins) == "tools[1].input_schema"
    assert renamed("tool_choice.function.name", origins) == "tool_choice.name"
    assert renamed("stop", origins) == "stop_sequences"
    assert renamed("user", origins) == "metadata.user_id"
    assert renamed("max_tokens", origins) == "max_tokens"
    assert renamed("response_format.json_schema.schema", origins) == "output_config.format.schema"
    with pytest.raises(APIError) as info, anthropic_params(origins):
        raise APIError("too long", param="messages[1]")
    assert info.value.param == "messages[0].content"


def test_claude_names_are_the_served_model():
    served_model("claude-opus-4-1-20250805", "SmolLM2")
    served_model("SmolLM2", "SmolLM2")
    with pytest.raises(APIError) as info:
        served_model("gpt-4o", "SmolLM2")
    assert info.value.status == 404 and info.value.param == "model"
    assert anthropic_error(info.value)["error"]["type"] == "not_found_error"


# ---- errors in Anthropic's shape ------------------------------------------------------------------


@pytest.mark.parametrize(
    "status, kind",
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (405, "invalid_request_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (503, "overloaded_error"),
    ],
)
def test_error_types_by_status(status, kind):
    body = anthropic_error(APIError("nope", status=status))
    assert body == {"type": "error", "error": {"type": kind, "message": "nope"}}


def test_error_shape_follows_the_path():
    exc = APIError("Field required", param="max_tokens", headers={"x-request-id": "msg_1"})
    anthropic = error_response(exc, "/v1/messages")
    assert msgspec.json.decode(anthropic.body) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"},
    }
    assert anthropic.status_code == 400 and anthropic.headers["x-request-id"] == "msg_1"
    assert msgspec.json.decode(error_response(exc, "/v1/messages/count_tokens").body)["type"] == "error"
    openai = msgspec.json.decode(error_response(exc, "/v1/chat/completions").body)
    assert openai["error"]["param"] == "max_tokens"
    assert "type" not in openai and msgspec.json.decode(error_response(exc, "/v1/messagesx").body)["error"]["param"]


# ---- the response ---------------------------------------------------------------------------------


def usage(prompt: int = 20, cached: int = 16, completion: int = 3) -> dict:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def test_usage_counts_cached_tokens_apart():
    assert anthropic_usage(usage()) == {
        "input_tokens": 4,
        "output_tokens": 3,
        "cache_read_input_tokens": 16,
        "cache_creation_input_tokens": 0,
    }


def test_text_stream_events_and_message():
    builder = MessageBuilder("msg_1", "claude-x", None)
    events = builder.feed(StreamOutput("Hel", [1]))
    events += builder.feed(StreamOutput("lo", [2]))
    events += builder.feed(StreamOutput("", [3], FinishReason.STOP))
    assert events == [
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "lo"}},
        {"type": "content_block_stop", "index": 0},
    ]
    message = builder.message(usage())
    assert message["content"] == [{"type": "text", "text": "Hello"}]
    assert (message["id"], message["model"], message["stop_reason"], message["stop_sequence"]) == (
        "msg_1",
        "claude-x",
        "end_turn",
        None,
    )
    msgspec.convert(message, AnthropicMessage)  # the documented shape
    start = builder.message(usage(), started=True)
    assert start["content"] == [] and start["stop_reason"] is None
    delta = builder.message_delta(usage())
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None} and delta["usage"]["output_tokens"] == 3
    for event in [*events, delta, {"type": "message_start", "message": start}]:
        msgspec.convert(event, AnthropicStreamEvent)
    framed = sse(events[0])
    assert framed.startswith(b"event: content_block_start\ndata: {") and framed.endswith(b"\n\n")


def test_stop_reasons():
    length = MessageBuilder("m", "claude", None)
    length.feed(StreamOutput("abc", [1], FinishReason.LENGTH))
    assert length.stop_reason == "max_tokens"
    stopped = MessageBuilder("m", "claude", None)
    stopped.feed(StreamOutput("abc", [1], FinishReason.STOP), stop_sequence="END")
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "END")
    empty = MessageBuilder("m", "claude", None)
    assert empty.feed(StreamOutput("", [1], FinishReason.STOP)) == []
    assert empty.message(usage())["content"] == [] and empty.stop_reason == "end_turn"


def test_a_warm_up_shows_nothing_generated():
    builder = MessageBuilder("m", "claude", None, warm_up=True)
    assert builder.feed(StreamOutput("Hi", [5], FinishReason.STOP)) == []
    counted = builder.counted(usage(prompt=20, cached=0, completion=1))
    assert counted["completion_tokens"] == 0 and counted["total_tokens"] == 20
    message = builder.message(counted)
    assert (
        message["content"] == [] and message["stop_reason"] == "max_tokens" and message["usage"]["output_tokens"] == 0
    )


def test_a_tool_call_is_a_tool_use_block():
    tools = [FunctionTool("get_weather", None, WEATHER["input_schema"])]
    calling = ToolCalling(tools, ToolChoice("auto"), True, ToolFormat("hermes", native=True), False)
    builder = MessageBuilder("m", "claude", OutputParsing(None, calling))
    text = 'Let me check.<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris"}}\n</tool_call>'
    events = builder.feed(StreamOutput(text[:20], [1])) + builder.feed(StreamOutput(text[20:], [2], FinishReason.STOP))
    kinds = [(e["type"], e.get("delta", {}).get("type")) for e in events]
    assert kinds == [
        ("content_block_start", None),
        ("content_block_delta", "text_delta"),
        ("content_block_stop", None),
        ("content_block_start", None),
        ("content_block_delta", "input_json_delta"),
        ("content_block_stop", None),
    ]
    start = events[3]["content_block"]
    assert start["type"] == "tool_use" and start["name"] == "get_weather" and start["input"] == {}
    assert json.loads(events[4]["delta"]["partial_json"]) == {"city": "Paris"}
    message = builder.message(usage())
    assert message["stop_reason"] == "tool_use"
    assert message["content"][0] == {"type": "text", "text": "Let me check."}
    assert message["content"][1] == {
        "type": "tool_use",
        "id": start["id"],
        "name": "get_weather",
        "input": {"city": "Paris"},
    }
    msgspec.convert(message, AnthropicMessage)


def test_reasoning_becomes_a_thinking_block():
    """Under --reasoning-parser the output splits as on every chat API (choice_split.py)."""
    builder = MessageBuilder("m", "claude", OutputParsing(reasoning_format("qwen3"), None))
    events = builder.feed(StreamOutput("<think>Two and", [1, 2]))
    events += builder.feed(StreamOutput(" two.</thi", [3]))
    events += builder.feed(StreamOutput("nk>Four.", [4, 5], FinishReason.STOP))
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    assert "".join(d.get("thinking", "") for d in deltas) == "Two and two."
    assert "".join(d.get("text", "") for d in deltas) == "Four."
    message = builder.message(usage(completion=5))
    assert [b["type"] for b in message["content"]] == ["thinking", "text"]
    assert message["content"][0]["thinking"] == "Two and two." and message["stop_reason"] == "end_turn"
    assert message["usage"]["output_tokens_details"]["thinking_tokens"] > 0
    msgspec.convert(message, AnthropicMessage)


def test_thinking_opens_a_thinking_block_before_the_text():
    builder = MessageBuilder("m", "claude", None)
    events = builder.thinking("Let me ") + builder.thinking("think.") + builder.text("Answer.")
    assert [e["type"] for e in events] == [
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
    ]
    assert events[1]["delta"] == {"type": "thinking_delta", "thinking": "Let me "}
    assert builder.blocks == [
        {"type": "thinking", "thinking": "Let me think.", "signature": ""},
        {"type": "text", "text": "Answer."},
    ]
    for event in events:
        msgspec.convert(event, AnthropicStreamEvent)


# ---- x-api-key, and the stop string that ended a stream --------------------------------------------


def request(headers: dict[str, str]) -> Request:
    raw = [(k.encode(), v.encode()) for k, v in headers.items()]
    return Request(
        {"type": "http", "method": "POST", "path": "/v1/messages", "headers": raw, "client": ("10.0.0.1", 1)}
    )


def test_x_api_key_is_a_key_like_bearer():
    config = AccessConfig(
        limits={"acme": TenantLimits(), "globex": TenantLimits()},
        key_hashes={hashlib.sha256(k.encode()).hexdigest(): t for k, t in (("sk-a", "acme"), ("sk-g", "globex"))},
        admin_key_hashes=frozenset(),
        ledger_path="usage.sqlite",
        auth=AuthSettings(),
    )
    auth = Authenticator(config)
    assert auth.tenant(request({"x-api-key": "sk-a"})) == "acme"
    assert auth.tenant(request({"authorization": "Bearer sk-g", "x-api-key": "sk-a"})) == "globex"  # Bearer first
    assert auth.tenant(request({"authorization": "Basic abc", "x-api-key": "sk-a"})) == "acme"
    for headers, code in (
        ({}, "missing_api_key"),
        ({"x-api-key": " "}, "missing_api_key"),
        ({"x-api-key": "sk-x"}, "invalid_api_key"),
    ):
        with pytest.raises(APIError) as info:
            auth.tenant(request(headers))
        assert (info.value.status, info.value.code) == (401, code)
        assert anthropic_error(info.value)["error"]["type"] == "authentication_error"


def test_stop_string_matcher_says_which_stop_string_matched():
    matcher = StopStringMatcher(["END", "STOP"])
    assert matcher.feed("abc ST") == "abc " and matcher.matched is None
    assert matcher.feed("OP and END") == "" and matcher.stopped and matcher.matched == "STOP"
    assert StopStringMatcher([]).matched is None
