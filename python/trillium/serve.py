"""``trillium serve``: the engine's actors plus the HTTP frontend under one supervisor."""

from __future__ import annotations

import logging

import trio

from trillium.config import EngineConfig
from trillium.launch import Engine
from trillium.metering import AccessConfig, MeteringActor, Metrics, request_log
from trillium.runtime import Health, Snapshot, Supervisor
from trillium.server.accounting import Accounting
from trillium.server.actor import FrontendActor
from trillium.server.limits import InputLimits
from trillium.server.reload import ConfigReloader
from trillium.server.tls import ServerTLS

log = logging.getLogger("trillium")


async def serve_engine(
    engine: Engine,
    *,
    host: str,
    port: int,
    handle_signals: bool = True,
    access: AccessConfig | None = None,
    log_requests: bool = False,
    limits: InputLimits | None = None,
    config_path: str | None = None,
    tls: ServerTLS | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> int:
    """Serve until SIGINT/SIGTERM (or cancellation); reports the bound URLs once listening.
    Returns the exit code: 0, or 1 when an actor failed past its restart budget.

    ``access`` (tenants, keys, limits, ledger path) turns on API keys, quotas and the usage
    ledger; ``log_requests`` prints one JSON line per finished request; ``limits`` bound what one
    request may ask (default: :class:`InputLimits`' defaults). Either of the first two starts the
    metering actor, which the supervisor stops last so that it writes every record.
    ``config_path`` (the file ``access`` was read from) and ``tls`` (HTTPS) are read again on
    SIGHUP and ``POST /v1/admin/reload`` (server/reload.py)."""
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
    health = Snapshot(Health())
    reloader = ConfigReloader(accounting, config_path, tls)
    frontend = FrontendActor(
        client,
        draining,
        host=host,
        port=port,
        accounting=accounting,
        health=health,
        limits=limits,
        tls=tls,
        reloader=reloader,
    )
    supervisor = Supervisor(
        [*engine.actors(), frontend],
        draining=draining,
        sinks=[metering] if metering is not None else [],
        health=health,
        on_hangup=reloader.on_hangup,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: supervisor.run(handle_signals=handle_signals, task_status=task_status))
        task_status.started(frontend.bound_urls)
    return supervisor.exit_code


def run_server(
    config: EngineConfig,
    *,
    host: str,
    port: int,
    access: AccessConfig | None = None,
    log_requests: bool = False,
    limits: InputLimits | None = None,
    config_path: str | None = None,
    tls: ServerTLS | None = None,
) -> int:
    engine = Engine(config)
    code = 0
    try:
        code = trio.run(
            lambda: serve_engine(
                engine,
                host=host,
                port=port,
                access=access,
                log_requests=log_requests,
                limits=limits,
                config_path=config_path,
                tls=tls,
            )
        )
    except KeyboardInterrupt:
        log.info("interrupted")
    finally:
        engine.close()
    if code == 0:
        log.info("stopped")
    else:
        log.error("stopped after a failure (exit code %d)", code)
    return code
