"""One chat request's tool calling: its conversation for the template, its grammar, its parsers.

The model's format comes from its chat template (``tools/formats.py``); this binds it to a
request (tools, ``tool_choice``, ``parallel_tool_calls``) and to the served tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trillium.protocol import StructuredOutputs
from trillium.tools import (
    ContentDelta,
    FunctionTool,
    ToolCallParser,
    ToolChoice,
    ToolFormat,
    make_parser,
    prepare_conversation,
    tool_format,
    tool_grammar,
)

if TYPE_CHECKING:
    from trillium.server.reasoning import ReasoningFormat
    from trillium.tokenizer import Tokenizer


@dataclass(frozen=True)
class ToolCalling:
    tools: list[FunctionTool]
    choice: ToolChoice
    parallel: bool
    fmt: ToolFormat
    special_tags: bool  # the call delimiters are special tokens: keep special tokens in the text
    reasoning: ReasoningFormat | None = None  # the model thinks first (--reasoning-parser): let it

    @staticmethod
    def model_format(tokenizer: Tokenizer) -> tuple[ToolFormat, bool]:
        """(the model's call format, whether its delimiters are special tokens): a fact of the
        served model, read once (``Routes`` keeps it), not per request."""
        fmt = tool_format(tokenizer.chat_template)
        special = fmt.name == "hermes" and len(tokenizer.encode("<tool_call>", add_special_tokens=False)) == 1
        return fmt, special

    @property
    def active(self) -> bool:
        """Whether the model is offered calls (and its output is parsed for them)."""
        return self.choice.mode != "none" and bool(self.tools)

    def conversation(self, messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        """(messages, ``tools`` for the template or None). With ``tool_choice: none`` the tools
        stay out of the prompt; earlier calls and results are rendered either way."""
        out, extra = prepare_conversation(messages, self.tools if self.active else [], self.fmt)
        return out, extra.get("tools")

    @property
    def lets_reasoning_first(self) -> bool:
        """The call grammar lets the model reason before its calls: ``auto`` lets any text come
        first; ``required`` and a named function let a think section in (``tools/grammar.py``)
        when the model thinks and writes Hermes calls."""
        return self.choice.mode == "auto" or (self.reasoning is not None and self.fmt.name == "hermes")

    def constraint(self) -> StructuredOutputs | None:
        grammar = tool_grammar(
            self.tools,
            self.choice,
            self.parallel,
            self.fmt,
            special_tags=self.special_tags,
            reasoning=self.reasoning,
        )
        return StructuredOutputs(grammar=grammar) if grammar is not None else None

    def new_parser(self) -> ToolCallParser:
        return make_parser(self.fmt, frozenset(t.name for t in self.tools))

    def split(self, text: str, *, cut: bool = False) -> tuple[str, list[dict[str, Any]]]:
        """A whole choice's text -> (content, OpenAI ``tool_calls``): the streaming parser, fed once.
        ``cut``: the output was cut short (``max_tokens``): a call it was writing is dropped."""
        parser = self.new_parser()
        events = parser.feed(text) + parser.finish(cut=cut)
        content = "".join(e.text for e in events if isinstance(e, ContentDelta))
        return content, [call.openai() for call in parser.calls]
