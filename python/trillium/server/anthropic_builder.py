"""One Messages response: its content blocks, built from its stream outputs, and the Anthropic
stream events that build them on the client.

A block's life in the stream::

    content_block_start {index, content_block: {type: text, text: ""}}
    content_block_delta {index, delta: {type: text_delta, text}}              (text, repeated)
    content_block_delta {index, delta: {type: input_json_delta, partial_json}} (tool_use)
    content_block_delta {index, delta: {type: thinking_delta, thinking}}      (thinking, repeated)
    content_block_stop  {index}

The output is split as on every chat API (``choice_split.py``): reasoning (under
``--reasoning-parser``) becomes ``thinking`` blocks, the answer ``text`` blocks, each tool call a
``tool_use`` block (whole: the parser reports a call once its arguments are complete).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec

from trillium.engine_client import StreamOutput
from trillium.protocol import FinishReason
from trillium.server.choice_split import ChoiceSplitter, OutputParsing, Piece, ReasoningDelta
from trillium.server.openai_shapes import JSONObject
from trillium.tools import ContentDelta, ToolCallReady

_encoder = msgspec.json.Encoder()


class MessageBuilder:
    """The blocks of one response, in order; each method returns the stream events it adds (a
    response sent whole ignores them). ``model`` is the name the request gave; ``warm_up``: the
    request only fills the prefix cache (``max_tokens: 0``), and the token the engine made for it
    is dropped."""

    def __init__(self, message_id: str, model: str, parsing: OutputParsing | None, warm_up: bool = False) -> None:
        self.message_id = message_id
        self.model = model
        self.warm_up = warm_up
        self.splitter: ChoiceSplitter | None = parsing.new_splitter() if parsing is not None else None
        self.blocks: list[JSONObject] = []
        self._open: JSONObject | None = None  # the block whose deltas are still coming
        self.finish_reason: FinishReason | None = None
        self.stop_sequence: str | None = None

    def feed(self, out: StreamOutput, stop_sequence: str | None = None) -> list[JSONObject]:
        """The events of one output; ``stop_sequence``, on the last, is the stop string that ended it."""
        if self.warm_up:
            ended = out.finish_reason is not None
            out = dataclasses.replace(out, text="", token_ids=[], finish_reason=FinishReason.LENGTH if ended else None)
        if self.splitter is None:
            pieces: list[Piece] = [ContentDelta(out.text)] if out.text else []
        else:
            pieces = self.splitter.feed(out.text, out.token_ids, out.finish_reason)
        events: list[JSONObject] = []
        for piece in pieces:
            if isinstance(piece, ContentDelta):
                events += self.text(piece.text)
            elif isinstance(piece, ReasoningDelta):
                events += self.thinking(piece.text)
            else:
                events += self.tool_use(piece)
        if out.finish_reason is not None:
            self.finish_reason = out.finish_reason
            self.stop_sequence = stop_sequence
            events += self._close()
        return events

    def text(self, text: str) -> list[JSONObject]:
        if not text:
            return []
        events = self._open_block("text", {"text": ""})
        block = self.blocks[-1]
        block["text"] += text
        return [*events, self._delta({"type": "text_delta", "text": text})]

    def thinking(self, text: str) -> list[JSONObject]:
        """Reasoning text (the reasoning parser's share of the output), in a ``thinking`` block. Its
        ``signature`` stays empty: nothing here signs reasoning, and a client hands it back as is."""
        if not text:
            return []
        events = self._open_block("thinking", {"thinking": "", "signature": ""})
        self.blocks[-1]["thinking"] += text
        return [*events, self._delta({"type": "thinking_delta", "thinking": text})]

    def tool_use(self, ready: ToolCallReady) -> list[JSONObject]:
        call = ready.call
        events = self._close()
        block: JSONObject = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
        events += self._start(block)
        block["input"] = msgspec.json.decode(call.arguments)  # the grammar wrote an object
        events += [self._delta({"type": "input_json_delta", "partial_json": call.arguments}), *self._close()]
        return events

    def _open_block(self, kind: str, fields: JSONObject) -> list[JSONObject]:
        """The events that make a block of ``kind`` the open one (none if it is already)."""
        if self._open is not None and self._open["type"] == kind:
            return []
        return [*self._close(), *self._start({"type": kind, **fields})]

    def _start(self, block: JSONObject) -> list[JSONObject]:
        self.blocks.append(block)
        self._open = block
        return [{"type": "content_block_start", "index": len(self.blocks) - 1, "content_block": _copy(block)}]

    def _delta(self, delta: JSONObject) -> JSONObject:
        return {"type": "content_block_delta", "index": len(self.blocks) - 1, "delta": delta}

    def _close(self) -> list[JSONObject]:
        if self._open is None:
            return []
        self._open = None
        return [{"type": "content_block_stop", "index": len(self.blocks) - 1}]

    def counted(self, usage: JSONObject) -> JSONObject:
        """The chat usage this response reports (and the ledger records): a warm-up's has no output."""
        if not self.warm_up:
            return usage
        return {**usage, "completion_tokens": 0, "total_tokens": usage["prompt_tokens"]}

    @property
    def stop_reason(self) -> str | None:
        """Anthropic's name for why generation ended (None while it goes on)."""
        reason = self.finish_reason
        if reason is None:
            return None
        if reason == FinishReason.LENGTH:
            return "max_tokens"
        if self.splitter is not None and self.splitter.calls:
            return "tool_use"
        return "stop_sequence" if self.stop_sequence is not None else "end_turn"

    def message(self, usage: JSONObject, *, started: bool = False) -> JSONObject:
        """The message: whole, or (``started``) as ``message_start`` carries it, without content."""
        return {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "content": [] if started else [_copy(b) for b in self.blocks],
            "model": self.model,
            "stop_reason": None if started else self.stop_reason,
            "stop_sequence": None if started else self.stop_sequence,
            "usage": self._usage(usage),
        }

    def message_delta(self, usage: JSONObject) -> JSONObject:
        """The stream's last event but ``message_stop``: why it ended and the final usage."""
        return {
            "type": "message_delta",
            "delta": {"stop_reason": self.stop_reason, "stop_sequence": self.stop_sequence},
            "usage": self._usage(usage),
        }

    def _usage(self, usage: JSONObject) -> JSONObject:
        """Anthropic's usage, with the tokens spent thinking when a reasoning parser reads the output."""
        out = anthropic_usage(usage)
        if self.splitter is not None and self.splitter.splits_reasoning:
            out["output_tokens_details"] = {"thinking_tokens": self.splitter.num_reasoning_tokens}
        return out


def anthropic_usage(usage: JSONObject) -> JSONObject:
    """The chat usage as Anthropic counts it: the prompt's cached tokens apart from the rest."""
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    return {
        "input_tokens": usage["prompt_tokens"] - cached,
        "output_tokens": usage["completion_tokens"],
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }


def sse(event: JSONObject) -> bytes:
    """One event, named by its ``type``, as Anthropic frames them."""
    name: str = event["type"]
    return b"event: " + name.encode() + b"\ndata: " + _encoder.encode(event) + b"\n\n"


def _copy(block: JSONObject) -> Any:
    """A snapshot of a block as it is now (an event must not change when the block does later)."""
    return msgspec.json.decode(_encoder.encode(block))
