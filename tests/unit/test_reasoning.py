"""Reasoning output without the engine: the ``<think>`` split on forced text and token sequences
(streamed in any pieces, cut by max_tokens, with no reasoning at all), its token count, the split
with tool calls, the chat message and usage it makes, the flag, and ``chat_template_kwargs``
rendered by the real Qwen3 chat template exactly as transformers renders it."""

from __future__ import annotations

import pathlib

import msgspec
import pytest

from trillium.config import REASONING_PARSERS, EngineConfig
from trillium.protocol import FinishReason, SamplingParams, StructuredOutputs, ThinkSection, TokenizeRequest
from trillium.server.choice_split import OutputParsing, ReasoningDelta
from trillium.server.errors import APIError
from trillium.server.openai_shapes import ResponseShape, reasoning_usage
from trillium.server.reasoning import FORMATS, ReasoningParser, reasoning_format
from trillium.server.schema import ChatCompletionRequest, chat_template_kwargs, decode_body
from trillium.server.tool_calls import ToolCalling
from trillium.tokenizer.actor import TokenizerActor
from trillium.tokenizer.detokenizer import IncrementalDetokenizer
from trillium.tools import ContentDelta, FunctionTool, ToolCallReady, ToolChoice
from trillium.tools.formats import FALLBACK

QWEN3 = reasoning_format("qwen3")
R1 = reasoning_format("deepseek_r1")
# Qwen/Qwen3-0.6B's chat template, as its tokenizer_config.json ships it.
QWEN3_TEMPLATE = (pathlib.Path(__file__).parents[1] / "data" / "qwen3_chat_template.jinja").read_text()
THOUGHT = "<think>\nThe user greets me. I greet back.\n</think>\n\nHello! How can I help?"


def split(fmt, pieces, end_token_id=None):
    """(reasoning, content, every piece returned) of ``pieces`` fed one by one, then finished."""
    parser = ReasoningParser(fmt, end_token_id)
    returned = [parser.feed(p) for p in pieces] + [parser.finish()]
    return "".join(r for r, _ in returned), "".join(c for _, c in returned), returned


def chunks(text: str, step: int) -> list[str]:
    return [text[i : i + step] for i in range(0, len(text), step)]


# ---- the split on text ----------------------------------------------------------------------------


@pytest.mark.parametrize("step", [1, 2, 3, 5, 8, len(THOUGHT)])
def test_think_section_splits_off_in_any_pieces(step):
    reasoning, content, returned = split(QWEN3, chunks(THOUGHT, step))
    assert (reasoning, content) == ("The user greets me. I greet back.", "Hello! How can I help?")
    for r, c in returned:  # no piece ever holds a tag or a part of one
        assert "<" not in r and "<" not in c


def test_closing_tag_split_across_deltas():
    parser = ReasoningParser(QWEN3)
    assert parser.feed("<think>") == ("", "")
    assert parser.feed("I should say hi</th") == ("I should say hi", "")  # "</th" held back
    assert parser.in_reasoning
    assert parser.feed("ink>\n\nHi") == ("", "Hi")
    assert not parser.in_reasoning
    assert parser.feed(" there") == ("", " there")
    assert parser.finish() == ("", "")


def test_a_held_back_tag_that_is_not_one_is_text():
    assert split(QWEN3, ["<think>a </thin", "g> b</think>c"])[:2] == ("a </thing> b", "c")
    assert split(QWEN3, ["<", "b>bold</b>"])[:2] == ("", "<b>bold</b>")  # not an opener: content


def test_length_stop_inside_the_thinking_is_all_reasoning():
    reasoning, content, _ = split(QWEN3, ["<think>\nFirst, ", "the user wants ", "a poem. "])
    assert (reasoning, content) == ("First, the user wants a poem.", "")
    # cut inside the closing tag: what was written of it stays reasoning text
    assert split(QWEN3, ["<think>x</thi"])[:2] == ("x</thi", "")


