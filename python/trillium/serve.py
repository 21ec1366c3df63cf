"""``trillium serve``: the engine's actors plus the HTTP frontend under one supervisor."""

from __future__ import annotations

import logging

import trio

from trillium.config import EngineConfig
from trillium.engine_client import Engine
from trillium.runtime import Supervisor
from trillium.server.actor import FrontendActor

log = logging.getLogger("trillium")


async def serve_engine(engine: Engine, *, host: str, port: int, handle_signals: bool = True,
                       task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve until SIGINT/SIGTERM (or cancellation); reports the bound URLs once listening."""
    draining = trio.Event()
    frontend = FrontendActor(engine.client, draining, host=host, port=port)
    supervisor = Supervisor([*engine.actors(), frontend], draining=draining)
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: supervisor.run(handle_signals=handle_signals, task_status=task_status))
        task_status.started(frontend.bound_urls)


def run_server(config: EngineConfig, *, host: str, port: int) -> int:
    engine = Engine(config)
    try:
        trio.run(lambda: serve_engine(engine, host=host, port=port))
    except KeyboardInterrupt:
        log.info("interrupted")
    log.info("stopped")
    return 0
