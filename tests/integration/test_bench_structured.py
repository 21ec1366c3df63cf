"""bench/structured.py runs (smoke sizes) and reports what it promises; never how fast."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "structured.py")
DATA = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "jsonschemabench")


def run(*args: str) -> list[dict]:
    out = subprocess.run([sys.executable, BENCH, *args], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


@pytest.mark.bench
@pytest.mark.skipif(not os.path.isdir(DATA), reason="JSONSchemaBench data not present")
def test_coverage_reports_each_subset_and_a_summary():
    lines = run("coverage", "--per-subset", "3", "--subsets", "Github_trivial", "Glaiveai2K")
    assert [line["subset"] for line in lines] == ["Github_trivial", "Glaiveai2K", "all"]
    summary = lines[-1]
    # Every one of these schemas compiles, and the grammar neither blocks a valid instance nor lets
    # an invalid one through (what a user sees as a 400, a stuck request or invalid JSON).
    assert summary["schemas"] == summary["compiled"] == 6
    assert summary["false_rejects"] == 0 and summary["false_accepts"] == 0
    assert summary["valid_instances"] > 0 and summary["masks"] > 0  # instances were fed token by token
    for key in (
        "coverage_pct",
        "false_rejects",
        "false_accepts",
        "compile_ms_p50",
        "compile_ms_p99",
        "mask_us_p50",
        "mask_us_p99",
    ):
        assert key in summary


@pytest.mark.bench
@pytest.mark.skipif(not os.path.isdir(DATA), reason="JSONSchemaBench data not present")
def test_witness_reports_each_subset_and_a_summary():
    lines = run("witness", "--per-subset", "4", "--subsets", "Synthesized", "Handwritten")
    assert [line["subset"] for line in lines] == ["Synthesized", "Handwritten", "all"]
    # No search raises; every Synthesized schema has a witness (the value a closing writes), and
    # some Handwritten one does (4 of 4 and 2 of 4 when written, far inside the time budget).
    assert lines[-1]["schemas"] == 8 and lines[-1]["failed"] == 0
    assert lines[0]["found"] == lines[0]["schemas"] == 4 and lines[1]["found"] >= 1
    assert all("checks_p50" in line and "found_pct" in line for line in lines[:-1])


@pytest.mark.bench
def test_steps_compares_free_and_constrained_runs():
    (line,) = run("steps", "--batch", "2", "--max-tokens", "4", "--repeats", "1")
    assert line["free"]["tokens"] == line["json_schema"]["tokens"] == 8  # ignore_eos: same work in both
    # (Step counts may differ by one: the second run's prompts hit the prefix cache.)
    assert line["free"]["steps"] > 0 and line["json_schema"]["steps"] > 0
    assert "overhead_pct" in line and line["json_schema"]["wait_ms_per_step"] >= 0
    assert line["checked"]["tokens"] == 8 and "checks_overhead_pct" in line


@pytest.mark.bench
@pytest.mark.skipif(not os.path.isdir(DATA), reason="JSONSchemaBench data not present")
def test_server_run_reports_outcomes_and_health_latency():
    bench = os.path.join(os.path.dirname(BENCH), "structured_server.py")
    out = subprocess.run([sys.executable, bench, "--quick"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    assert line["requests"] == 6 == sum(line["outcomes"].values())
    assert "timeout" not in line["outcomes"] and not any("stop unparsable" in k for k in line["outcomes"])
    assert set(line["health_ms"]) == {"p50", "p99", "max"} and line["health_ms"]["max"] is not None
