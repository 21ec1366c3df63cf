"""Reloading the config without a restart: SIGHUP, or ``POST /v1/admin/reload`` (admin key).

A reload reads the ``--config`` file and loads the TLS files into a scratch context, off the
event loop; if either is wrong, nothing changes and the error names the entry or the file
(logged for SIGHUP, returned by the route). Otherwise both take effect at once, on the event
loop: the new access config for the next request (``Accounting.reload``: new keys work,
removed keys get 401, streams already running finish, tenants that stay keep their quotas) and
the certificates for the next connection (``ServerTLS.reload_files``). One reload at a time.
"""

from __future__ import annotations

import dataclasses
import logging

import trio

from trillium.metering.tenants import ConfigError, load_access_config
from trillium.server.accounting import Accounting
from trillium.server.tls import ServerTLS

log = logging.getLogger("trillium.server")


@dataclasses.dataclass(frozen=True)
class Reloaded:
    """What a reload put in force (the route's answer)."""

    num_tenants: int
    tls: bool  # the certificate files were loaded again
    warnings: list[str]


class ConfigReloader:
    """Re-reads ``config_path`` (None: a server without ``--config``) and the TLS files."""

    def __init__(self, accounting: Accounting, config_path: str | None, tls: ServerTLS | None = None) -> None:
        self.accounting = accounting
        self.config_path = config_path
        self.tls = tls
        self._lock = trio.Lock()

    @property
    def enabled(self) -> bool:
        """Whether there is anything to reload."""
        return self.config_path is not None or self.tls is not None

    async def reload(self) -> Reloaded:
        """Read, check, then apply both or neither. Raises ConfigError (logged; nothing changed)."""
        async with self._lock:
            try:
                access = None
                if self.config_path is not None:
                    access = await trio.to_thread.run_sync(load_access_config, self.config_path)
                if self.tls is not None:
                    await trio.to_thread.run_sync(self.tls.check)
                    self.tls.reload_files()
            except ConfigError as exc:
                log.error("reload refused, the config in force stays: %s", exc)
                raise
            warnings = self.accounting.reload(access) if access is not None else []
        for warning in warnings:
            log.warning("reload: %s", warning)
        num_tenants = len(access.limits) if access is not None else 0
        log.info(
            "reloaded%s%s",
            f" {self.config_path} ({num_tenants} tenants)" if access is not None else "",
            " and the TLS certificate" if self.tls is not None else "",
        )
        return Reloaded(num_tenants, self.tls is not None, warnings)

    async def on_hangup(self) -> None:
        """SIGHUP: reload; a refused config is logged, the old one stays."""
        if not self.enabled:
            log.warning("SIGHUP: nothing to reload (no --config, no TLS)")
            return
        try:
            await self.reload()
        except ConfigError:
            pass  # logged by reload()
