"""Tool calling without the engine: formats from templates, the fallback prompt, the call grammar
(compiled by llguidance against the default model's vocabulary) and the call parsers."""

from __future__ import annotations

import json

import pytest

from trillium.protocol import StructuredOutputs
from trillium.tools import (
    ContentDelta,
    FunctionTool,
    ToolCallReady,
    ToolChoice,
    ToolFormat,
    ToolSpecError,
    make_parser,
    prepare_conversation,
    tool_format,
    tool_grammar,
)
from trillium.tools.formats import FALLBACK
from trillium.tools.grammar import closed_objects

WEATHER = FunctionTool(
    "get_weather",
    "Weather in a city",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
TIME = FunctionTool("get_time", None, {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]})
NAMES = frozenset({"get_weather", "get_time"})
QWEN_LIKE = (
    "{% if tools %}<|im_start|>system\n# Tools\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>"
    "<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
    "{% for c in m.tool_calls or [] %}<tool_call>\n{{ c.function | tojson }}\n</tool_call>{% endfor %}"
    "<|im_end|>\n{% endfor %}"
)


def run(parser, pieces):
    events = []
    for piece in pieces:
        events += parser.feed(piece)
    events += parser.finish()
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    return content, [(e.call.name, json.loads(e.call.arguments)) for e in events if isinstance(e, ToolCallReady)]


# ---- formats and prompts ------------------------------------------------------------------------


def test_format_is_read_from_the_template(tok):
    assert tool_format(None) == FALLBACK
    assert tool_format(tok.chat_template) == FALLBACK  # no tools section
    assert tool_format(QWEN_LIKE) == ToolFormat("hermes", native=True)
    assert tool_format("{% if tools %}<|python_tag|>{% endif %}") == ToolFormat("llama3_json", native=True)
    assert tool_format("{{ tools }} [TOOL_CALLS]") == FALLBACK  # a format we do not parse


def test_fallback_describes_tools_and_renders_the_history_as_text(tok):
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "18C"},
        {"role": "tool", "tool_call_id": "b", "content": "25C"},
    ]
    messages, extra = prepare_conversation(history, [WEATHER], FALLBACK)
    assert extra == {}
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[0]["content"].startswith("Be brief.\n\n# Tools")
    assert json.dumps(WEATHER.openai()) in messages[0]["content"]
    assert messages[2]["content"] == (
        '<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name":"get_weather","arguments":{"city":"Rome"}}\n</tool_call>'
    )
    assert messages[3]["content"] == "<tool_response>\n18C\n</tool_response>\n<tool_response>\n25C\n</tool_response>"
    # the default model's template renders all of it
    prompt = tok.apply_chat_template(messages)
    assert "<tool_response>\n25C" in prompt and "# Tools" in prompt


def test_native_template_gets_tools_and_argument_objects():
    history = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "get_time", "arguments": '{"tz":"UTC"}'}}
            ],
        },
    ]
    messages, extra = prepare_conversation(history, [TIME], ToolFormat("hermes", native=True))
    assert extra["tools"] == [TIME.openai()]
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"tz": "UTC"}
    with pytest.raises(ToolSpecError) as err:
        bad = [{**history[1], "tool_calls": [{"function": {"name": "get_time", "arguments": "{not json"}}]}]
        prepare_conversation(bad, [TIME], ToolFormat("hermes", native=True))
    assert err.value.param == "messages[0].tool_calls[0].function.arguments"


def test_tool_choice_and_names_are_checked():
    with pytest.raises(ToolSpecError):
        FunctionTool("bad name!")
    with pytest.raises(ToolSpecError) as err:
        ToolChoice("function", "nope").check([WEATHER])
    assert err.value.param == "tool_choice"
    with pytest.raises(ToolSpecError):
        ToolChoice("required").check([])


# ---- parsers ------------------------------------------------------------------------------------

CALLS_TEXT = (
    'Let me check.\n<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>'
)


@pytest.mark.parametrize("step", [1, 3, 7, len(CALLS_TEXT)])
def test_hermes_streaming_equals_whole(step):
    pieces = [CALLS_TEXT[i : i + step] for i in range(0, len(CALLS_TEXT), step)]
    content, calls = run(make_parser(FALLBACK, NAMES), pieces)
    assert content == "Let me check."
    assert calls == [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})]


def test_hermes_holds_back_a_possible_opener_only():
    parser = make_parser(FALLBACK, NAMES)
    assert parser.feed("Hello <tool_ca") == [ContentDelta("Hello")]
    assert parser.feed("rt is here") == [ContentDelta(" <tool_cart is here")]
    assert parser.finish() == []


@pytest.mark.parametrize(
    "text",
    [
        'Hi <tool_call>\n{"name":"get_weather","argu',  # cut short by max_tokens
        'Hi <tool_call>\n{"name":"get_weather","arguments":{"city":"Paris"}\n</tool_call>',  # not JSON
        'Hi <tool_call>\n{"name":"launch_rockets","arguments":{}}\n</tool_call>',  # not an offered tool
        'Hi <tool_call>\n{"name":"get_weather","arguments":"Paris"}\n</tool_call>',  # arguments not an object
    ],
)
def test_a_broken_call_is_neither_a_call_nor_content(text):
    """Call markup never reaches content: a call cut short or not valid is dropped whole."""
    for step in (1, 5, len(text)):
        assert run(make_parser(FALLBACK, NAMES), [text[i : i + step] for i in range(0, len(text), step)]) == ("Hi", [])


