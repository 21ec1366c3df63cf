"""FrontendActor: serves the starlette app with hypercorn's Trio worker.

On shutdown (``draining`` set by the supervisor) hypercorn stops accepting connections and
lets in-flight streams finish within ``graceful_timeout``; then ``run`` returns. The frontend is
never restarted: if the HTTP server itself fails, the process exits non-zero. With ``tls`` it
serves HTTPS only (server/tls.py).
"""

from __future__ import annotations

import functools
import logging

import trio
from hypercorn.trio import serve

from trillium.engine_client import EngineClient
from trillium.runtime import NEVER_RESTART, Actor, Health, Snapshot
from trillium.server.accounting import Accounting
from trillium.server.app import build_app
from trillium.server.limits import InputLimits
from trillium.server.reload import ConfigReloader
from trillium.server.tls import HypercornConfig, ServerTLS

log = logging.getLogger("trillium.server")


class FrontendActor(Actor):
    name = "frontend"
    restart_policy = NEVER_RESTART
    finishes_on_drain = True

    def __init__(
        self,
        client: EngineClient,
        draining: trio.Event,
        *,
        host: str = "127.0.0.1",
        port: int = 8000,
        graceful_timeout: float = 10.0,
        accounting: Accounting | None = None,
        health: Snapshot[Health] | None = None,
        limits: InputLimits | None = None,
        tls: ServerTLS | None = None,
        reloader: ConfigReloader | None = None,
    ) -> None:
        super().__init__()
        self.tls = tls
        self.reloader = reloader
        self.client = client
        self.health = health
        self.limits = limits
        self.accounting = accounting
        self.draining = draining
        self.host = host
        self.port = port
        self.graceful_timeout = graceful_timeout
        self.bound_urls: list[str] = []

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        config = HypercornConfig(self.tls)
        config.bind = [f"{self.host}:{self.port}"]
        config.graceful_timeout = self.graceful_timeout
        config.accesslog = None
        config.errorlog = logging.getLogger("hypercorn.error")
        config.keep_alive_timeout = 75  # long-lived clients (openai's httpx pool) reuse connections
        app = build_app(self.client, self.draining, self.accounting, self.health, self.limits, self.reloader)
        async with trio.open_nursery() as nursery:
            # hypercorn types the ASGI scope and events as TypedDicts, which Starlette's
            # MutableMapping[str, Any] parameters do not accept; Starlette is a valid ASGI app.
            self.bound_urls = await nursery.start(
                functools.partial(serve, app, config, shutdown_trigger=self.draining.wait)  # type: ignore[arg-type]
            )
            log.info("serving %s on %s", self.client.model_name, ", ".join(self.bound_urls))
            task_status.started()