@pytest.mark.parametrize("text", ["Hello there.", "  \n Hello there.\n", "<b>Hi</b>", "", "Use <think> tags"])
def test_qwen3_without_a_think_section_is_content_unchanged(text):
    """enable_thinking false: the prompt closed an empty think section and the model answers
    directly; the answer is content exactly as the model wrote it."""
    for step in (1, 4, max(len(text), 1)):
        assert split(QWEN3, chunks(text, step))[:2] == ("", text)


def test_text_after_the_reasoning_is_content_even_with_tags():
    assert split(QWEN3, ["<think>a</think>b <think>c</think>"])[:2] == ("a", "b <think>c</think>")


@pytest.mark.parametrize("step", [1, 3, 100])
def test_deepseek_r1_starts_inside_the_reasoning(step):
    """DeepSeek-R1's template opens <think> in the prompt: the output may not repeat it."""
    assert split(R1, chunks("Let me think.\n</think>\n\nThe answer is 4.", step))[:2] == (
        "Let me think.",
        "The answer is 4.",
    )
    assert split(R1, chunks("<think>\nLet me think.</think>4", step))[:2] == ("Let me think.", "4")
    # never closed (cut by max_tokens): everything is reasoning, as vLLM's deepseek_r1 parser has it
    assert split(R1, chunks("Still thinking about it", step))[:2] == ("Still thinking about it", "")


def test_formats_and_flag():
    assert set(FORMATS) == set(REASONING_PARSERS)
    with pytest.raises(ValueError, match="qwen3"):
        reasoning_format("nope")
    with pytest.raises(ValueError, match="reasoning_parser"):
        EngineConfig(reasoning_parser="granite")
    from trillium import cli

    with pytest.raises(SystemExit):
        cli.main(["serve", "--reasoning-parser", "granite"])


# ---- forced token sequences --------------------------------------------------------------------


def stream(tok, text: str):
    """``text`` as the engine streams it: token by token, through the incremental detokenizer."""
    detok = IncrementalDetokenizer(tok)
    ids = tok.encode(text)
    return [(detok.add([t]), [t]) for t in ids], ids


def test_forced_token_sequence_and_its_reasoning_tokens(tok):
    """The default model's vocabulary spells the tags in several tokens: the split happens on
    the text, and the reasoning tokens are those up to the one that completed ``</think>``."""
    deltas, ids = stream(tok, THOUGHT)
    parser = ReasoningParser(QWEN3)
    returned = [parser.feed(text, token_ids) for text, token_ids in deltas] + [parser.finish()]
    assert "".join(r for r, _ in returned) == "The user greets me. I greet back."
    assert "".join(c for _, c in returned) == "Hello! How can I help?"
    closed_at = next(n for n in range(1, len(ids) + 1) if "</think>" in tok.decode(ids[:n]))
    assert parser.num_reasoning_tokens == closed_at < len(ids)


def test_reasoning_tokens_by_the_closing_tokens_id():
    """When ``</think>`` is one token, its id finds it, however the deltas coalesced tokens."""
    end = 99
    parser = ReasoningParser(QWEN3, end_token_id=end)
    parser.feed("<think>abc", [7, 8, 9])
    assert parser.num_reasoning_tokens == 3  # still inside: every token so far
    parser.feed("de</think>\n\nHi there", [10, end, 11, 12, 13])  # one coalesced delta
    assert parser.num_reasoning_tokens == 5
    parser.feed(" friend", [14])
    assert parser.num_reasoning_tokens == 5
    # no reasoning at all: none
    parser = ReasoningParser(QWEN3, end_token_id=end)
    parser.feed("Hi", [1, 2])
    parser.finish()
    assert parser.num_reasoning_tokens == 0


def test_cut_inside_the_reasoning_counts_every_token(tok):
    deltas, ids = stream(tok, "<think>\nA long train of thought that max_tokens cuts")
    parser = ReasoningParser(QWEN3)
    for text, token_ids in deltas:
        parser.feed(text, token_ids)
    assert parser.finish()[1] == ""
    assert parser.num_reasoning_tokens == len(ids)


# ---- with tool calls, and the chat message ------------------------------------------------------

