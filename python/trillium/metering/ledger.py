"""The usage ledger: an embedded SQLite database in WAL mode, one row per finished request.

Not thread-safe: one thread at a time may call a :class:`Ledger` (the metering actor runs every
call in its single writer thread). Other processes may read the file while it is written (WAL:
readers never block the writer); ``trillium usage`` does so with :func:`open_readonly`.

Durability: once :meth:`Ledger.write` returns, its transaction survives a kill of the process,
SIGKILL included. In WAL mode with ``synchronous=NORMAL``, COMMIT appends the transaction's pages
and a commit frame to the ``-wal`` file with ``write()`` before it returns; the operating system
holds them even if the process dies, and the next open (by any process) replays the WAL. What
``NORMAL`` does not promise is surviving a power loss or an OS crash (the WAL is fsynced only at
checkpoints): the last transactions may then be lost, but the database is never corrupted. That
is the guarantee the server relies on: the record of a request is committed before its response's
last byte is sent (server/accounting.py), so a response a client read completely has its row even
if the server is killed the next moment. ``FULL`` would add an fsync to every commit.
"""

from __future__ import annotations

import os
import sqlite3

from trillium.protocol.usage import TenantUsage, UsageRecord

SCHEMA_VERSION = 1

_COLUMNS = (
    "request_id",
    "tenant",
    "model",
    "endpoint",
    "created",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "num_choices",
    "queue_time",
    "ttft",
    "tpot",
    "e2e",
    "finish_reason",
    "status",
    "http_status",
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    id INTEGER PRIMARY KEY,
    request_id TEXT NOT NULL,
    tenant TEXT NOT NULL,
    model TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    created REAL NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    cached_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    num_choices INTEGER NOT NULL,
    queue_time REAL,
    ttft REAL,
    tpot REAL,
    e2e REAL NOT NULL,
    finish_reason TEXT,
    status TEXT NOT NULL,
    http_status INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS usage_created ON usage (created);
CREATE INDEX IF NOT EXISTS usage_tenant_created ON usage (tenant, created);
"""

_INSERT = f"INSERT INTO usage ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})"

_TOTALS = """
SELECT tenant, COUNT(*),
       SUM(status = 'completed'), SUM(status = 'aborted'), SUM(status = 'failed'), SUM(status = 'rejected'),
       SUM(prompt_tokens), SUM(cached_tokens), SUM(completion_tokens)
FROM usage WHERE created >= ? AND created < ? AND (? IS NULL OR tenant = ?)
GROUP BY tenant ORDER BY tenant
"""


class Ledger:
    """Appends :class:`UsageRecord` batches and sums them per tenant. ``synchronous``: SQLite's
    setting, ``NORMAL`` (the server's: durable against a process kill) or ``FULL`` (an fsync per
    commit: against power loss too; ``bench/ledger_commit.py`` measures both)."""

    def __init__(self, path: str, synchronous: str = "NORMAL") -> None:
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous must be NORMAL or FULL, not {synchronous!r}")
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        self.path = path
        # check_same_thread=False: the actor's writer thread may be a different pool thread on
        # each call; the actor guarantees one call at a time.
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode: a committed batch survives a crash or SIGKILL of this process (it may
        # be lost only on power loss or an OS crash), at a fraction of FULL's fsync cost.
        self._db.execute(f"PRAGMA synchronous={synchronous}")
        self._db.execute("PRAGMA busy_timeout=5000")
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, SCHEMA_VERSION):
            raise ValueError(f"{path}: usage ledger schema version {version}, expected {SCHEMA_VERSION}")
        self._db.executescript(_SCHEMA)
        self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def write(self, records: list[UsageRecord]) -> None:
        """Insert ``records`` in one transaction (all or none); committed -- durable against a
        process kill -- when this returns, rolled back if it raises."""
        if not records:
            return
        rows = [tuple(getattr(r, c) for c in _COLUMNS) for r in records]
        with self._db:  # BEGIN ... COMMIT, or ROLLBACK on error
            self._db.execute("BEGIN")
            self._db.executemany(_INSERT, rows)

    def totals(
        self, since: float | None = None, until: float | None = None, tenant: str | None = None
    ) -> list[TenantUsage]:
        return totals(self._db, since, until, tenant)

    def close(self) -> None:
        self._db.close()


def open_readonly(path: str) -> sqlite3.Connection:
    """A read-only connection to an existing ledger (raises FileNotFoundError if there is none)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"no usage ledger at {path}")
    return sqlite3.connect(f"file:{os.path.abspath(path)}?mode=ro", uri=True)


def totals(db: sqlite3.Connection, since: float | None, until: float | None, tenant: str | None) -> list[TenantUsage]:
    """Per-tenant sums of the records finished in ``[since, until)`` (open ends when ``None``)."""
    lo = float("-inf") if since is None else since
    hi = float("inf") if until is None else until
    out = []
    for row in db.execute(_TOTALS, (lo, hi, tenant, tenant)):
        name, requests, completed, aborted, failed, rejected, prompt, cached, completion = row
        out.append(
            TenantUsage(
                tenant=name,
                requests=requests,
                completed=completed,
                aborted=aborted,
                failed=failed,
                rejected=rejected,
                prompt_tokens=prompt,
                cached_tokens=cached,
                completion_tokens=completion,
                total_tokens=prompt + completion,
            )
        )
    return out
