"""Smoke test of the kernel benchmark: ``bench/kernels/paged_attention.py --quick`` runs and prints
well-formed JSON lines (the numbers themselves are for bench/RESULTS.md, not asserted)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIELDS = {"op", "batch", "context", "dtype", "trillium_us", "torch_us", "speedup", "gbps"}


@pytest.mark.bench
def test_quick_benchmark_runs() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "kernels" / "paged_attention.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert rows[0]["op"] == "read_bandwidth" and rows[0]["gbps"] > 0
    decode = [r for r in rows if r["op"] == "paged_attention_decode"]
    assert {(r["batch"], r["dtype"]) for r in decode} == {(1, "bf16"), (8, "bf16"), (1, "fp32"), (8, "fp32")}
    for row in decode:
        assert row.keys() >= FIELDS and row["trillium_us"] > 0 and row["torch_us"] > 0 and row["gbps"] > 0
