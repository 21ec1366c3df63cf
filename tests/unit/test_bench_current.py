"""bench/current.py: bench/CURRENT.md is what the committed results give, the generator picks the
latest same-run ratio per comparison and machine, and bench/RESULTS.md (the index of
bench/history/) still names every section the code and docs cite."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.relpath(os.path.abspath(__file__), ROOT)
spec = importlib.util.spec_from_file_location("bench_current", os.path.join(ROOT, "bench", "current.py"))
assert spec is not None and spec.loader is not None
current = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = current  # dataclasses look their module up there
spec.loader.exec_module(current)

AVX2 = {"cpu": "AMD EPYC", "arch": "x86_64", "simd": ["avx2", "fma"], "cores": 2, "kernel_isa": "avx2"}
AVX512 = {**AVX2, "cpu": "Intel Xeon", "simd": ["avx2", "fma", "avx512f"], "kernel_isa": "avx512"}


def _git_history_complete() -> bool:
    out = subprocess.run(
        ["git", "-C", ROOT, "rev-parse", "--is-shallow-repository"], capture_output=True, text=True
    ).stdout.strip()
    return out == "false"


@pytest.mark.skipif(not _git_history_complete(), reason="dates and commits come from git history")
def test_committed_current_md_is_up_to_date():
    assert current.main(["--check"]) == 0, "bench/CURRENT.md is stale: run python bench/current.py"


def _peers(tok_s: dict[str, list[float]], machine: dict, date: str) -> dict:
    """A bench/peers.py compare file, concurrency 1 and 16."""
    engines = {
        engine: {"rows": [{"concurrency": n, "output_throughput": v} for n, v in zip((1, 16), values)]}
        for engine, values in tok_s.items()
    }
    command = "bench/peers.py compare --engines trillium llama.cpp --concurrency 1 16 --max-tokens 64"
    return {"command": command, "machine": machine, "engines": engines, "date": date}


def test_latest_ratio_per_comparison_and_machine(tmp_path):
    files = {
        "old.json": _peers({"trillium": [10, 100], "llama.cpp": [20, 50]}, AVX2, "2026-01-01"),
        "new.json": _peers({"trillium": [30, 100], "llama.cpp": [20, 40]}, AVX2, "2026-02-01"),
        "new.trillium.json": {"rows": []},  # an engine's part of new.json's run
        "xeon.json": _peers({"trillium": [9, 90], "llama.cpp": [10, 30]}, AVX512, "2025-12-01"),
        "ab.json": {
            "bench": "activations_ab",
            "machine": AVX2,
            "date": "2026-01-15",
            "rows": [{"batch": 1, "int16_over_exact_decode": 1.225, "int16_over_exact_prefill": 1.014}],
        },
        "mystery.json": {"something": "else"},
    }
    for name, data in files.items():
        (tmp_path / name).write_text(json.dumps(data))
    page = current.render(str(tmp_path))

    avx2, xeon = page.split("## AMD EPYC")[1].split("## Intel Xeon")
    assert "kernel ISA avx2" in avx2.splitlines()[0]
    rows = [line for line in avx2.splitlines() if line.startswith("| trillium")]
    # The newer run wins at both concurrencies: 30/20 and 100/40, not 10/20 and 100/50.
    assert [row.split(" | ")[3] for row in rows] == ["1.50x", "2.50x"]
    assert all("2026-02-01" in row and "`new.json`" in row for row in rows)
    assert "| batch 1 | 1.23x | 2026-01-15 |" in avx2
    assert "`new.json`: `bench/peers.py compare" in avx2
    # Another CPU's run stays in its own table, however it compares.
    assert "0.90x" in xeon and "0.90x" not in avx2
    assert "read through their run file: 1 files" in page
    assert "No reader for: `mystery.json`." in page


def test_repeats_of_one_sitting_show_as_a_range(tmp_path):
    record = {**AVX2, "commit": "0000000-dirty"}
    for i, ours in enumerate((11, 12, 13)):
        run = _peers({"trillium": [ours, 100], "llama.cpp": [10, 100]}, record, "2026-03-01")
        (tmp_path / f"r{i}.json").write_text(json.dumps(run))
    page = current.render(str(tmp_path))
    assert "| 1.10-1.30x (3 runs) | 2026-03-01 | 0000000-dirty | `r0.json`, `r1.json`, `r2.json` |" in page


def test_check_fails_on_a_stale_page(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "a.json").write_text(json.dumps(_peers({"trillium": [1, 2], "llama.cpp": [1, 1]}, AVX2, "2026-01-01")))
    out = tmp_path / "CURRENT.md"
    args = ["--results", str(results), "--out", str(out)]
    assert current.main(["--check", *args]) == 1
    assert current.main(args) == 0
    assert current.main(["--check", *args]) == 0


@pytest.mark.skipif(not _git_history_complete(), reason="the citing files are listed by git")
def test_results_index_names_every_cited_section_and_links_real_files():
    with open(os.path.join(ROOT, "bench", "RESULTS.md")) as f:
        index = f.read()
    for target in re.findall(r"\]\((history/[^)#]+)", index):
        assert os.path.isfile(os.path.join(ROOT, "bench", target)), target
    flat = " ".join(index.split())
    cited = re.compile(r'RESULTS\.md`?,\s*(?:#|//)?\s*"([^"]+)"(?:\s*and\s*"([^"]+)")?')
    listed = subprocess.run(
        ["git", "-C", ROOT, "ls-files", "README.md", "docs", "python", "bench", "tests", "cpp", "deploy"],
        capture_output=True,
        text=True,
    ).stdout.split()
    checked = 0
    for path in listed:
        if not path.endswith((".md", ".py", ".h", ".cc")) or path.startswith("bench/history/") or path == HERE:
            continue
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            text = f.read()
        for match in cited.finditer(text):
            for name in filter(None, match.groups()):
                name = " ".join(re.sub(r"\n\s*(?:#|//)?", " ", name).split())
                assert name in flat, f'{path} cites bench/RESULTS.md, "{name}", which the index does not name'
                checked += 1
    assert checked > 0
