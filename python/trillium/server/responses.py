"""``POST /v1/responses`` (OpenAI's Responses API, as vLLM serves it), ``GET`` and ``DELETE
/v1/responses/{response_id}``.

A request is translated into a chat completion (``responses_body.py``) and served by the chat
route's checks, tokenizing, tool calling and engine submission (``Routes.prepare_chat``,
``Routes.start``); this module turns the one choice's output into Responses output items
(a ``reasoning`` item with ``reasoning_text`` under ``--reasoning-parser``, a ``message`` with
``output_text``, ``function_call`` items) and the Responses stream events.
With ``store`` (the default) the conversation is kept for ``previous_response_id`` in a bounded
in-memory store (``response_store.py``).
"""

from __future__ import annotations

import contextlib
import functools
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from trillium.engine_client import EngineOverloaded, StreamOutput
from trillium.protocol import FinishReason, SamplingParams
from trillium.server.accounting import RequestAccount
from trillium.server.choice_split import ChoiceSplitter, OutputParsing, ReasoningDelta
from trillium.server.disconnect import unless_disconnected
from trillium.server.errors import APIError, overloaded
from trillium.server.openai_shapes import ChoiceFanout, JSONObject, error_payload
from trillium.server.response_store import ResponseStore
from trillium.server.responses_body import ResponsesRequest, chat_request, check_supported, input_messages
from trillium.server.routes import Routes, json_response, named_errors, raise_on_failure
from trillium.server.schema import ChatMessage, FunctionCallBody, ToolCallBody, decode_body
from trillium.tools import ContentDelta, ToolCallReady

_encoder = msgspec.json.Encoder()

# Chat field -> Responses field, for the errors the chat checks raise.
_PARAMS = (
    ("max_tokens", "max_output_tokens"),
    ("response_format.json_schema.schema", "text.format.schema"),
    ("response_format", "text.format"),
    ("messages", "input"),
)


