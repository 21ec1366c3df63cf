"""Structured request logs (``trillium serve --log-requests``): one JSON line per finished request.

Lines go to the ``trillium.requests`` logger, which prints the bare JSON object (no prefix) on
stderr unless the application configured that logger itself. They are written from the
metering actor's worker thread, so a slow terminal or disk never stalls the event loop.
"""

from __future__ import annotations

import datetime
import logging

import msgspec

from trillium.protocol.usage import UsageRecord

logger = logging.getLogger("trillium.requests")


def configure() -> None:
    """Print this logger's records as bare lines on stderr, apart from the human-readable log."""
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def format_record(record: UsageRecord) -> str:
    """``{"event": "request", "time": ISO-8601 UTC, ...every UsageRecord field}`` on one line."""
    when = datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
    fields = {"event": "request", "time": when.isoformat(timespec="milliseconds"), **msgspec.structs.asdict(record)}
    return msgspec.json.encode(fields).decode()


def log_records(records: list[UsageRecord]) -> None:
    for record in records:
        logger.info(format_record(record))