WEATHER = FunctionTool("get_weather", None, {"type": "object", "properties": {"city": {"type": "string"}}})
CALL = '<tool_call>\n{"name":"get_weather","arguments":{"city":"Oslo"}}\n</tool_call>'


def calling() -> ToolCalling:
    return ToolCalling([WEATHER], ToolChoice("auto"), True, FALLBACK, False)


@pytest.mark.parametrize("step", [1, 4, 1000])
def test_reasoning_then_a_tool_call(step):
    splitter = OutputParsing(QWEN3, calling()).new_splitter()
    pieces = []
    text = "<think>I need the weather.</think>\n\nLet me look." + CALL
    parts = chunks(text, step)
    for k, part in enumerate(parts):
        pieces += splitter.feed(part, (), FinishReason.STOP if k == len(parts) - 1 else None)
    assert splitter.reasoning == "I need the weather."
    assert splitter.content == "Let me look."
    assert [c.name for c in splitter.calls] == ["get_weather"]
    kinds = [type(p) for p in pieces]
    assert kinds.index(ContentDelta) > max(i for i, k in enumerate(kinds) if k is ReasoningDelta)
    assert kinds[-1] is ToolCallReady


@pytest.mark.parametrize("name", ["qwen3", "deepseek_r1"])
def test_required_calls_are_constrained_only_after_the_reasoning(compiler, tok, name):
    """A thinking model may reason before a required call: the call grammar lets its think section
    in (optional where the model opens it, required where the prompt did) and constrains the
    calls after it; the reasoning may hold neither the closing tag nor a call opener."""
    fmt = reasoning_format(name)
    tools = ToolCalling([WEATHER], ToolChoice("required"), False, FALLBACK, False, reasoning=fmt)
    assert (
        tools.lets_reasoning_first
        and not ToolCalling([WEATHER], ToolChoice("required"), False, FALLBACK, False).lets_reasoning_first
    )
    constraint = tools.constraint()
    assert constraint is not None
    grammar = compiler.compile(constraint)

    def accepts(text: str) -> bool:
        matcher = grammar.new_matcher()
        return all(matcher.accept(t) for t in tok.encode(text)) and matcher.is_accepting

    assert accepts("<think>\nThe user wants the weather.\n</think>\n\n" + CALL)
    assert accepts("Oslo, then.</think>\n" + CALL) == fmt.starts_inside  # R1: the prompt opened it
    assert accepts(CALL) == (not fmt.starts_inside)  # R1 must close the reasoning first
    assert not accepts("<think>a " + CALL + "</think>" + CALL)  # no call inside the reasoning
    assert not accepts("<think>a</think>Sure. " + CALL)  # after it, the call and nothing else
    assert not accepts("<think>a</think>\n" + CALL.replace("Oslo", 'Oslo"}, "x": "1'))  # arguments still checked
    # with the grammar's own first token a call, the split still reads the reasoning and the call
    splitter = OutputParsing(fmt, tools).new_splitter()
    splitter.feed("<think>\nWeather.\n</think>\n\n" + CALL, (), FinishReason.STOP)
    assert (splitter.reasoning, splitter.content, [c.name for c in splitter.calls]) == ("Weather.", "", ["get_weather"])


def test_a_call_cut_by_max_tokens_leaks_no_markup_after_reasoning():
    splitter = OutputParsing(QWEN3, calling()).new_splitter()
    splitter.feed("<think>Weather.</think>" + CALL[:30], (), FinishReason.LENGTH)
    assert (splitter.reasoning, splitter.content, splitter.calls) == ("Weather.", "", [])