class ResponsesRoutes:
    def __init__(self, routes: Routes, store: ResponseStore | None = None) -> None:
        self.routes = routes
        self.store = store or ResponseStore()

    async def create(self, request: Request) -> Response:
        accounting = self.routes.accounting
        with accounting.admit(request, chat=True, endpoint="responses") as account, named_errors(account.request_id):
            body = decode_body(await request.body(), ResponsesRequest)
            return await unless_disconnected(request, account, functools.partial(self._create, body, account))

    async def _create(self, body: ResponsesRequest, account: RequestAccount) -> Response:
        check_supported(body)
        history: list[ChatMessage] = []
        if body.previous_response_id is not None:
            stored = self.store.get(body.previous_response_id, account.tenant)
            if stored is None:
                raise APIError(
                    f"Previous response with id '{body.previous_response_id}' not found (responses are kept "
                    "in this server's memory, a bounded number of them, and only with store=true)",
                    param="previous_response_id",
                    code="previous_response_not_found",
                )
            history = stored.conversation
        conversation = history + input_messages(body)
        chat = chat_request(body, history)
        with _responses_params():
            prompt_ids, sampling, calling = await self.routes.prepare_chat(chat, account)
        fanout = await self.routes.start(chat, [prompt_ids], sampling, account)
        parsing = self.routes.output_parsing(calling, sampling)
        builder = ResponseBuilder(account.request_id, self.routes.client.model_name, body, sampling, parsing)

        def keep(response: JSONObject) -> None:
            if body.store:
                self.store.put(builder.response_id, account.tenant, conversation + builder.messages(), response)

        if body.stream:
            return account.streaming_response(
                self._events(fanout, builder, account.finish_committed, keep),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        try:
            while (item := await fanout.next()) is not None:
                _, out = item
                raise_on_failure(out)
                builder.feed(out)
        except EngineOverloaded as exc:
            raise overloaded(str(exc)) from None
        finally:
            fanout.abort()
        response = builder.response(fanout.usage())
        keep(response)
        await account.finish_committed()  # in the ledger before the body goes out
        return json_response(response)

    async def _events(
        self, fanout: ChoiceFanout, builder: ResponseBuilder, finish: Callable[[], Awaitable[None]], keep: Any
    ) -> AsyncIterator[bytes]:
        """The SSE events of a streamed response. No awaits in ``finally`` (see routes._sse_body);
        ``finish`` commits the record before the final event."""
        try:
            yield _sse(builder.event("response.created", response=builder.response(None, "in_progress")))
            yield _sse(builder.event("response.in_progress", response=builder.response(None, "in_progress")))
            while True:
                try:
                    item = await fanout.next()
                except EngineOverloaded as exc:
                    yield _sse(builder.event("error", code="server_overloaded", message=str(exc)))
                    return
                if item is None:
                    break
                _, out = item
                if out.finish_reason in (FinishReason.ERROR, FinishReason.ABORT):
                    message = error_payload(out.error or "generation failed", builder.request_id)["error"]["message"]
                    if out.finish_reason == FinishReason.ABORT:
                        message = "request aborted: the server is shutting down"
                    yield _sse(builder.event("error", code="internal_error", message=message))
                    return
                for event in builder.feed(out):
                    yield _sse(event)
            await finish()
            response = builder.response(fanout.usage())
            keep(response)
            yield _sse(builder.event(f"response.{response['status']}", response=response))
        finally:
            fanout.abort()

    async def stored(self, request: Request) -> Response:
        """``GET`` a stored response, or ``DELETE`` it (one route: its ``Allow`` names both)."""
        if request.method == "DELETE":
            return await self.delete(request)
        return await self.retrieve(request)

    async def retrieve(self, request: Request) -> Response:
        tenant = self.routes.accounting.auth.tenant(request)
        response_id = request.path_params["response_id"]
        stored = self.store.get(response_id, tenant)
        if stored is None:
            raise _not_found(response_id)
        return json_response(stored.body)

    async def delete(self, request: Request) -> Response:
        tenant = self.routes.accounting.auth.tenant(request)
        response_id = request.path_params["response_id"]
        if not self.store.delete(response_id, tenant):
            raise _not_found(response_id)
        return json_response({"id": response_id, "object": "response.deleted", "deleted": True})


class ResponseBuilder:
    """One response's output items, built from its choice's stream outputs, and its events."""

    def __init__(
        self,
        request_id: str,
        model: str,
        body: ResponsesRequest,
        sampling: SamplingParams,
        parsing: OutputParsing | None,
    ) -> None:
        self.request_id = request_id
        self.response_id = request_id  # resp_...: the account names it
        self.model = model
        self.body = body
        self.sampling = sampling
        self.splitter: ChoiceSplitter | None = parsing.new_splitter() if parsing is not None else None
        self.created = int(time.time())
        self.items: list[JSONObject] = []
        self._open: JSONObject | None = None  # the message or reasoning item whose text is still coming
        self._sequence = 0
        self.finish_reason: FinishReason | None = None

    def event(self, type_: str, **fields: Any) -> JSONObject:
        event = {"type": type_, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def feed(self, out: StreamOutput) -> list[JSONObject]:
        """The events this output adds (a non-streamed response ignores them)."""
        events: list[JSONObject] = []
        if self.splitter is None:
            parsed: list[ContentDelta | ReasoningDelta | ToolCallReady] = [ContentDelta(out.text)] if out.text else []
        else:
            parsed = self.splitter.feed(out.text, out.token_ids, out.finish_reason)
        for piece in parsed:
            if isinstance(piece, ContentDelta):
                events += self._text(piece.text, "message")
            elif isinstance(piece, ReasoningDelta):
                events += self._text(piece.text, "reasoning")
            else:
                events += self._close_open()
                events += self._call(piece)
        if out.finish_reason is not None:
            self.finish_reason = out.finish_reason
            if not self.items and self._open is None:
                events += self._text("", "message")  # an empty answer is an empty message, as OpenAI gives it
            events += self._close_open()
        return events

    def _text(self, text: str, kind: str) -> list[JSONObject]:
        """Text of the open ``kind`` item (``message`` or ``reasoning``), opened first if another
        (or none) is open."""
        events: list[JSONObject] = []
        item = self._open
        if item is not None and item["type"] != kind:
            events += self._close_open()
            item = None
        if item is None:
            item = self._open = _new_item(kind)
            index = len(self.items)
            self.items.append(item)
            events.append(self.event("response.output_item.added", output_index=index, item=_copy(item)))
            part: JSONObject = {"type": _PARTS[kind][0], "text": ""}
            if kind == "message":
                part["annotations"] = []
            item["content"].append(part)
            events.append(
                self.event(
                    "response.content_part.added", item_id=item["id"], output_index=index, content_index=0, part=part
                )
            )
        if text:
            item["content"][0]["text"] += text
            events.append(
                self.event(
                    f"{_PARTS[kind][1]}.delta",
                    item_id=item["id"],
                    output_index=self.items.index(item),
                    content_index=0,
                    delta=text,
                )
            )
        return events

    def _close_open(self) -> list[JSONObject]:
        item = self._open
        if item is None:
            return []
        self._open = None
        index = self.items.index(item)
        part = item["content"][0]
        item["status"] = "completed"
        ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
        return [
            self.event(f"{_PARTS[item['type']][1]}.done", **ids, text=part["text"]),
            self.event("response.content_part.done", **ids, part=part),
            self.event("response.output_item.done", output_index=index, item=_copy(item)),
        ]

    def _call(self, ready: ToolCallReady) -> list[JSONObject]:
        call = ready.call
        item = {
            "type": "function_call",
            "id": f"fc_{uuid.uuid4().hex}",
            "call_id": call.id,
            "name": call.name,
            "arguments": "",
            "status": "in_progress",
        }
        index = len(self.items)
        self.items.append(item)
        added = self.event("response.output_item.added", output_index=index, item=_copy(item))
        item["arguments"], item["status"] = call.arguments, "completed"
        ids = {"item_id": item["id"], "output_index": index}
        return [
            added,
            self.event("response.function_call_arguments.delta", **ids, delta=call.arguments),
            self.event("response.function_call_arguments.done", **ids, arguments=call.arguments),
            self.event("response.output_item.done", output_index=index, item=_copy(item)),
        ]

    def messages(self) -> list[ChatMessage]:
        """This response's output as chat history, for a continuation."""
        text = "".join(i["content"][0]["text"] for i in self.items if i["type"] == "message")
        calls = [
            ToolCallBody(id=i["call_id"], function=FunctionCallBody(name=i["name"], arguments=i["arguments"]))
            for i in self.items
            if i["type"] == "function_call"
        ]
        return [ChatMessage(role="assistant", content=text or None, tool_calls=calls or None)]

    def response(self, usage: JSONObject | None, status: str | None = None) -> JSONObject:
        """The response object; ``usage`` None while it is in progress."""
        incomplete = self.finish_reason == FinishReason.LENGTH
        if status is None:
            status = "incomplete" if incomplete else "completed"
        body = self.body
        fmt = body.text.format if body.text is not None else None
        choice = body.tool_choice
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete and status == "incomplete" else None,
            "model": self.model,
            "output": [_copy(i) for i in self.items] if usage is not None else [],
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "temperature": self.sampling.temperature,
            "top_p": self.sampling.top_p,
            "tool_choice": msgspec.to_builtins(choice) if choice is not None else ("auto" if body.tools else "none"),
            "tools": msgspec.to_builtins(body.tools or []),
            "parallel_tool_calls": body.parallel_tool_calls,
            "previous_response_id": body.previous_response_id,
            "text": {"format": msgspec.to_builtins(fmt) if fmt is not None else {"type": "text"}},
            "store": body.store,
            "metadata": body.metadata or {},
            "user": body.user,
            "usage": _usage(usage, self.num_reasoning_tokens) if usage is not None else None,
        }

    @property
    def num_reasoning_tokens(self) -> int:
        return self.splitter.num_reasoning_tokens if self.splitter is not None else 0


# An output item kind with text -> (its content part's type, its text events' prefix)
_PARTS = {
    "message": ("output_text", "response.output_text"),
    "reasoning": ("reasoning_text", "response.reasoning_text"),
}


def _new_item(kind: str) -> JSONObject:
    if kind == "reasoning":
        return {
            "type": "reasoning",
            "id": f"rs_{uuid.uuid4().hex}",
            "summary": [],
            "status": "in_progress",
            "content": [],
        }
    return {
        "type": "message",
        "id": f"msg_{uuid.uuid4().hex}",
        "status": "in_progress",
        "role": "assistant",
        "content": [],
    }


def _usage(usage: JSONObject, num_reasoning_tokens: int) -> JSONObject:
    return {
        "input_tokens": usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": usage["prompt_tokens_details"]["cached_tokens"]},
        "output_tokens": usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": num_reasoning_tokens},
        "total_tokens": usage["total_tokens"],
    }


def _copy(item: JSONObject) -> JSONObject:
    """A snapshot of an item as it is now (events must not change when the item does later)."""
    copied: JSONObject = msgspec.json.decode(_encoder.encode(item))
    return copied


def _sse(event: JSONObject) -> bytes:
    name: str = event["type"]
    return b"event: " + name.encode() + b"\ndata: " + _encoder.encode(event) + b"\n\n"


def _not_found(response_id: str) -> APIError:
    return APIError(
        f"No response with id '{response_id}' (responses are kept in this server's memory, a bounded number of them)",
        status=404,
        type="NotFoundError",
        param="response_id",
        code="response_not_found",
    )


@contextlib.contextmanager
def _responses_params() -> Iterator[None]:
    """The chat checks name chat fields; a Responses client should read its own."""
    try:
        yield
    except APIError as exc:
        for chat, responses in _PARAMS:
            if exc.param is not None and exc.param.startswith(chat):
                exc.param = responses + exc.param[len(chat) :]
                if chat == "messages":
                    exc.param = "input"  # the indices count instructions and history too
                break
        raise
