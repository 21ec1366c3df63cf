"""Runs the C++ unit tests (tests/cpp, cpp/examples) through scripts/ctest.sh, so pytest covers them."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("ctest") is None, reason="cmake not installed")
def test_ctest_passes():
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "ctest.sh")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, f"scripts/ctest.sh failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
