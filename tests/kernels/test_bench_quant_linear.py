"""Smoke test of ``bench/kernels/quant_linear.py --quick``: it runs and prints well-formed JSON lines
(the numbers are for bench/RESULTS.md, not asserted)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIELDS = {"op", "rows", "out_features", "in_features", "bits", "trillium_us", "torch_us", "speedup", "gops"}


@pytest.mark.bench
def test_quick_benchmark_runs() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "kernels" / "quant_linear.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert "kernel_isa" in rows[0]
    assert {(r["op"], r["rows"]) for r in rows[1:]} == {(op, m) for op in ("qkv_proj", "o_proj") for m in (1, 16)}
    for row in rows[1:]:
        assert row.keys() >= FIELDS and row["trillium_us"] > 0 and row["torch_us"] > 0
