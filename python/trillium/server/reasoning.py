"""Reasoning output: a thinking model's text split into its reasoning and its answer, as it streams.

``trillium serve --reasoning-parser NAME`` (vLLM's flag) names the model's format. Both formats
here wrap the reasoning in ``<think>`` ... ``</think>``:

- ``qwen3``: the reasoning is there only if the output *starts* with ``<think>`` (leading
  whitespace aside); an output without it is all content (``enable_thinking: false`` renders an
  empty, closed think section into the prompt, and the model answers directly).
- ``deepseek_r1``: the chat template opens ``<think>`` in the prompt, so the output starts inside
  the reasoning, with or without an opening tag of its own; everything up to ``</think>`` is
  reasoning.

Once open, the reasoning runs to ``</think>``; an output cut (``max_tokens``) before it is all
reasoning, its content empty. Text after ``</think>`` is content even if it holds another
``<think>``. Whitespace around the reasoning and before the content is dropped (Qwen3's template
strips it too when it renders the turn again). Text that may be the start of a tag is held back
until it is known, like a stop string.

Counting (``num_reasoning_tokens``, OpenAI's ``completion_tokens_details.reasoning_tokens``): the
output's tokens up to the one that ends the reasoning. When ``</think>`` is one token of the
vocabulary (Qwen3, DeepSeek-R1's distills) its id finds that token exactly; otherwise the end is
the last token of the delta whose text closed the reasoning (exact when deltas carry one token).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from trillium.config import REASONING_PARSERS

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class ReasoningFormat:
    """How one model family marks its reasoning (see the module docstring)."""

    name: str
    open_tag: str = THINK_OPEN
    close_tag: str = THINK_CLOSE
    starts_inside: bool = False  # the prompt opened the reasoning: output without an opener is reasoning


FORMATS: dict[str, ReasoningFormat] = {
    "qwen3": ReasoningFormat("qwen3"),
    "deepseek_r1": ReasoningFormat("deepseek_r1", starts_inside=True),
}
assert set(FORMATS) == set(REASONING_PARSERS), "config.REASONING_PARSERS names the formats defined here"


def reasoning_format(name: str) -> ReasoningFormat:
    """The format named ``name``; ValueError listing the known names otherwise."""
    fmt = FORMATS.get(name)
    if fmt is None:
        raise ValueError(f"unknown reasoning parser {name!r} (known: {', '.join(sorted(FORMATS))})")
    return fmt


class _State(enum.Enum):
    START = "start"  # nothing but whitespace (or part of an opener) seen yet
    REASONING = "reasoning"  # inside the reasoning: text goes to reasoning until the closing tag
    CONTENT = "content"  # after the reasoning (or without one): text goes to content


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that is a proper beginning of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ReasoningParser:
    """Splits one choice's text into (reasoning, content), delta by delta. Not thread-safe.

    Contract: the reasoning pieces that :meth:`feed` and :meth:`finish` return, joined, are the
    text between the tags, stripped of surrounding whitespace; the content pieces, joined, are the
    text after the closing tag without its leading whitespace (or the whole text, as it was, when
    the output has no reasoning). Neither ever holds a tag. ``end_token_id``: the id of the one
    token that spells the closing tag, when the vocabulary has one (for the token count)."""

    def __init__(self, fmt: ReasoningFormat, end_token_id: int | None = None) -> None:
        self.fmt = fmt
        self._end_token_id = end_token_id
        self._state = _State.START
        self._buf = ""  # text held back: whitespace, or what may begin a tag
        self._reasoning_started = False  # some reasoning text was returned (leading whitespace is dropped)
        self._content_started = False
        self.had_reasoning = False  # the output opened a reasoning section (or starts inside one)
        self._num_tokens = 0
        self._end_by_id: int | None = None  # tokens up to and including the closing-tag token
        self._end_by_text: int | None = None  # tokens up to the end of the delta that closed it

    @property
    def in_reasoning(self) -> bool:
        """The text so far ends inside the reasoning (or may still open one)."""
        return self._state != _State.CONTENT

    @property
    def num_reasoning_tokens(self) -> int:
        """Output tokens spent on reasoning so far (see the module docstring)."""
        if not self.had_reasoning:
            return 0
        if self._state != _State.CONTENT:
            return self._num_tokens
        if self._end_by_id is not None:
            return self._end_by_id
        assert self._end_by_text is not None  # set when the reasoning closed
        return self._end_by_text

    def feed(self, text: str, token_ids: list[int] | tuple[int, ...] = ()) -> tuple[str, str]:
        """(reasoning, content) that ``text`` -- the next delta, generated as ``token_ids`` --
        releases; either may be ""."""
        if self._end_by_id is None and self._end_token_id is not None and self._end_token_id in token_ids:
            self._end_by_id = self._num_tokens + list(token_ids).index(self._end_token_id) + 1
        self._num_tokens += len(token_ids)
        was_open = self._state != _State.CONTENT
        reasoning, content = self._split(self._buf + text)
        if was_open and self._state == _State.CONTENT and self.had_reasoning:
            self._end_by_text = self._num_tokens
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        """(reasoning, content) still held back, at the end of the output. A tag cut short counts
        as text of the section it is in; trailing whitespace of the reasoning is dropped."""
        rest, self._buf = self._buf, ""
        if self._state == _State.START:  # only whitespace, or an opener cut short
            if not self.fmt.starts_inside:
                self._state = _State.CONTENT
                return "", self._content(rest)
            if not rest.strip():
                return "", ""
            self._enter_reasoning()
            rest = rest.lstrip()
        if self._state == _State.REASONING:
            return self._reasoning(rest.rstrip()), ""
        return "", self._content(rest)

    # ---- internals ---------------------------------------------------------------------------

    def _split(self, buf: str) -> tuple[str, str]:
        reasoning, content = "", ""
        if self._state == _State.START:
            head = buf.lstrip()
            if not head or (self.fmt.open_tag.startswith(head) and head != self.fmt.open_tag):
                self._buf = buf  # whitespace, or part of an opener: wait
                return "", ""
            if head.startswith(self.fmt.open_tag):
                self._enter_reasoning()
                buf = head[len(self.fmt.open_tag) :]
            elif self.fmt.starts_inside:
                self._enter_reasoning()
                buf = head
            else:
                self._state = _State.CONTENT  # no reasoning: the text, leading whitespace and all, is content
        if self._state == _State.REASONING:
            if not self._reasoning_started:
                buf = buf.lstrip()
            end = buf.find(self.fmt.close_tag)
            if end < 0:
                # Hold back what may begin the closing tag, and the whitespace before it.
                keep = _partial_suffix(buf, self.fmt.close_tag)
                cut = len(buf[: len(buf) - keep].rstrip())
                self._buf = buf[cut:]
                return self._reasoning(buf[:cut]), ""
            reasoning = self._reasoning(buf[:end].rstrip())
            self._state = _State.CONTENT
            buf = buf[end + len(self.fmt.close_tag) :]
        self._buf = ""
        if not self._content_started and self.had_reasoning:
            buf = buf.lstrip()  # the answer starts after the whitespace that follows the reasoning
        content = self._content(buf)
        return reasoning, content

    def _enter_reasoning(self) -> None:
        self._state = _State.REASONING
        self.had_reasoning = True

    def _reasoning(self, text: str) -> str:
        self._reasoning_started = self._reasoning_started or bool(text)
        return text

    def _content(self, text: str) -> str:
        self._content_started = self._content_started or bool(text)
        return text