def test_chat_message_and_usage():
    shape = ResponseShape("r", "m", True, parsing=OutputParsing(QWEN3))
    thought, plain, cut = (OutputParsing(QWEN3).new_splitter() for _ in range(3))
    thought.feed(THOUGHT, [1] * 10, FinishReason.STOP)
    plain.feed("Just an answer.", [1, 2, 3], FinishReason.STOP)
    cut.feed("<think>hmm", [5, 6], FinishReason.LENGTH)
    usage = {"prompt_tokens": 3, "completion_tokens": 15, "total_tokens": 18, "prompt_tokens_details": {}}
    body = shape.full(
        [(THOUGHT, "stop", None), ("Just an answer.", "stop", None), ("<think>hmm", "length", None)],
        reasoning_usage(usage, [thought, plain, cut]),
        splitters=[thought, plain, cut],
    )
    messages = [c["message"] for c in body["choices"]]
    assert messages[0] == {
        "role": "assistant",
        "content": "Hello! How can I help?",
        "reasoning_content": "The user greets me. I greet back.",
    }
    assert messages[1] == {"role": "assistant", "content": "Just an answer.", "reasoning_content": None}
    assert messages[2] == {"role": "assistant", "content": None, "reasoning_content": "hmm"}
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 10 + 0 + 2}
    chunk = shape.chunk(0, None, None, reasoning="hmm")
    assert chunk["choices"][0]["delta"] == {"reasoning_content": "hmm"}
    assert reasoning_usage(usage, [None]) is usage  # no reasoning parser: no details


# ---- chat_template_kwargs -----------------------------------------------------------------------

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "<think>\nEasy.\n</think>\n\n4."},
    {"role": "user", "content": "And in words?"},
]


@pytest.mark.parametrize("kwargs", [{"enable_thinking": False}, {"enable_thinking": True}, {}])
@pytest.mark.parametrize("with_tools", [False, True])
def test_qwen3_template_renders_as_transformers_does(tok, kwargs, with_tools):
    """A chat request's ``chat_template_kwargs`` reach the template through the tokenizer actor,
    and the real Qwen3 template renders what transformers renders from it."""
    from transformers.utils.chat_template_utils import render_jinja_template

    tools = [WEATHER.openai()] if with_tools else None
    tok.chat_template = QWEN3_TEMPLATE  # (the fixture is this module's own)
    message = TokenizeRequest(messages=CONVERSATION, tools=tools, chat_template_kwargs=kwargs or None)
    ours = TokenizerActor(tok, None).encode(message)  # type: ignore[arg-type]  # no inbox needed
    (theirs,), _ = render_jinja_template(
        conversations=[CONVERSATION], tools=tools, chat_template=QWEN3_TEMPLATE, add_generation_prompt=True, **kwargs
    )
    assert tok.decode(ours, skip_special_tokens=False) == theirs
    assert theirs.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") == (kwargs == {"enable_thinking": False})


def test_chat_template_kwargs_must_be_an_object_and_not_replace_the_templates_own():
    body = b'{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"enable_thinking": false}}'
    assert chat_template_kwargs(decode_body(body, ChatCompletionRequest)) == {"enable_thinking": False}
    bad = b'{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": "enable_thinking"}'
    with pytest.raises(APIError) as info:
        decode_body(bad, ChatCompletionRequest)
    assert (info.value.status, info.value.param) == (400, "chat_template_kwargs")
    request = msgspec.convert(
        {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"add_generation_prompt": False}},
        ChatCompletionRequest,
    )
    with pytest.raises(APIError) as info:
        chat_template_kwargs(request)
    assert info.value.param == "chat_template_kwargs.add_generation_prompt"


# ---- the Responses API ---------------------------------------------------------------------------


