"""Usage metering, tenants and quotas, Prometheus metrics.

``tenants`` (TOML config, key hashes), ``buckets`` and ``quotas`` (per-tenant limits),
``ledger`` (SQLite usage ledger), ``actor`` (the MeteringActor that writes it off the event
loop), ``metrics`` (Prometheus), ``request_log`` (JSON lines), ``timespec`` (query bounds).
"""

from trillium.metering import request_log
from trillium.metering.actor import MeteringActor, UsageSink
from trillium.metering.ledger import Ledger
from trillium.metering.metrics import Metrics
from trillium.metering.quotas import LimitExceeded, Quotas, TenantQuota
from trillium.metering.tenants import AccessConfig, ConfigError, hash_key, load_access_config, new_key

__all__ = [
    "AccessConfig",
    "ConfigError",
    "Ledger",
    "LimitExceeded",
    "MeteringActor",
    "Metrics",
    "Quotas",
    "TenantQuota",
    "UsageSink",
    "hash_key",
    "load_access_config",
    "new_key",
    "request_log",
]
