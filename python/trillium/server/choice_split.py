"""One choice's text split into reasoning, content and tool calls, as it is generated.

Every route that answers a chat (chat completions streamed and whole, Responses, Messages) reads
a choice's outputs through one :class:`ChoiceSplitter`, so the same text splits the same way on
every API::

    delta text ──▶ ReasoningParser ──reasoning──▶ ReasoningDelta
                   (server/reasoning.py) └─content─▶ ToolCallParser ──▶ ContentDelta | ToolCallReady
                                                     (trillium.tools)

Reasoning comes out first (a thinking model reasons, then answers); only the answer is searched
for tool calls. Neither parser ever lets markup through: no ``<think>`` tags in the reasoning or
content, no call markup in content, even when ``max_tokens`` cuts the output inside either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from trillium.protocol import FinishReason
from trillium.server.reasoning import ReasoningFormat, ReasoningParser
from trillium.tools import ContentDelta, ToolCall, ToolCallParser, ToolCallReady

if TYPE_CHECKING:
    from trillium.server.tool_calls import ToolCalling


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


Piece = ReasoningDelta | ContentDelta | ToolCallReady


@dataclass(frozen=True)
class OutputParsing:
    """How one request's outputs are split: its reasoning format (None: no reasoning split) and
    its tool calling (None: no calls). ``end_token_id``: the token that spells the format's
    closing tag, when the vocabulary has one (``ReasoningParser``'s token count)."""

    reasoning: ReasoningFormat | None = None
    tools: ToolCalling | None = None
    end_token_id: int | None = None

    def new_splitter(self) -> ChoiceSplitter:
        """A fresh splitter for one choice."""
        reasoning = ReasoningParser(self.reasoning, self.end_token_id) if self.reasoning is not None else None
        return ChoiceSplitter(reasoning, self.tools.new_parser() if self.tools is not None else None)


class ChoiceSplitter:
    """Splits one choice's outputs; keeps what it split so far (``reasoning``, ``content``,
    ``calls``) for a response sent whole. Not thread-safe."""

    def __init__(self, reasoning: ReasoningParser | None, tools: ToolCallParser | None) -> None:
        self._reasoning = reasoning
        self._tools = tools
        self._reasoning_parts: list[str] = []
        self._content_parts: list[str] = []

    def feed(
        self, text: str, token_ids: list[int] | tuple[int, ...] = (), finish_reason: FinishReason | None = None
    ) -> list[Piece]:
        """The pieces of one output (``text``, generated as ``token_ids``), in order; with its
        ``finish_reason`` (the choice's last output) everything held back comes out too, and a
        tool call cut short by ``LENGTH`` is dropped."""
        reasoning, content = self._reasoning.feed(text, token_ids) if self._reasoning is not None else ("", text)
        if finish_reason is not None and self._reasoning is not None:
            more_reasoning, more_content = self._reasoning.finish()
            reasoning, content = reasoning + more_reasoning, content + more_content
        pieces: list[Piece] = [ReasoningDelta(reasoning)] if reasoning else []
        if self._tools is None:
            pieces += [ContentDelta(content)] if content else []
        else:
            pieces += self._tools.feed(content) if content else []
            if finish_reason is not None:
                pieces += self._tools.finish(cut=finish_reason == FinishReason.LENGTH)
        for piece in pieces:
            if isinstance(piece, ReasoningDelta):
                self._reasoning_parts.append(piece.text)
            elif isinstance(piece, ContentDelta):
                self._content_parts.append(piece.text)
        return pieces

    @property
    def splits_reasoning(self) -> bool:
        """A reasoning parser reads this choice (its responses report reasoning, even none)."""
        return self._reasoning is not None

    @property
    def reasoning(self) -> str:
        return "".join(self._reasoning_parts)

    @property
    def content(self) -> str:
        return "".join(self._content_parts)

    @property
    def calls(self) -> list[ToolCall]:
        return self._tools.calls if self._tools is not None else []

    @property
    def num_reasoning_tokens(self) -> int:
        return self._reasoning.num_reasoning_tokens if self._reasoning is not None else 0
