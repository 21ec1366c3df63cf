"""The soak benchmark must keep working (``bench/soak.py --smoke``): mixed requests with client
disconnects and preemption, then zero requests and blocks held, intact allocator and radix-tree
invariants, bounded memory. Its full run's numbers belong in bench/RESULTS.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.bench
def test_smoke_run():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "soak.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=ROOT,
    )
    summary = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("{")))
    assert proc.returncode == 0 and summary["ok"], summary
    assert summary["requests"] == 80 and summary["num_problems"] == 0
    assert summary["final_blocks_in_use"] == 0 and summary["invariants"] == "ok"
    assert summary["client_disconnects"] > 0  # the mix really cut requests off