@pytest.mark.parametrize("cut_at", range(1, len("<tool_call>")))
def test_an_opener_cut_by_max_tokens_is_not_content(cut_at):
    parser = make_parser(FALLBACK, NAMES)
    events = parser.feed("Sure. \n" + "<tool_call>"[:cut_at]) + parser.finish(cut=True)
    assert events == [ContentDelta("Sure.")]
    # Ended by the model (EOS) rather than cut, the same text is what it wrote: content.
    parser = make_parser(FALLBACK, NAMES)
    events = parser.feed("a " + "<tool_call>"[:cut_at]) + parser.finish()
    assert "".join(e.text for e in events if isinstance(e, ContentDelta)) == "a " + "<tool_call>"[:cut_at]


def test_a_closing_tag_inside_an_argument_does_not_end_the_call():
    # The grammar lets "</tool_call>" appear inside a JSON string: the call ends after its object.
    text = '<tool_call>\n{"name":"get_weather","arguments":{"city":"a</tool_call>b"}}\n</tool_call>'
    for step in (1, 4, len(text)):
        content, calls = run(make_parser(FALLBACK, NAMES), [text[i : i + step] for i in range(0, len(text), step)])
        assert (content, calls) == ("", [("get_weather", {"city": "a</tool_call>b"})])
    # not an object: dropped up to the first closing tag, then parsing goes on
    content, calls = run(
        make_parser(FALLBACK, NAMES), ["<tool_call>\nnope</tool_call> then " + call("get_time", {"tz": "X"})]
    )
    assert content == "then" and calls == [("get_time", {"tz": "X"})]


def test_llama3_json_calls_and_text():
    fmt = ToolFormat("llama3_json", native=True)
    text = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}; {"name": "get_time", "parameters": {"tz": "UTC"}}'
    for step in (1, 5, len(text)):
        content, calls = run(make_parser(fmt, NAMES), [text[i : i + step] for i in range(0, len(text), step)])
        assert (content, calls) == ("", [("get_weather", {"city": "Oslo"}), ("get_time", {"tz": "UTC"})])
    assert run(make_parser(fmt, NAMES), ["It is ", "sunny {really}"]) == ("It is sunny {really}", [])
    # a call must start the reply: text that starts otherwise (whitespace included) is content
    assert run(make_parser(fmt, NAMES), [' {"name": "get_time", "parameters": {"tz": "UTC"}}'])[1] == []
    # a call cut short by max_tokens is dropped, as is a lone <|python_tag|>: no call markup in content
    assert run(make_parser(fmt, NAMES), ['{"name": "get_weather", "param']) == ("", [])
    assert run(make_parser(fmt, NAMES), ['<|python_tag|>{"name": "get_', "weather"]) == ("", [])
    assert run(make_parser(fmt, NAMES), ["<|python_tag|>"]) == ("", [])


# ---- grammar ------------------------------------------------------------------------------------


def accepts(compiler, tok, grammar: str, text: str) -> bool:
    matcher = compiler.compile(StructuredOutputs(grammar=grammar)).new_matcher()
    return all(matcher.accept(t) for t in tok.encode(text, add_special_tokens=False)) and matcher.is_accepting


def call(name, args):
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args}, separators=(',', ':'))}\n</tool_call>"


def test_required_grammar_allows_only_valid_calls(compiler, tok):
    grammar = tool_grammar([WEATHER, TIME], ToolChoice("required"), True, FALLBACK)
    assert grammar is not None
    assert accepts(compiler, tok, grammar, call("get_weather", {"city": "Paris"}))
    assert accepts(
        compiler, tok, grammar, call("get_weather", {"city": "Paris"}) + "\n" + call("get_time", {"tz": "X"})
    )
    assert not accepts(compiler, tok, grammar, "Sure! " + call("get_weather", {"city": "Paris"}))
    assert not accepts(compiler, tok, grammar, call("get_weather", {"town": "Paris"}))  # schema: city required
    assert not accepts(compiler, tok, grammar, call("get_weather", {"city": "Paris", "extra": 1}))  # closed object
    assert not accepts(compiler, tok, grammar, call("get_time", {"tz": 3}))
    single = tool_grammar([WEATHER, TIME], ToolChoice("required"), False, FALLBACK)
    assert not accepts(compiler, tok, single, call("get_weather", {"city": "a"}) + "\n" + call("get_time", {"tz": "b"}))


def test_named_and_auto_grammars(compiler, tok):
    named = tool_grammar([WEATHER, TIME], ToolChoice("function", "get_time"), True, FALLBACK)
    assert accepts(compiler, tok, named, call("get_time", {"tz": "UTC"}))
    assert not accepts(compiler, tok, named, call("get_weather", {"city": "Paris"}))
    auto = tool_grammar([WEATHER, TIME], ToolChoice("auto"), True, FALLBACK)
    assert accepts(compiler, tok, auto, "Just text, no calls.")
    assert accepts(compiler, tok, auto, "Checking. " + call("get_weather", {"city": "Paris"}))
    assert not accepts(compiler, tok, auto, "Checking. <tool_call>\nnot json")
    assert tool_grammar([WEATHER], ToolChoice("none"), True, FALLBACK) is None


def test_closed_objects_keeps_explicit_choices():
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "object", "properties": {"b": {"type": "string"}}},
            "c": {"enum": [{"properties": {}}]},
        },
        "additionalProperties": True,
    }
    closed = closed_objects(schema)
    assert closed["additionalProperties"] is True
    assert closed["properties"]["a"]["additionalProperties"] is False
    assert closed["properties"]["c"] == {"enum": [{"properties": {}}]}
