"""The metering benchmarks must keep working (``bench/metering_overhead.py --quick``: both
servers come up, every request succeeds, the metered server's ledger holds one record per
request; ``bench/metering_micro.py --quick``). Speed is not asserted here; numbers belong in
bench/RESULTS.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.bench
def test_quick_run(tmp_path):
    result = tmp_path / "run.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "metering_overhead.py"), "--quick", "--result-file", str(result)],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    rows, summary = lines[:-1], lines[-1]
    assert [(r["server"], r["round"]) for r in rows] == [("open", 0), ("metered", 0)]
    for row in rows:
        assert row["requests"] == 16 and row["failed"] == 0
        assert row["requests_per_s"] > 0 and 0 < row["latency_p50_ms"] <= row["latency_p99_ms"]
    assert summary["failed"] == 0
    assert summary["ledger_records"] == summary["ledger_completed"] == summary["expected_ledger_records"] == 4 + 16
    open_rate, metered_rate = rows[0]["requests_per_s"], rows[1]["requests_per_s"]
    assert summary["round_ratios"] == [summary["ratio"]] == [round(metered_rate / open_rate, 3)]
    assert summary["ratio_of_medians"] == round(metered_rate / open_rate, 4)
    assert "| median |" in proc.stdout
    doc = json.loads(result.read_text())
    assert doc["rows"] == rows and doc["settings"]["quick"] is True


@pytest.mark.bench
def test_micro_quick_run():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "metering_micro.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = json.loads(proc.stdout.splitlines()[-1])
    assert row["requests"] == 500
    assert row["open_us_per_request"] > 0 and row["metered_us_per_request"] > 0 and row["ledger_us_per_record"] > 0


@pytest.mark.bench
def test_ledger_commit_quick_run():
    """``bench/ledger_commit.py --quick``: in process, every setting commits or sends every record."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "ledger_commit.py"), "--quick", "--waiters", "1", "8"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines()[1:]]
    assert [(r["mode"], r["synchronous"], r["waiters"]) for r in rows] == [
        (mode, sync, waiters) for mode in ("commit", "send") for sync in ("NORMAL", "FULL") for waiters in (1, 8)
    ]
    for row in rows:
        assert row["records"] == 256 and row["records_per_s"] > 0
        committed = row["mode"] == "commit"
        assert (row["wait_p50_us"] is not None) == committed
        if committed:  # one transaction per record alone; shared by the waiters finishing together
            assert row["records_per_transaction"] == (1.0 if row["waiters"] == 1 else pytest.approx(8, abs=4))
