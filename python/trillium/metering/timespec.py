"""Time bounds for usage queries: ``--since 24h``, ``?since=2026-01-31``, ``since=1769817600``."""

from __future__ import annotations

import datetime
import re
import time

_RELATIVE = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|h|d|w)")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_time(text: str, *, now: float | None = None) -> float:
    """Unix time from ``text``: a duration ago (``90s``, ``15m``, ``24h``, ``7d``, ``2w``), unix
    seconds, or an ISO 8601 date / date-time (UTC unless it names an offset).
    Raises ``ValueError`` naming the accepted forms."""
    text = text.strip()
    now = time.time() if now is None else now
    match = _RELATIVE.fullmatch(text)
    if match:
        return now - float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"cannot read {text!r} as a time: use a duration ago (15m, 24h, 7d), unix seconds, "
            "or an ISO 8601 date or date-time"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.timestamp()