@pytest.mark.parametrize("finish", [FinishReason.STOP, FinishReason.LENGTH])
def test_responses_reasoning_item_and_events_as_the_openai_sdk_reads_them(finish):
    """A ``reasoning`` item (``reasoning_text`` content) before the message, its stream events,
    and the usage's reasoning tokens, each validated by the openai SDK's own types."""
    import pydantic
    from openai.types.responses import ResponseReasoningItem, ResponseStreamEvent

    from trillium.engine_client import StreamOutput
    from trillium.protocol import SamplingParams
    from trillium.server.responses import ResponseBuilder
    from trillium.server.responses_body import ResponsesRequest

    body = msgspec.convert({"input": "hi"}, ResponsesRequest)
    builder = ResponseBuilder("resp_1", "m", body, SamplingParams(), OutputParsing(QWEN3))
    text = THOUGHT if finish == FinishReason.STOP else "<think>\nStill thinking"
    parts = chunks(text, 5)
    events = []
    for k, part in enumerate(parts):
        last = k == len(parts) - 1
        events += builder.feed(StreamOutput(part, [k], finish if last else None))
    adapter: pydantic.TypeAdapter = pydantic.TypeAdapter(ResponseStreamEvent)
    reasoning_events = [
        e
        for e in events
        if e["type"].startswith("response.reasoning_text.")
        or e.get("item", {}).get("type") == "reasoning"
        or e.get("part", {}).get("type") == "reasoning_text"
    ]
    assert len(reasoning_events) == 6 + len([e for e in events if e["type"] == "response.reasoning_text.delta"]) - 1
    for event in reasoning_events:
        adapter.validate_python(event)
    usage = {"prompt_tokens": 2, "completion_tokens": len(parts), "total_tokens": 2 + len(parts)}
    response = builder.response({**usage, "prompt_tokens_details": {"cached_tokens": 0}})
    kinds = [item["type"] for item in response["output"]]
    reasoning = ResponseReasoningItem.model_validate(response["output"][0])
    assert reasoning.content is not None
    reasoning_tokens = response["usage"]["output_tokens_details"]["reasoning_tokens"]
    if finish == FinishReason.STOP:
        assert kinds == ["reasoning", "message"]
        assert reasoning.content[0].text == "The user greets me. I greet back."
        assert response["output"][1]["content"][0]["text"] == "Hello! How can I help?"
        assert 0 < reasoning_tokens < len(parts)
    else:  # cut inside the thinking: no message, every token was reasoning
        assert kinds == ["reasoning"] and response["status"] == "incomplete"
        assert reasoning.content[0].text == "Still thinking"
        assert reasoning_tokens == len(parts)
    deltas = [e["delta"] for e in events if e["type"] == "response.reasoning_text.delta"]
    assert "".join(deltas) == reasoning.content[0].text
    # a client hands the reasoning item back with the next turn's input: accepted, not rendered
    from trillium.server.responses_body import input_messages

    again = msgspec.convert(
        {"input": [reasoning.model_dump(exclude_none=True), {"role": "user", "content": "more"}]}, ResponsesRequest
    )
    assert [m.role for m in input_messages(again)] == ["user"]


class TagTokenizer:
    """A vocabulary where each think tag is one special token (as in Qwen3's and DeepSeek-R1's)."""

    def encode(self, text):
        return {"<think>": [7], "</think>": [8]}.get(text, [100, 101])

    def decode(self, ids):
        return ""  # special tokens: skipped


@pytest.mark.parametrize("parser", ["qwen3", "deepseek_r1"])
def test_structured_output_from_a_thinking_model_applies_after_its_think_section(parser):
    """Under ``--reasoning-parser`` with one-token tags, a JSON constraint applies to the answer
    after the think section (the scheduler's controller starts the grammar there), so the output
    is split into reasoning and content as an unconstrained one is; ``enable_thinking: false``
    keeps the grammar from the first token, as does a vocabulary whose tags are several tokens."""
    from types import SimpleNamespace

    from trillium.server.routes import Routes

    def routes(tokenizer):
        client = SimpleNamespace(reasoning_parser=parser, tokenizer=tokenizer)
        return Routes(client, None, None, None)

    sampling = SamplingParams(structured=StructuredOutputs(json={"type": "object"}))
    think = routes(TagTokenizer())._think_first(sampling, None).structured_after_think
    assert think == ThinkSection(open_id=7, close_id=8, opened=parser == "deepseek_r1")
    parsing = routes(TagTokenizer()).output_parsing(
        None, msgspec.structs.replace(sampling, structured_after_think=think)
    )
    assert parsing.reasoning.starts_inside == (parser == "deepseek_r1") and parsing.end_token_id == 8
    off = routes(TagTokenizer())._think_first(sampling, {"enable_thinking": False})
    assert off.structured_after_think is None
    assert not routes(TagTokenizer()).output_parsing(None, off).reasoning.starts_inside
    several = SimpleNamespace(encode=lambda text: [1, 2, 3], decode=lambda ids: "x")
    assert routes(several)._think_first(sampling, None).structured_after_think is None
