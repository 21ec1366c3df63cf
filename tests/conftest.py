"""Every test starts from a fresh random seed, printed when the test fails.

The global ``random`` and ``torch`` generators are seeded before each test, so tests that draw
"fresh random inputs" differ run to run and a failure can still be replayed:
``TRILLIUM_TEST_SEED=<seed> pytest <test id>``. Tests that need their own generator take the
``random_seed`` fixture.
"""

from __future__ import annotations

import os
import random
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
import torch

_SEED_KEY = pytest.StashKey[int]()


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
