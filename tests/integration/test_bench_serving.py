"""The serving benchmark must keep working against a real server (``bench/serving.py --quick``):
both load shapes run, every request completes, and the metrics are well-formed. Speed is not
asserted here; numbers belong in bench/RESULTS.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trillium import _core

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from serving_metrics import parse_slo, percentile, summarize  # noqa: E402


@pytest.mark.bench
def test_quick_run_against_the_server(server, tmp_path):
    result = tmp_path / "run.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "serving.py"),
            "--quick",
            "--base-url",
            server.base_url,
            "--goodput",
            "ttft:60000",
            "tpot:60000",
            "--result-file",
            str(result),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [("concurrency" in r, "request_rate" in r) for r in rows] == [(True, False), (False, True)]
    for row in rows:
        assert row["completed"] == 4 and row["failed"] == 0
        assert row["mean_output_tokens"] == 8  # ignore_eos: every request runs to max_tokens
        assert 0 < row["ttft_p50_ms"] <= row["ttft_p99_ms"] <= row["e2e_p99_ms"]
        assert row["tpot_p50_ms"] > 0 and row["itl_p50_ms"] > 0 and row["output_throughput"] > 0
        assert row["goodput"] == row["request_throughput"]  # generous SLOs: every request is good
    assert "| load |" in proc.stdout
    doc = json.loads(result.read_text())
    assert doc["rows"] == rows and doc["max_tokens"] == 8
    # The result names the CPU it ran on and the kernels trillium picked there (bench/machine.py).
    machine = doc["machine"]
    assert machine["cpu"] and machine["cores"] == os.cpu_count()
    assert machine["kernel_isa"] in _core.supported_kernel_isas()


def test_metric_definitions():
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 99) == 5.0
    # One request: start 0, text chunks at 1.0, 1.5, 2.5, end 2.5, 4 tokens (the first chunk had 2).
    rec = {
        "start": 0.0,
        "chunk_times": [1.0, 1.5, 2.5],
        "end": 2.5,
        "output_tokens": 4,
        "prompt_tokens": 10,
        "ok": True,
    }
    failed = {"start": 0.0, "chunk_times": [], "end": 0.1, "output_tokens": 0, "prompt_tokens": 0, "ok": False}
    row = summarize([rec, failed], wall_s=5.0, slo=parse_slo(["ttft:900"]))
    assert row["completed"] == 1 and row["failed"] == 1
    assert row["ttft_p50_ms"] == 1000.0
    assert row["tpot_p50_ms"] == 500.0  # (2.5 - 1.0) / (4 - 1)
    assert row["itl_mean_ms"] == 750.0  # gaps 0.5 and 1.0
    assert row["output_throughput"] == 0.8 and row["total_token_throughput"] == 2.8
    assert row["goodput"] == 0.0  # TTFT 1000 ms misses the 900 ms SLO
