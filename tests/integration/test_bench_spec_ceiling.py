"""``bench/spec_ceiling.py`` must keep running in its smoke mode (two prompts, short answers): the
verify-step cost table, then one line per policy whose greedy replay accounts for every token.
Speed is not asserted here; numbers belong in bench/RESULTS.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.bench
@pytest.mark.slow
def test_spec_ceiling_smoke():
    cmd = [sys.executable, str(ROOT / "bench" / "spec_ceiling.py"), "--num-prompts", "2", "--max-tokens", "24"]
    out = subprocess.run([*cmd, "--repeats", "1", "--k", "3"], capture_output=True, text=True, timeout=600, check=True)
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    costs = lines[0]["step_ms_by_rows"]
    assert len(costs) == 9 and all(v > 0 for v in costs.values())
    rows = {r["policy"]: r for r in lines[1:]}
    assert set(rows) == {"engine", "always", "oracle"}
    for r in rows.values():
        assert r["k"] == 3 and r["steps"] > 0 and r["verifies"] <= r["steps"]
    # The oracle walks the same tokens as `always` with only the drafts that are accepted: no more
    # steps and no more verify steps. (Not its speedup: that comes from timed step costs, which
    # a noisy machine may put out of order -- a test checks that a benchmark runs, not how fast.)
    assert rows["oracle"]["steps"] <= rows["always"]["steps"]
    assert rows["oracle"]["verifies"] <= rows["always"]["verifies"]
    assert "| policy | k |" in out.stdout
