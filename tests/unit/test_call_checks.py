"""Value checks inside tool calls (``structured/call_checks.py``): a tool's parameters schema may
use keywords no grammar expresses; the calls in an output are found and checked as they are
generated, with offsets of the whole output, whatever the token boundaries."""

from __future__ import annotations

import json

import pytest

from trillium.structured.call_checks import CallsChecker, prepare_call_grammar
from trillium.tools.formats import FALLBACK, ToolFormat
from trillium.tools.grammar import tool_grammar
from trillium.tools.spec import FunctionTool, ToolChoice

TAGS = FunctionTool(
    "tag",
    parameters={
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
            "label": {"type": "string", "not": {"pattern": "^x"}},
        },
        "required": ["tags"],
    },
)
PLAIN = FunctionTool("plain", parameters={"type": "object", "properties": {"n": {"type": "integer"}}})
LLAMA3 = ToolFormat("llama3_json", native=True)


def checker(fmt: ToolFormat, choice: str = "auto") -> CallsChecker:
    grammar = tool_grammar([PLAIN, TAGS], ToolChoice(choice), True, fmt)
    assert grammar is not None
    relaxed, checks = prepare_call_grammar(grammar)
    assert checks is not None and set(checks.nodes) == {"tag"}  # only the tool that needs checks
    assert "uniqueItems" not in relaxed and '"not"' not in relaxed  # the grammar gets the relaxed schema
    return checks.new_checker()


def call(name: str, args: dict, key: str = "arguments") -> str:
    return json.dumps({"name": name, key: args}, separators=(",", ":"))


def hermes(*calls: str, text: str = "") -> str:
    return text + "\n".join(f"<tool_call>\n{c}\n</tool_call>" for c in calls)


def feed(c: CallsChecker, text: str, step: int):
    data = text.encode()
    for i in range(0, len(data), step):
        failure = c.feed(data[i : i + step])
        if failure is not None:
            return failure
    return c.finish()


@pytest.mark.parametrize("step", [1, 3, 7, 1000])
def test_a_duplicate_item_in_a_later_call_fails_at_the_item(step):
    text = hermes(
        call("plain", {"n": 1}),
        call("tag", {"tags": ["a", "b"], "label": "ok"}),
        call("tag", {"tags": ["a", "b", "a"]}),
        text='Sure {"name":"tag"} <tool_call> not a call. ',
    )
    failure = feed(checker(FALLBACK), text, step)
    assert failure is not None and "unique" in failure.message
    assert text.encode()[failure.value_start :].startswith(b'"a"]}}')  # the third item


@pytest.mark.parametrize("step", [1, 5, 1000])
def test_valid_calls_pass_and_each_call_is_checked_with_its_own_tool(step):
    # "plain" has no checks: its duplicate-looking values are nobody's business
    text = hermes(call("plain", {"n": 1}), call("tag", {"tags": ["x", "y"], "label": "fine"}))
    assert feed(checker(FALLBACK, "required"), text, step) is None
    bad = hermes(call("tag", {"tags": ["x"], "label": "xylophone"}))
    failure = feed(checker(FALLBACK, "required"), bad, step)
    assert failure is not None and bad.encode()[failure.value_start :].startswith(b'"xylophone"')


@pytest.mark.parametrize("step", [1, 4, 1000])
def test_llama3_json_calls_are_found_at_the_start_and_after_each_separator(step):
    first = call("plain", {"n": 2}, "parameters")
    text = first + ";" + call("tag", {"tags": ["q", "q"]}, "parameters")
    failure = feed(checker(LLAMA3), text, step)
    assert failure is not None and failure.value_start == len(first) + 1 + len(
        '{"name":"tag","parameters":{"tags":["q",'
    )
    # text (auto mode) is never parsed as calls, nor is text that starts with a space (the
    # grammar writes calls with none; the parser reads that as content)
    assert feed(checker(LLAMA3), 'I would call {"name":"tag","parameters":{"tags":["q","q"]}}', step) is None
    assert feed(checker(LLAMA3), ' {"name":"tag","parameters":{"tags":["q","q"]}}', step) is None


def test_held_back_from_an_open_item_and_copies_are_independent():
    c = checker(FALLBACK)
    prefix = 'Ok.<tool_call>\n{"name":"tag","arguments":{"tags":["a",'
    assert c.feed(prefix.encode()) is None
    assert c.hold_from is None  # no item open: what came so far is final
    assert c.feed(b'"') is None
    assert c.hold_from == len(prefix)  # an open item may still be taken back: held from its start
    other = c.copy()
    assert c.feed(b'a"') is not None
    assert other.feed(b'b"]}}\n</tool_call>') is None  # the copy did not see the duplicate
    assert other.hold_from is None  # the call is complete: nothing can be taken back
    c.reset()
    assert (
        c.num_bytes == 0
        and c.feed(prefix.encode()) is None
        and [start for start, _ in c.open_values]
        == [
            len("Ok.<tool_call>\n"),
            len('Ok.<tool_call>\n{"name":"tag","arguments":'),
            len('Ok.<tool_call>\n{"name":"tag","arguments":{"tags":'),
        ]
    )


def test_other_grammars_are_left_alone():
    grammar = 'start: "a" fn\nfn: %json {"type":"array","uniqueItems":true}'
    assert prepare_call_grammar(grammar) == (grammar, None)


def test_an_unsatisfiable_tool_schema_names_the_tool():
    broken = FunctionTool(
        "broken",
        parameters={
            "type": "object",
            "properties": {"n": {"type": "integer", "minimum": 5, "maximum": 1}},
            "required": ["n"],
        },
    )
    grammar = tool_grammar([broken], ToolChoice("required"), False, FALLBACK)
    assert grammar is not None
    with pytest.raises(ValueError, match="tool 'broken'"):
        prepare_call_grammar(grammar)


def test_a_header_on_a_grammar_that_is_no_tool_grammar_is_a_clear_error():
    grammar = '// trillium tool calls: hermes\nstart: fn\nfn_0: %json {"type":"object"}'
    with pytest.raises(ValueError, match="fn_0 is not a tool call's schema"):
        prepare_call_grammar(grammar)
