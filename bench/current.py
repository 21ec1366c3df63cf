"""Today's numbers at a glance: bench/CURRENT.md, generated from bench/results/*.json.

Absolute numbers move 3x between the CPUs this project runs on (bench/machine.py), so only a
ratio measured in one run counts, and only beside others from the same machine. For each machine
record (cpu + simd + cores + kernel ISA, or the GPU) this writes one table: for every comparison
a result file reports (trillium vs a peer engine per concurrency, speculation on vs off, int16 vs
exact activations, a precision mode's quality against exact, ...) the latest same-run ratio, with
its date, commit and source file; the commands follow each table. Repeats of one sitting (the
same comparison at the same recorded commit and date) show as a range.

Date and commit: the commit is the file's ``machine.commit`` where recorded, else the file's last
git commit (marked "(file)"); the date is the file's own ``date`` where it has one, else that
commit's date. A result file not yet committed reads "uncommitted": commit it, then regenerate.

    python bench/current.py            # writes bench/CURRENT.md
    python bench/current.py --check    # exit 1 if bench/CURRENT.md is not what the results give

The dated write-ups behind these numbers are in bench/history/ (indexed by bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.path.join(ROOT, "bench", "results")
OUT = os.path.join(ROOT, "bench", "CURRENT.md")
NOT_RECORDED = "not recorded"


@dataclass(frozen=True)
class Source:
    """Where a row comes from: ``file`` is its name under the results directory."""

    file: str
    date: str
    commit: str
    command: str
    order: tuple[str, int, str]  # (date, commit time, file): larger is later


@dataclass(frozen=True)
class Row:
    """One comparison's ratio from one result file. Rows with equal (kind, comparison, subject,
    at) under one machine record are the same comparison measured at different times."""

    kind: str
    comparison: str
    subject: str
    at: str
    value: str
    number: float | None  # the ratio the range of repeats is taken over; None if not one number
    sort: tuple


# -- machine records -----------------------------------------------------------------------------


def machine_key(data: dict) -> tuple:
    """(cpu, simd, cores, kernel_isa, device) of a result file; a missing part is None."""
    record = data.get("machine")
    if record is None and isinstance(data.get("engines"), dict):
        per_engine = {json.dumps(e.get("machine"), sort_keys=True) for e in data["engines"].values()}
        if len(per_engine) == 1:
            record = json.loads(per_engine.pop())
    meta = data.get("meta")
    if isinstance(meta, dict) and meta.get("device"):
        return (None, None, None, None, meta["device"])
    if isinstance(record, str):  # an early record: "x86_64 2 cpus, Linux-..."
        m = re.match(r"(\S+) (\d+) cpus", record)
        return (m[1], None, int(m[2]), None, None) if m else (None, None, None, None, None)
    if isinstance(record, dict):
        simd = record.get("simd")
        return (record.get("cpu"), tuple(simd) if simd else None, record.get("cores"), record.get("kernel_isa"), None)
    return (None, None, None, None, None)


def machine_label(key: tuple) -> str:
    cpu, simd, cores, isa, device = key
    if device:
        return f"GPU: {device}"
    if key == (None, None, None, None, None):
        return "Machine not recorded"
    parts = [
        cpu or f"CPU {NOT_RECORDED}",
        f"SIMD {' '.join(simd)}" if simd else f"SIMD {NOT_RECORDED}",
        f"{cores} cores" if cores else f"cores {NOT_RECORDED}",
        f"kernel ISA {isa}" if isa else f"kernel ISA {NOT_RECORDED}",
    ]
    return " · ".join(parts)


def machine_complete(key: tuple) -> bool:
    return bool(key[4]) or all(part is not None for part in key[:4])


# -- date and commit -----------------------------------------------------------------------------


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def source_of(path: str, data: dict, command: str) -> Source:
    record = data.get("machine") if isinstance(data.get("machine"), dict) else {}
    meta = data.get("meta") if isinstance(data.get("meta"), dict) else {}
    own_date = data.get("date") or meta.get("date")
    recorded = record.get("commit")
    shown = recorded or ""
    info = _git("show", "-s", "--format=%cs %ct", recorded.removesuffix("-dirty")) if recorded else ""
    if not info:
        info = _git("log", "-1", "--format=%cs %ct %h", "--", os.path.relpath(path, ROOT))
        if info and not recorded:
            shown = info.split()[2] + " (file)"
    date, stamp = (info.split()[0], int(info.split()[1])) if info else ("uncommitted", 0)
    date = own_date or date
    return Source(os.path.basename(path), date, shown or "uncommitted", command or NOT_RECORDED, (date, stamp, path))


# -- readers, one per bench kind -----------------------------------------------------------------


def _flag(argv: list[str], name: str) -> str | None:
    """The value after the last ``name`` in ``argv``; None if absent."""
    hits = [i for i, arg in enumerate(argv) if arg == name and i + 1 < len(argv)]
    return argv[hits[-1] + 1] if hits else None


def _model(argv: list[str], fallback: str | None) -> str:
    path = _flag(argv, "--model")
    if path:
        return os.path.basename(path).removesuffix(".gguf")
    return fallback or "default model"


def read_peers(data: dict) -> Iterator[Row]:
    """bench/peers.py compare: trillium's output tok/s over each peer's, per concurrency (prompt
    tok/s where one token is generated, a prefill run)."""
    argv = shlex.split(data.get("command", ""))
    engines = data["engines"]
    trillium = {r["concurrency"]: r for r in engines.get("trillium", {}).get("rows", [])}
    first = next(iter(trillium.values()), {})
    model = _model(argv, first.get("model"))
    max_tokens = _flag(argv, "--max-tokens") or "?"
    input_len = _flag(argv, "--input-len")
    prefill = max_tokens == "1"
    metric = "total_token_throughput" if prefill else "output_throughput"
    workload = [
        "vLLM's bench client" if _flag(argv, "--client") == "vllm" else "bench/serving.py",
        f"{input_len}-token prompts" if input_len else "ShareGPT prompts",
        f"{max_tokens} tokens out",
    ]
    if "--trillium-speculation" in argv:
        workload.append("trillium speculating")
    for peer, result in engines.items():
        if peer == "trillium":
            continue
        for row in result.get("rows", []):
            ours = trillium.get(row["concurrency"])
            if prefill and ours and not row.get(metric) and row.get("ttft_p50_ms") and ours.get("ttft_p50_ms"):
                # vLLM's client reports no prompt tok/s: a prefill run is read as its TTFT.
                ratio = ours["ttft_p50_ms"] / row["ttft_p50_ms"]
                n = row["concurrency"]
                yield Row(
                    "peers",
                    f"trillium ÷ {peer}, TTFT p50 (lower: trillium faster)",
                    f"{model}; {', '.join(workload)}",
                    f"{n} stream{'s' if n != 1 else ''}",
                    f"{ratio:.2f}x ({ours['ttft_p50_ms']:.0f} vs {row['ttft_p50_ms']:.0f} ms)",
                    ratio,
                    (n,),
                )
                continue
            if not ours or not row.get(metric):
                continue
            ratio = ours[metric] / row[metric]
            n = row["concurrency"]
            yield Row(
                "peers",
                f"trillium ÷ {peer}, {'prompt' if prefill else 'output'} tok/s",
                f"{model}; {', '.join(workload)}",
                f"{n} stream{'s' if n != 1 else ''}",
                f"{ratio:.2f}x",
                ratio,
                (n,),
            )


def read_speculative(data: dict) -> Iterator[Row]:
    """bench/speculative.py: output tok/s with speculation on over off, per workload and concurrency."""
    settings = data["settings"]
    config = json.loads(settings["speculative_config"])
    method = ", ".join(f"{k} {v}" for k, v in config.items() if k != "model")
    if config.get("model"):
        method += f", draft {os.path.basename(config['model']).removesuffix('.gguf')}"
    model = os.path.basename(settings.get("model") or "default model").removesuffix(".gguf")
    for row in data["rows"]:
        n = row["concurrency"]
        yield Row(
            "speculative",
            "speculation on ÷ off, output tok/s",
            f"{model}; {method}; {row['workload']} prompts",
            f"{n} stream{'s' if n != 1 else ''}",
            f"{row['tok_s_ratio']:.2f}x (TPOT {row['tpot_ratio']:.2f}x; {row['mismatches']} of {row['compared']} "
            "outputs differ)",
            row["tok_s_ratio"],
            (n,),
        )


def read_activations_ab(data: dict) -> Iterator[Row]:
    """bench/activations_ab.py: int16 over exact activations, decode and prefill tok/s, per batch."""
    for row in data["rows"]:
        for phase in ("decode", "prefill"):
            ratio = row.get(f"int16_over_exact_{phase}")
            if ratio is not None:
                yield Row(
                    "activations_ab",
                    f"int16 ÷ exact activations, {phase} tok/s",
                    f"{data.get('model', 'default')} model",
                    f"batch {row['batch']}",
                    f"{ratio:.2f}x",
                    ratio,
                    (row["batch"], phase),
                )


def read_quality(data: dict) -> Iterator[Row]:
    """bench/quality.py: each mode against exact fp32 -- mean KL divergence, top-1 agreement, ppl."""
    for mode, phases in data["modes"].items():
        for phase, q in phases.items():
            if mode == "exact" or "kld" not in q:
                continue
            ratio = q.get("ppl_ratio")
            yield Row(
                "quality",
                f"{mode} vs exact: KLD, top-1 agreement, perplexity ratio",
                f"{data.get('model', '?')}; {data.get('num_tokens', '?')} tokens of {data.get('text', '?')}",
                f"{phase}, {q['positions']} positions",
                f"KLD {q['kld']:.2g}, top-1 {100 * q['top1']:.3f}%"
                + (f", ppl {ratio:.5f}x" if ratio is not None else ""),
                None,
                (phase,),
            )
    llama = data.get("llama.cpp") or {}
    if "ppl" in llama:  # llama-perplexity on the same file and text (its own tokenizer and windows)
        for mode, phases in data["modes"].items():
            ppl = phases.get("prefill", {}).get("ppl")
            if ppl is not None and mode != "exact":
                yield Row(
                    "quality",
                    f"{mode} perplexity ÷ llama.cpp's (llama-perplexity)",
                    f"{data.get('model', '?')}; {data.get('text', '?')}, 512-token windows",
                    "prefill",
                    f"{ppl / llama['ppl']:.4f}x ({ppl:.4f} vs {llama['ppl']:.4f})",
                    ppl / llama["ppl"],
                    ("prefill",),
                )


def read_gpu(data: dict) -> Iterator[Row]:
    """bench/gpu.py: end to end trillium over HF transformers; paged decode attention over torch
    SDPA (time ratio), as a range over the context lengths of each shape and batch."""
    spans: dict[tuple[str, int], list[tuple[int, float]]] = {}
    for row in data["rows"]:
        if "ratio_trillium_over_hf" in row:
            yield Row(
                "gpu",
                "trillium ÷ HF transformers, tok/s",
                "gpu.py e2e",
                row["ratio_trillium_over_hf"],
                f"{row['value']:.2f}x",
                row["value"],
                (row["ratio_trillium_over_hf"],),
            )
        elif row.get("op") == "paged_attention_decode":
            spans.setdefault((row["heads"], row["batch"]), []).append((row["context"], row["speedup_vs_sdpa"]))
    for (heads, batch), points in spans.items():
        contexts = sorted(c for c, _ in points)
        lo, hi = min(s for _, s in points), max(s for _, s in points)
        yield Row(
            "gpu",
            "paged decode attention, SDPA time ÷ trillium time",
            f"heads {heads}",
            f"batch {batch}, context {contexts[0]}-{contexts[-1]}",
            f"{lo:.2f}-{hi:.2f}x",
            None,
            (heads, batch),
        )


def read_cluster(data: dict) -> Iterator[Row]:
    """bench/cluster.py: each setup's output tok/s over the single replica's."""
    rows = data["rows"]
    single = next((r for r in rows if r.get("replicas") == 1), None)
    args = data.get("args", {})
    for row in rows:
        if single is None or row is single:
            continue
        ratio = row["output_throughput"] / single["output_throughput"]
        yield Row(
            "cluster",
            f"replicas ÷ {single['setup']}, output tok/s",
            f"{args.get('requests', '?')} requests, {args.get('streams', '?')} streams, shared system prompts",
            row["setup"],
            f"{ratio:.2f}x",
            ratio,
            (row["setup"],),
        )


def kind_of(data: object) -> str | None:
    if not isinstance(data, dict):
        return None
    if data.get("bench") in READERS:
        return data["bench"]
    if isinstance(data.get("engines"), dict):
        return "peers"
    if isinstance(data.get("settings"), dict) and "speculative_config" in data["settings"]:
        return "speculative"
    if isinstance(data.get("meta"), dict) and "device" in data["meta"]:
        return "gpu"
    if isinstance(data.get("args"), dict) and all("setup" in r for r in data.get("rows", [{}])):
        return "cluster"
    return None


READERS: dict[str, Callable[[dict], Iterator[Row]]] = {
    "peers": read_peers,
    "speculative": read_speculative,
    "activations_ab": read_activations_ab,
    "quality": read_quality,
    "gpu": read_gpu,
    "cluster": read_cluster,
}
KIND_ORDER = list(READERS)


def command_of(data: dict) -> str:
    meta = data.get("meta") if isinstance(data.get("meta"), dict) else {}
    return data.get("command") or meta.get("command") or ""


# -- the page ------------------------------------------------------------------------------------


def collect(results_dir: str) -> tuple[dict[tuple, list[tuple[Row, Source]]], list[str], list[str]]:
    """Rows by machine key; files read through their run file (an engine's part of a compare);
    files no reader understands."""
    paths = sorted(glob.glob(os.path.join(results_dir, "*.json")))
    loaded: dict[str, object] = {}
    for path in paths:
        try:
            with open(path) as f:
                loaded[path] = json.load(f)
        except (OSError, ValueError):
            loaded[path] = None
    runs = [p[: -len(".json")] + "." for p, d in loaded.items() if kind_of(d) == "peers"]
    by_machine: dict[tuple, list[tuple[Row, Source]]] = {}
    parts, unread = [], []
    for path, data in loaded.items():
        kind = kind_of(data)
        if kind is None:
            (parts if any(path.startswith(run) for run in runs) else unread).append(os.path.basename(path))
            continue
        assert isinstance(data, dict)
        try:
            rows = list(READERS[kind](data))
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            unread.append(os.path.basename(path))
            continue
        source = source_of(path, data, command_of(data))
        by_machine.setdefault(machine_key(data), []).extend((row, source) for row in rows)
    return by_machine, parts, unread


def latest(rows: list[tuple[Row, Source]]) -> list[tuple[Row, list[Source], str]]:
    """Per comparison the latest measurement; repeats of it (same recorded commit and date) as a range."""
    by_key: dict[tuple, list[tuple[Row, Source]]] = {}
    for row, source in rows:
        by_key.setdefault((row.kind, row.comparison, row.subject, row.at), []).append((row, source))
    out = []
    for group in by_key.values():
        row, source = max(group, key=lambda rs: rs[1].order)
        same = [(r, s) for r, s in group if s.commit == source.commit and s.date == source.date]
        if "(file)" in source.commit or len(same) == 1 or any(r.number is None for r, _ in same):
            out.append((row, [source], row.value))
            continue
        numbers = sorted(r.number for r, _ in same if r.number is not None)
        value = f"{numbers[0]:.2f}-{numbers[-1]:.2f}x ({len(same)} runs)"
        out.append((row, sorted((s for _, s in same), key=lambda s: s.file), value))
    out.sort(key=lambda t: (KIND_ORDER.index(t[0].kind), t[0].comparison, t[0].subject, t[0].sort, t[0].at))
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render(results_dir: str) -> str:
    by_machine, parts, unread = collect(results_dir)
    lines = [
        "# Today's numbers",
        "",
        "Generated by `python bench/current.py` from `bench/results/*.json`; do not edit by hand",
        "(`python bench/current.py --check` fails when this page is stale). One table per machine",
        "record: for each comparison, the latest ratio measured within one run, with its date, commit",
        "and source file; the commands follow each table. Ratios are comparable only within a table.",
        "The dated write-ups are in `bench/history/`, indexed by `bench/RESULTS.md`.",
    ]

    def recency(item: tuple[tuple, list]) -> tuple:
        key, rows = item
        return (machine_complete(key), max(s.order for _, s in rows))

    for key, rows in sorted(by_machine.items(), key=recency, reverse=True):
        lines += ["", f"## {machine_label(key)}", ""]
        if not machine_complete(key):
            lines += [
                "The record is incomplete, so these rows may come from different CPUs (the machine kind's",
                "CPU changed between sittings): read each beside its sitting in bench/history/ only.",
                "",
            ]
        lines += ["| comparison | what | at | ratio | date | commit | source |", "|---|---|---|---|---|---|---|"]
        commands: dict[str, str] = {}
        for row, sources, value in latest(rows):
            first = sources[-1]
            files = ", ".join(f"`{s.file}`" for s in sources)
            cells = [row.comparison, row.subject, row.at, value, first.date, first.commit, files]
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
            commands.update((s.file, s.command) for s in sources)
        lines += ["", "Commands:", ""]
        lines += [f"- `{file}`: `{command}`" for file, command in sorted(commands.items())]
    lines += ["", "## Files not in these tables", ""]
    lines.append(
        f"- Engine parts of a compare run, read through their run file: {len(parts)} files"
        + (f" (`{parts[0]}`, ...)." if parts else ".")
    )
    lines.append("- No reader for: " + (", ".join(f"`{f}`" for f in unread) if unread else "none") + ".")
    lines.append(
        "- Bench kinds with no result file here (they print JSON lines instead): prefix cache"
        " (`bench/prefix_cache.py`, `bench/prefix_cache_ops.py`), kernels (`bench/kernels/`)."
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--results", default=RESULTS_DIR, help="directory of result files (default: bench/results)")
    p.add_argument("--out", default=OUT, help="page to write or check (default: bench/CURRENT.md)")
    p.add_argument("--check", action="store_true", help="exit 1 if --out differs from what the results give")
    args = p.parse_args(argv)
    text = render(args.results)
    if args.check:
        try:
            with open(args.out) as f:
                current = f.read()
        except OSError:
            current = ""
        if current != text:
            print(f"{os.path.relpath(args.out)} is stale: run python bench/current.py", file=sys.stderr)
            return 1
        return 0
    with open(args.out, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
