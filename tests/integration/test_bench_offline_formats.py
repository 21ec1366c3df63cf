"""bench/offline_formats.py runs (smoke size) and prints one line per format; never how fast."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "offline_formats.py")


@pytest.mark.bench
def test_prints_a_line_per_format():
    out = subprocess.run(
        [
            sys.executable,
            BENCH,
            "--formats",
            "fp32:dense",
            "fp32:auto",
            "--rounds",
            "1",
            "--max-tokens",
            "2",
            "--batch",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [(x["dtype"], x["weights"]) for x in lines] == [("fp32", "dense"), ("fp32", "auto")]
    assert all(x["tok_s_1"] > 0 and x["tok_s_2"] > 0 for x in lines)
