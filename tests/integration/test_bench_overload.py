"""The overload benchmark must keep working (``bench/overload.py --quick``: both phases run, every
request is answered with 200 or 503/429 + Retry-After, ``/health`` is polled). It floods the
overload test's server (``--max-running 4 --max-waiting 8``, what ``--quick`` would start) rather
than starting its own. Timings are not asserted here; numbers belong in bench/RESULTS.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.bench
def test_quick_run(small_queue_server, tmp_path):
    result = tmp_path / "run.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "overload.py"),
            "--quick",
            "--base-url",
            small_queue_server.base_url,
            "--result-file",
            str(result),
        ],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    rows, summary = lines[:-1], lines[-1]
    assert [r["phase"] for r in rows] == ["fair", "flood"]
    assert rows[1]["flood_concurrency"] == 10 * rows[1]["steady_concurrency"]
    for row in rows:
        assert row["steady_completed"] > 0 and row["flood_completed"] > 0
        assert row["steady_failed"] == row["flood_failed"] == 0
        assert row["health_n"] > 0 and 0 < row["health_p50_ms"] <= row["health_p99_ms"]
    assert summary["failed"] == 0 and summary["steady_ttft_p99_ratio"] > 0
    doc = json.loads(result.read_text())
    assert doc["rows"] == rows and doc["summary"] == summary and doc["settings"]["quick"] is True
