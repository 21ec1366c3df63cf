"""The SQLite usage ledger, ``trillium usage`` over it, and the time bounds both accept."""

from __future__ import annotations

import datetime
import io
import json
import sqlite3

import pytest

from trillium.metering.commands import print_usage
from trillium.metering.ledger import Ledger, open_readonly
from trillium.metering.timespec import parse_time
from trillium.protocol.usage import ABORTED, COMPLETED, FAILED, REJECTED, TenantUsage, UsageRecord


def record(
    i: int, tenant: str, created: float, status: str = COMPLETED, prompt: int = 10, completion: int = 5, cached: int = 0
) -> UsageRecord:
    return UsageRecord(
        request_id=f"cmpl-{i}",
        tenant=tenant,
        model="m",
        endpoint="completions",
        created=created,
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=completion,
        e2e=0.5,
        finish_reason="length",
        status=status,
        ttft=None if status == REJECTED else 0.1,
    )


RECORDS = [
    record(0, "acme", 100.0),
    record(1, "acme", 200.0, cached=8, completion=7),
    record(2, "acme", 300.0, status=ABORTED, completion=2),
    record(3, "acme", 300.0, status=REJECTED, prompt=0, completion=0),
    record(4, "globex", 150.0, status=FAILED, prompt=3, completion=1),
    record(5, "globex", 400.0, prompt=20, completion=20),
]


@pytest.fixture
def ledger_path(tmp_path):
    path = str(tmp_path / "sub" / "usage.sqlite")  # the directory is created
    ledger = Ledger(path)
    ledger.write(RECORDS[:4])
    ledger.write(RECORDS[4:])
    ledger.write([])
    ledger.close()
    return path


def test_rows_round_trip(ledger_path):
    db = sqlite3.connect(ledger_path)
    db.row_factory = sqlite3.Row
    rows = db.execute("SELECT * FROM usage ORDER BY id").fetchall()
    assert [r["request_id"] for r in rows] == [r.request_id for r in RECORDS]
    assert dict(rows[1]) == {
        "id": 2,
        "request_id": "cmpl-1",
        "tenant": "acme",
        "model": "m",
        "endpoint": "completions",
        "created": 200.0,
        "prompt_tokens": 10,
        "cached_tokens": 8,
        "completion_tokens": 7,
        "num_choices": 1,
        "queue_time": None,
        "ttft": 0.1,
        "tpot": None,
        "e2e": 0.5,
        "finish_reason": "length",
        "status": "completed",
        "http_status": 200,
    }
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_totals_per_tenant_and_range(ledger_path):
    ledger = Ledger(ledger_path)  # reopening an existing ledger keeps its rows
    acme, globex = ledger.totals()
    assert acme == TenantUsage(
        tenant="acme",
        requests=4,
        completed=2,
        aborted=1,
        failed=0,
        rejected=1,
        prompt_tokens=30,
        cached_tokens=8,
        completion_tokens=14,
        total_tokens=44,
    )
    assert globex == TenantUsage(
        tenant="globex",
        requests=2,
        completed=1,
        aborted=0,
        failed=1,
        rejected=0,
        prompt_tokens=23,
        cached_tokens=0,
        completion_tokens=21,
        total_tokens=44,
    )
    # [since, until): 200 is in, 300 is out.
    (acme,) = ledger.totals(since=150.0, until=300.0, tenant="acme")
    assert (acme.requests, acme.prompt_tokens, acme.completion_tokens) == (1, 10, 7)
    assert [t.tenant for t in ledger.totals(since=150.0, until=300.0)] == ["acme", "globex"]
    assert ledger.totals(tenant="nobody") == []
    assert ledger.totals(since=1000.0) == []
    ledger.close()


def test_write_is_all_or_nothing(ledger_path):
    ledger = Ledger(ledger_path)
    bad = record(9, "acme", 500.0)
    bad.model = None  # NOT NULL: the whole batch is rolled back
    with pytest.raises(sqlite3.IntegrityError):
        ledger.write([record(8, "acme", 500.0), bad])
    assert sum(t.requests for t in ledger.totals()) == len(RECORDS)
    ledger.close()


def test_schema_version_is_checked(tmp_path):
    path = str(tmp_path / "usage.sqlite")
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version=7")
    db.close()
    with pytest.raises(ValueError, match="schema version 7"):
        Ledger(path)


def test_readonly_connection(ledger_path, tmp_path):
    db = open_readonly(ledger_path)
    with pytest.raises(sqlite3.OperationalError):
        db.execute("DELETE FROM usage")
    db.close()
    with pytest.raises(FileNotFoundError):
        open_readonly(str(tmp_path / "missing.sqlite"))


def test_usage_command_json_and_table(ledger_path, tmp_path):
    out = io.StringIO()
    assert (
        print_usage(ledger=ledger_path, config=None, since="150", until=None, tenant=None, as_json=True, out=out) == 0
    )
    doc = json.loads(out.getvalue())
    assert doc["since"] == 150.0 and doc["until"] is None
    assert [(r["tenant"], r["requests"], r["total_tokens"]) for r in doc["data"]] == [
        ("acme", 3, 29),
        ("globex", 2, 44),
    ]
    out = io.StringIO()
    print_usage(ledger=ledger_path, config=None, since=None, until=None, tenant="globex", as_json=False, out=out)
    head, row = out.getvalue().splitlines()
    assert head.split() == [
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
    ]
    assert row.split() == ["globex", "2", "1", "0", "1", "0", "23", "0", "21", "44"]
    out = io.StringIO()
    print_usage(
        ledger=ledger_path, config=None, since="2000-01-01", until="2000-01-02", tenant=None, as_json=False, out=out
    )
    assert "no requests" in out.getvalue()
    # The config names the ledger (relative to the config file).
    config = tmp_path / "trillium.toml"
    config.write_text('[ledger]\npath = "sub/usage.sqlite"\n[tenants.a]\nkeys = ["' + "0" * 64 + '"]\n')
    out = io.StringIO()
    print_usage(ledger=None, config=str(config), since=None, until=None, tenant=None, as_json=True, out=out)
    assert len(json.loads(out.getvalue())["data"]) == 2
    with pytest.raises(ValueError, match="exactly one"):
        print_usage(ledger=ledger_path, config=str(config), since=None, until=None, tenant=None, as_json=True)
    with pytest.raises(ValueError, match="cannot read 'yesterday'"):
        print_usage(ledger=ledger_path, config=None, since="yesterday", until=None, tenant=None, as_json=True)


NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    "text, expected",
    [
        ("90s", NOW - 90),
        ("15m", NOW - 900),
        ("24h", NOW - 86400),
        (" 1.5h ", NOW - 5400),
        ("7d", NOW - 7 * 86400),
        ("2w", NOW - 14 * 86400),
        ("1769817600", 1769817600.0),
        ("1769817600.5", 1769817600.5),
        ("2026-01-31", datetime.datetime(2026, 1, 31, tzinfo=datetime.timezone.utc).timestamp()),
        ("2026-01-31T12:00:00", datetime.datetime(2026, 1, 31, 12, tzinfo=datetime.timezone.utc).timestamp()),
        ("2026-01-31T12:00:00+02:00", datetime.datetime(2026, 1, 31, 10, tzinfo=datetime.timezone.utc).timestamp()),
    ],
)
def test_parse_time(text, expected):
    assert parse_time(text, now=NOW) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["", "yesterday", "5y", "-", "2026-13-01", "h24"])
def test_parse_time_errors_name_the_forms(text):
    with pytest.raises(ValueError, match="duration ago"):
        parse_time(text, now=NOW)
