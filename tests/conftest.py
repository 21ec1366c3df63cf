"""Every test starts from a fresh random seed, printed when the test fails.

The global ``random`` and ``torch`` generators are seeded before each test, so tests that draw
"fresh random inputs" differ run to run and a failure can still be replayed:
``TRILLIUM_TEST_SEED=<seed> pytest <test id>``. Tests that need their own generator take the
``random_seed`` fixture.
"""

from __future__ import annotations

import atexit
import os
import random
import secrets
import shutil
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
import torch

# The Hugging Face oracle's fixtures (hf_reference_dir): one instance for the whole session, which
# a fixture imported into each test module would not be (each import is a fixture of its own).
pytest_plugins = ["tests.hf_oracle"]

_SEED_KEY = pytest.StashKey[int]()

# The C++ builds that tests run as subprocesses (the C++ tests, the embedding install, the
# wheel) find what the venv installed (ccache: the core's CMake build picks it up from PATH),
# whether or not the venv was activated, and compile with the C++ compiler the set-up's build
# used (scikit-build-core takes Python's: ``g++`` where a plain cmake takes ``c++``), so that
# ccache, which keys on the compiler's name, serves them from that build's objects.
_VENV_BIN = os.path.dirname(sys.executable)
if _VENV_BIN not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = os.pathsep.join(filter(None, [_VENV_BIN, os.environ.get("PATH")]))
# Servers started by the suite share one step-costs cache (engine.step_costs_cache), the
# suite's own: the first start-up times steps, later ones reuse its costs; the user's cache is
# left alone.
if "TRILLIUM_CACHE_DIR" not in os.environ:
    os.environ["TRILLIUM_CACHE_DIR"] = tempfile.mkdtemp(prefix="trillium-test-cache-")
    atexit.register(shutil.rmtree, os.environ["TRILLIUM_CACHE_DIR"], True)
_PY_CXX = (sysconfig.get_config_var("CXX") or "").split()
if _PY_CXX and "CXX" not in os.environ and shutil.which(_PY_CXX[0]):
    os.environ["CXX"] = _PY_CXX[0]


def pytest_configure(config: pytest.Config) -> None:
    # The bench lane: tests that run a bench/ script's smoke mode (a benchmark that still runs and
    # reports what it promises). CI runs them with the rest; `pytest -m "not bench"` is the quick run.
    config.addinivalue_line("markers", "bench: runs a bench/ script in its smoke mode")


@pytest.fixture(autouse=True)
def random_seed(request: pytest.FixtureRequest) -> Iterator[int]:
    value = int(os.environ.get("TRILLIUM_TEST_SEED") or secrets.randbits(31))
    request.node.stash[_SEED_KEY] = value
    random.seed(value)
    torch.manual_seed(value)
    yield value


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    report = yield
    if report.failed and _SEED_KEY in item.stash:
        report.sections.append(("random seed", f"TRILLIUM_TEST_SEED={item.stash[_SEED_KEY]} replays this test"))
    return report


@pytest.fixture(scope="session")
def server_with() -> Iterator[Any]:
    """``server_with(*flags, env=None)``: the session's one running ``trillium serve`` with these
    flags, started on first use (tests/integration/conftest.py, ServerPool). Here rather than in
    tests/integration/ so that tests/browser/ shares the same servers."""
    from tests.integration.conftest import ServerPool

    pool = ServerPool()
    yield pool
    pool.stop_all()
