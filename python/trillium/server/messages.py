"""``POST /v1/messages`` (Anthropic's Messages API) and ``POST /v1/messages/count_tokens``.

A request is translated into a chat completion (``anthropic_convert.py``) and served by the chat
route's checks, tokenizing, tool calling and engine submission (``Routes.prepare_chat``,
``Routes.start``), as the Responses API is; ``anthropic_builder.py`` turns the output into
content blocks and Anthropic's stream events. Keys come from ``x-api-key`` or ``Authorization:
Bearer`` (server/auth.py) with the tenants, quotas and ledger of every route; errors are in
Anthropic's shape (``anthropic_errors.py``). ``anthropic-version`` and ``anthropic-beta`` are
accepted and not needed: one version of the API is served. Under ``--reasoning-parser`` a
thinking model's reasoning comes back in ``thinking`` blocks (``thinking_delta`` events).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response

from trillium.engine_client import EngineOverloaded, StreamOutput
from trillium.server.accounting import RequestAccount
from trillium.server.anthropic_builder import MessageBuilder, sse
from trillium.server.anthropic_convert import anthropic_params, chat_request, served_model
from trillium.server.anthropic_errors import anthropic_error
from trillium.server.anthropic_shapes import CountTokensRequest, MessagesRequest
from trillium.server.disconnect import unless_disconnected
from trillium.server.errors import APIError, overloaded
from trillium.server.openai_shapes import ChoiceFanout
from trillium.server.routes import Routes, json_response, named_errors, raise_on_failure
from trillium.server.schema import decode_body


class MessagesRoutes:
    def __init__(self, routes: Routes) -> None:
        self.routes = routes

    async def create(self, request: Request) -> Response:
        accounting = self.routes.accounting
        with accounting.admit(request, chat=True, endpoint="messages") as account, named_errors(account.request_id):
            body = decode_body(await request.body(), MessagesRequest)
            return await unless_disconnected(request, account, functools.partial(self._create, body, account))

    async def _create(self, body: MessagesRequest, account: RequestAccount) -> Response:
        served_model(body.model, self.routes.client.model_name)
        chat, origins = chat_request(body)
        with anthropic_params(origins):
            prompt_ids, sampling, calling = await self.routes.prepare_chat(chat, account)
        fanout = await self.routes.start(chat, [prompt_ids], sampling, account)
        parsing = self.routes.output_parsing(calling, sampling)
        builder = MessageBuilder(account.request_id, body.model, parsing, warm_up=body.max_tokens == 0)
        if body.stream:
            return account.streaming_response(
                self._events(fanout, builder, account),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        try:
            while (item := await fanout.next()) is not None:
                _, out = item
                raise_on_failure(out)
                builder.feed(out, fanout.streams[0].stop_string)
        except EngineOverloaded as exc:
            raise overloaded(str(exc)) from None
        finally:
            fanout.abort()
        usage = builder.counted(fanout.usage())
        await account.finish_committed(usage)  # in the ledger before the body goes out
        return json_response(builder.message(usage))

    async def _events(
        self, fanout: ChoiceFanout, builder: MessageBuilder, account: RequestAccount
    ) -> AsyncIterator[bytes]:
        """The SSE events of a streamed message. ``message_start`` waits for the first output, so
        that its usage says what the prefix cache served. No awaits in ``finally`` (see
        routes._sse_body); the record is committed before the final events."""
        started = False
        try:
            while True:
                try:
                    item = await fanout.next()
                except EngineOverloaded as exc:
                    yield sse(anthropic_error(overloaded(str(exc))))
                    return
                if item is None:
                    break
                _, out = item
                failure = _failure(out, account.request_id)
                if failure is not None:
                    yield sse(anthropic_error(failure))
                    return
                if not started:
                    started = True
                    usage = builder.counted(fanout.usage())
                    yield sse({"type": "message_start", "message": builder.message(usage, started=True)})
                for event in builder.feed(out, fanout.streams[0].stop_string):
                    yield sse(event)
            usage = builder.counted(fanout.usage())
            await account.finish_committed(usage)
            if not started:  # every request ends with an output; a stream stays well-formed all the same
                yield sse({"type": "message_start", "message": builder.message(usage, started=True)})
            yield sse(builder.message_delta(usage))
            yield sse({"type": "message_stop"})
        finally:
            fanout.abort()

    async def count_tokens(self, request: Request) -> Response:
        """The prompt tokens a ``/v1/messages`` request with these messages, system prompt and tools
        would run, through the chat template; ``{"input_tokens": N}``. Not a generation: checked for
        a key, not metered."""
        self.routes.accounting.auth.tenant(request)
        body = decode_body(await request.body(), CountTokensRequest)
        served_model(body.model, self.routes.client.model_name)
        chat, origins = chat_request(body)
        with anthropic_params(origins):
            prompt_ids = await self.routes.render_prompt(chat)
        return json_response({"input_tokens": len(prompt_ids)})


def _failure(out: StreamOutput, request_id: str) -> APIError | None:
    """The error of an output that failed or was aborted (None for one that did not), as a whole
    response would raise it (``raise_on_failure``, ``named_errors``)."""
    try:
        raise_on_failure(out)
    except APIError as exc:
        if exc.status >= 500 and request_id not in exc.message:
            exc.message = f"{exc.message} (request id {request_id})"
        return exc
    return None
