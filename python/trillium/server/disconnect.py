"""Stop serving a request whose client has gone, while its response is still being made.

A streamed response notices a disconnect when a send fails (starlette listens for it too); a
response sent whole would otherwise generate to the end for nobody, holding its KV blocks (a
client that times out and retries doubles the load each time). :func:`unless_disconnected`
runs the handler's work beside a task that waits for the ASGI ``http.disconnect`` message and
cancels the work when it comes; the cancelled work aborts its requests (``ChoiceFanout.abort``),
which frees their blocks at once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio
from starlette.requests import Request
from starlette.responses import Response

from trillium.server.accounting import WARNING_HEADER, RequestAccount

CLIENT_CLOSED = 499  # nginx's "client closed request": what the access log and usage ledger record


async def unless_disconnected(
    request: Request, account: RequestAccount, work: Callable[[], Awaitable[Response]]
) -> Response:
    """``await work()``, cancelled if the client disconnects first (then a 499 nobody reads).
    Call once the request body has been read: the watcher consumes what ``receive`` brings."""
    result: list[Response] = []
    failure: list[Exception] = []
    disconnected = False
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            nonlocal disconnected
            while (await request.receive())["type"] != "http.disconnect":
                pass
            disconnected = True
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch)
        try:
            result.append(await work())
        except Exception as exc:  # raised again below: outside the nursery, not as an exception group
            failure.append(exc)
        nursery.cancel_scope.cancel()
    if failure:
        raise failure[0]
    if disconnected and account.fanout is not None:
        # Gone just as a streamed response was set up: this watcher took the one disconnect
        # message, so the stream would not see it; its requests end now (the stream then ends).
        account.fanout.abort()
    if result:
        if account.warnings:  # the response is the request's one chance to tell the client
            result[0].headers[WARNING_HEADER] = "; ".join(account.warnings)
        return result[0]
    account.http_status = CLIENT_CLOSED
    return Response(status_code=CLIENT_CLOSED)
