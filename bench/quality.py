"""The precision quality contract, measured as llama.cpp measures quantization
(``llama-perplexity --kl-divergence``): each precision mode against the exact one on a held text.

    python bench/quality.py                                  # the default model, every mode it can run
    python bench/quality.py --model FILE.gguf --modes quantized,quantized-int8 --decode-windows 4
    python bench/quality.py --llama-perplexity .peers/llama.cpp/build/bin/llama-perplexity

The held text (``bench/data/held_text.txt``: prose, not the benchmark prompts) is cut into
512-token windows; each window is scored on its second half (the first half is context), as
``llama-perplexity`` does. Per mode:

- ``ppl``: perplexity of the text, ``exp(mean NLL)`` of each scored position's next token;
- ``kld``: mean KL divergence ``KL(P_exact || P_mode)`` over the scored positions, P_exact from
  the exact mode's prefill pass;
- ``top1``: the share of scored positions whose most likely token is exact's.

Two kernel paths are scored: ``prefill`` (each window in one forward pass) and ``decode`` (the
window's first half prefilled, then its second half fed one token per step, teacher-forced: the
decode kernels' rows). ``--decode-windows`` bounds the second (it costs a step per token).

Modes (``trillium.models.load_model``): ``exact`` = dense fp32 (the Hugging Face parity path, the
reference); ``quantized`` = the file's quantized blocks with fp32 activations; ``quantized-int8``
= activations rounded to int8 per block (llama.cpp's way); ``quantized-int16`` = to int16 per
block (``--weights quantized-int16``); ``bf16`` = dense bf16 weights and
activations; ``fp32-kv-bf16`` = exact arithmetic over a bf16 KV cache; ``quantized-kv-bf16`` =
``quantized`` over a bf16 KV cache (``--kv-cache-dtype bf16``); ``quantized-int16-kv-bf16``
likewise over int16 activations; ``auto`` = what the
server's default flags (``--precision auto``) resolve to for this file on this CPU. A mode this
file or CPU cannot run is reported with the reason. Prints one JSON object per mode, then a table; the
contract (DESIGN.md section 9): ``kld <= 0.005``, ``top1 >= 0.98``, ``ppl <= 1.01 x exact's``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import describe
from trillium.config import EngineConfig
from trillium.launch import resolve_weights, weight_activations
from trillium.models import default_model_path, load_model
from trillium.ops.attention import AttentionMetadata
from trillium.ops.quant_linear import Activations
from trillium.tokenizer import load_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HELD_TEXT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "held_text.txt")
WINDOW = 512
BLOCK_SIZE = 16
EXACT, INT8, INT16 = Activations.EXACT, Activations.INT8, Activations.INT16
# mode -> (weights dtype, quantized, quantized matmuls' activations, KV dtype or None for the weights')
MODES = {
    "exact": (torch.float32, False, EXACT, None),
    "quantized": (torch.float32, True, EXACT, None),
    "quantized-int8": (torch.float32, True, INT8, None),
    "quantized-int16": (torch.float32, True, INT16, None),
    "bf16": (torch.bfloat16, False, EXACT, None),
    "fp32-kv-bf16": (torch.float32, False, EXACT, torch.bfloat16),
    "quantized-kv-bf16": (torch.float32, True, EXACT, torch.bfloat16),  # --kv-cache-dtype bf16
    "quantized-int16-kv-bf16": (torch.float32, True, INT16, torch.bfloat16),
    "auto": (torch.float32, False, EXACT, None),  # resolved per file and CPU: auto_mode()
}
CONTRACT = {"kld": 0.005, "top1": 0.98, "ppl_ratio": 1.01}


@dataclass
class Score:
    """Running sums over scored positions of one mode on one path."""

    nll: float = 0.0
    kld: float = 0.0
    same_top: int = 0
    num: int = 0

    def add(self, logprobs: torch.Tensor, targets: torch.Tensor, exact: torch.Tensor) -> None:
        """``logprobs``, ``exact``: [N, V] log-softmax; ``targets``: [N] next tokens."""
        self.nll -= float(logprobs.gather(1, targets[:, None]).sum())
        self.kld += float((exact.exp() * (exact - logprobs)).sum())
        self.same_top += int((logprobs.argmax(1) == exact.argmax(1)).sum())
        self.num += len(targets)

    def result(self) -> dict[str, float]:
        return {
            "ppl": math.exp(self.nll / self.num),
            "kld": self.kld / self.num,
            "top1": self.same_top / self.num,
            "positions": self.num,
        }


@dataclass
class Runner:
    """One model in one mode, running windows through the paged KV (one request)."""

    model: torch.nn.Module
    kv_dtype: torch.dtype | None
    kv: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self.kv = self.model.allocate_kv_caches(WINDOW // BLOCK_SIZE + 1, BLOCK_SIZE, dtype=self.kv_dtype)
        self.table = list(range(WINDOW // BLOCK_SIZE, -1, -1))  # reversed: exercises the indirection

    @torch.inference_mode()
    def step(self, ids: list[int], start: int) -> torch.Tensor:  # -> [n, V] fp32 log-softmax
        n = len(ids)
        needed = -(-(start + n) // BLOCK_SIZE)
        meta = AttentionMetadata.build([n], [start + n], [self.table[:needed]], BLOCK_SIZE)
        hidden = self.model(torch.tensor(ids), torch.arange(start, start + n), self.kv, meta)
        return torch.log_softmax(self.model.compute_logits(hidden).float(), dim=-1)

    def prefill(self, window: list[int]) -> torch.Tensor:  # [WINDOW/2 - 1, V]: positions half .. end-2
        half = len(window) // 2
        return self.step(window, 0)[half:-1]

    def decode(self, window: list[int]) -> torch.Tensor:  # the same positions, one token per step
        half = len(window) // 2
        self.step(window[:half], 0)  # the context, into the KV cache
        rows = [self.step([window[p]], p) for p in range(half, len(window) - 1)]
        return torch.cat(rows)


def auto_mode(path: str) -> tuple[torch.dtype, bool, int, torch.dtype | None]:
    """What ``trillium serve --model path`` computes with by default, as a MODES entry."""
    config = resolve_weights(EngineConfig(model=path, speculative_config=None), path)
    return config.torch_dtype, config.weights != "dense", weight_activations(config.weights), config.torch_kv_dtype


def load(path: str, mode: str) -> tuple[Runner | None, str | None]:
    dtype, quantized, activations, kv_dtype = auto_mode(path) if mode == "auto" else MODES[mode]
    try:
        model, _ = load_model(path, dtype, progress=False, quantized=quantized, activations=activations)
    except ValueError as exc:
        return None, str(exc)
    return Runner(model, kv_dtype), None


def llama_perplexity(binary: str, model: str, text_path: str, threads: int, chunks: int = 0) -> dict:
    """llama.cpp's own perplexity of the same file on the same text (its tokenizer, 512 context);
    ``chunks`` > 0: only the first that many 512-token windows, as ``--windows`` scores ours."""
    cmd = [binary, "-m", model, "-f", text_path, "-c", str(WINDOW), "-b", str(WINDOW), "-t", str(threads)]
    if chunks > 0:
        cmd += ["--chunks", str(chunks)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    match = re.search(r"Final estimate: PPL = ([0-9.]+)", out.stdout + out.stderr)
    if match is None:
        return {"error": (out.stderr or out.stdout)[-400:]}
    # Recorded without this checkout's location: the model by name, the rest relative to it.
    shown = [os.path.basename(c) if c == model else os.path.relpath(c, ROOT) if os.path.isabs(c) else c for c in cmd]
    return {"ppl": float(match.group(1)), "command": " ".join(shown)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="a GGUF file or HF directory (default: the embedded model)")
    p.add_argument("--text", default=HELD_TEXT)
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    p.add_argument("--windows", type=int, default=0, help="prefill windows to score (0: the whole text)")
    p.add_argument("--decode-windows", type=int, default=2, help="windows also scored one token per step")
    p.add_argument("--llama-perplexity", default=None, help="llama.cpp's llama-perplexity binary")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    path = args.model or default_model_path()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        p.error(f"unknown mode(s) {unknown}; choose from {list(MODES)}")
    if "exact" in modes:
        modes.remove("exact")
    tokenizer = load_tokenizer(path)
    with open(args.text, encoding="utf-8") as f:
        ids = tokenizer.encode(f.read())
    windows = [ids[i : i + WINDOW] for i in range(0, len(ids) - WINDOW + 1, WINDOW)]
    if args.windows:
        windows = windows[: args.windows]
    exact, why = load(path, "exact")
    assert exact is not None, why
    runners: dict[str, Runner] = {}
    results: dict[str, dict] = {}
    for mode in modes:
        runner, why = load(path, mode)
        if runner is None:
            results[mode] = {"skipped": why}
        else:
            runners[mode] = runner
    prefill = {m: Score() for m in ["exact", *runners]}
    decode = {m: Score() for m in ["exact", *runners]}  # "exact": its prefill rows of the same windows
    started = time.monotonic()
    for w, window in enumerate(windows):
        targets = torch.tensor(window[len(window) // 2 + 1 :])
        reference = exact.prefill(window)
        prefill["exact"].add(reference, targets, reference)
        if w < args.decode_windows:
            decode["exact"].add(reference, targets, reference)
        for mode, runner in runners.items():
            prefill[mode].add(runner.prefill(window), targets, reference)
            if w < args.decode_windows:
                decode[mode].add(runner.decode(window), targets, reference)
        print(f"window {w + 1}/{len(windows)} ({time.monotonic() - started:.0f} s)", file=sys.stderr)
    exact_ppl = {"prefill": prefill["exact"].result()["ppl"]}
    results["exact"] = {"prefill": prefill["exact"].result()}
    if decode["exact"].num:
        exact_ppl["decode"] = decode["exact"].result()["ppl"]
    for mode in runners:
        entry = {"prefill": prefill[mode].result()}
        if decode[mode].num:
            entry["decode"] = decode[mode].result()
        for path_name, score in entry.items():
            score["ppl_ratio"] = score["ppl"] / exact_ppl[path_name]
            score["meets_contract"] = (
                score["kld"] <= CONTRACT["kld"]
                and score["top1"] >= CONTRACT["top1"]
                and score["ppl_ratio"] <= CONTRACT["ppl_ratio"]
            )
        results[mode] = entry
    record = {
        "bench": "quality",
        "command": " ".join(["bench/quality.py", *sys.argv[1:]]),
        "model": os.path.basename(path.rstrip("/")),
        "text": os.path.basename(args.text),
        "num_tokens": len(ids),
        "windows": len(windows),
        "decode_windows": min(args.decode_windows, len(windows)),
        "machine": describe(),
        "modes": results,
    }
    if args.llama_perplexity:
        record["llama.cpp"] = llama_perplexity(args.llama_perplexity, path, args.text, args.threads, args.windows)
    print(json.dumps(record, indent=1))
    print(f"\n{'mode':<16}{'path':<9}{'ppl':>9}{'x exact':>9}{'KLD':>10}{'top1':>8}  contract", file=sys.stderr)
    for mode, entry in results.items():
        if "skipped" in entry:
            print(f"{mode:<16}skipped: {entry['skipped']}", file=sys.stderr)
            continue
        for path_name, s in entry.items():
            ok = {True: "met", False: "NOT met"}.get(s.get("meets_contract"), "-")  # type: ignore[call-overload]
            ratio = s.get("ppl_ratio", 1.0)
            print(
                f"{mode:<16}{path_name:<9}{s['ppl']:>9.3f}{ratio:>9.4f}{s['kld']:>10.5f}{s['top1']:>8.4f}  {ok}",
                file=sys.stderr,
            )


if __name__ == "__main__":
    main()
