"""Runs the C++ unit tests (tests/cpp, cpp/examples) through scripts/ctest.sh, so pytest covers them.

Configured without the Python modules (``TRILLIUM_BUILD_PYTHON=OFF``): the C++ tests do not use
them, the set-up has already built them, and this is the configuration a C or C++ host embeds
(the core alone, CUDA kernels included where nvcc is found). It took this test 179 -> ~110 s."""

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
        ["bash", str(ROOT / "scripts" / "ctest.sh"), "-DTRILLIUM_BUILD_PYTHON=OFF"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, f"scripts/ctest.sh failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
