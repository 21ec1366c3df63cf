"""runtime/memory.py: the heap a start-up freed goes back to the operating system."""

from __future__ import annotations

import sys

import pytest

from trillium.runtime.memory import return_freed_memory


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim: Linux only")
def test_freed_heap_memory_leaves_the_resident_set():
    # ~200 MB in 2 KB pieces: malloc's heap (not pymalloc, not mmap), as a loader's temporaries
    # are; then one piece above them that stays, so the heap's top cannot shrink on its own.
    pieces = [bytes(2048) for _ in range(100_000)]
    kept = bytes(2048)
    pieces.clear()
    before = _rss_mib()
    assert return_freed_memory()
    assert _rss_mib() < before - 100, (before, _rss_mib())
    assert len(kept) == 2048
