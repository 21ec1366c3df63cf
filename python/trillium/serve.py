"""``trillium serve``: the engine's actors plus the HTTP frontend under one supervisor."""

from __future__ import annotations

import logging

import trio

from trillium.config import EngineConfig
from trillium.launch import Engine
from trillium.metering import AccessConfig, MeteringActor, Metrics, request_log
from trillium.runtime import Supervisor
from trillium.server.accounting import Accounting
from trillium.server.actor import FrontendActor

log = logging.getLogger("trillium")


async def serve_engine(
    engine: Engine,
    *,
    host: str,
    port: int,
    handle_signals: bool = True,
    access: AccessConfig | None = None,
    log_requests: bool = False,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until SIGINT/SIGTERM (or cancellation); reports the bound URLs once listening.

    ``access`` (tenants, keys, limits, ledger path) turns on API keys, quotas and the usage
    ledger; ``log_requests`` prints one JSON line per finished request. Either starts the
    metering actor, which the supervisor stops last so that it writes every record."""
    draining = trio.Event()
    metering = None
    if access is not None or log_requests:
        if log_requests:
            request_log.configure()
        metering = MeteringActor(
            access.ledger_path if access is not None else None, request_log.log_records if log_requests else None
        )
    client = engine.client
    accounting = Accounting(
        client.model_name,
        Metrics(client.model_name, client.stats),
        access,
        metering.sink if metering is not None else None,
    )
    frontend = FrontendActor(client, draining, host=host, port=port, accounting=accounting)
    supervisor = Supervisor(
        [*engine.actors(), frontend], draining=draining, sinks=[metering] if metering is not None else []
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: supervisor.run(handle_signals=handle_signals, task_status=task_status))
        task_status.started(frontend.bound_urls)


def run_server(
    config: EngineConfig, *, host: str, port: int, access: AccessConfig | None = None, log_requests: bool = False
) -> int:
    engine = Engine(config)
    try:
        trio.run(lambda: serve_engine(engine, host=host, port=port, access=access, log_requests=log_requests))
    except KeyboardInterrupt:
        log.info("interrupted")
    log.info("stopped")
    return 0
