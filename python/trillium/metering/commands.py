"""``trillium usage`` (per-tenant totals from the ledger) and ``trillium hash-key``."""

from __future__ import annotations

import sys
from typing import TextIO

import msgspec

from trillium.metering.ledger import open_readonly, totals
from trillium.metering.tenants import hash_key, load_access_config, new_key
from trillium.metering.timespec import parse_time

_COLUMNS = (
    "tenant",
    "requests",
    "completed",
    "aborted",
    "failed",
    "rejected",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "total_tokens",
)


def print_usage(
    *,
    ledger: str | None,
    config: str | None,
    since: str | None,
    until: str | None,
    tenant: str | None,
    as_json: bool,
    out: TextIO | None = None,
) -> int:
    """Print per-tenant totals on ``out`` (default: the current ``sys.stdout``); raises
    ValueError / FileNotFoundError with a message for the user."""
    out = out if out is not None else sys.stdout
    if ledger is not None and config is None:
        path = ledger
    elif config is not None and ledger is None:
        path = load_access_config(config).ledger_path
    else:
        raise ValueError("give exactly one of --ledger PATH and --config FILE")
    lo = parse_time(since) if since is not None else None
    hi = parse_time(until) if until is not None else None
    db = open_readonly(path)
    try:
        rows = totals(db, lo, hi, tenant)
    finally:
        db.close()
    if as_json:
        out.write(msgspec.json.encode({"since": lo, "until": hi, "data": rows}).decode() + "\n")
        return 0
    table = [_COLUMNS] + [tuple(str(getattr(r, c)) for c in _COLUMNS) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(_COLUMNS))]
    for row in table:
        out.write(
            "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))) + "\n"
        )
    if not rows:
        out.write("(no requests in this range)\n")
    return 0


def print_key_hashes(*, from_stdin: bool, out: TextIO | None = None) -> int:
    """Without ``from_stdin``: a new random key and its hash. With it: the hash of each line."""
    out = out if out is not None else sys.stdout
    if not from_stdin:
        key = new_key()
        out.write(f"key:  {key}\nhash: {hash_key(key)}\n")
        out.write("Give the key to the tenant; put the hash in its `keys` list in the config file.\n")
        return 0
    for line in sys.stdin:
        if line.strip():
            out.write(hash_key(line.strip()) + "\n")
    return 0
