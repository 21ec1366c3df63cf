"""The step-profile benchmark must keep working (``bench/step_profile.py --quick``: an in-process
server, a client subprocess at batch 1 and 2, every part of the inter-token time reported).
Timings are not asserted here; the full run's table belongs in bench/RESULTS.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from step_profile import OPTIONAL_PARTS, PARTS  # noqa: E402


@pytest.mark.bench
def test_quick_run():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "step_profile.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("{")))
    results = summary["results"]
    assert [r["batch"] for r in results] == [1, 2]
    for r in results:
        assert r["steps"] >= 2 and r["diagnostics"]["mixed_steps"] == 0, r
        for key in ("per_step_ms", "per_token_ms"):
            assert set(r[key]) == {part for part, _ in PARTS}, r[key]
            # "other" is the client's gap minus the rest: event-loop work that overlaps the next step
            # on the other core can make it slightly negative (bench/step_profile.py says so)
            assert all(v >= 0 for part, v in r[key].items() if part != "other"), r[key]
            assert r[key]["other"] >= -0.25 * sum(v for part, v in r[key].items() if part != "other"), r[key]
        assert r["client_gap_ms"] > 0 and r["attributed_ms"] > 0
    table_rows = [line.split("|")[1].strip() for line in proc.stdout.splitlines() if line.startswith("| ")]
    for part, label in PARTS:
        if part not in OPTIONAL_PARTS:  # the fused stack's row is tabled only with --fused-layers
            assert table_rows.count(label) == 2, label  # in the per-step and the per-token table
    assert table_rows.count("**client inter-token gap**") == 2
    assert table_rows.count("**attributed total**") == 2
