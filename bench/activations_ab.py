"""Exact fp32 vs int16 activations, end to end in one process: decode tokens/s and prefill
tokens/s of the same model with ``--weights quantized`` and ``--weights quantized-int16``, the two
engines alternating round by round (a shared machine drifts; the best round of each is kept).

    python bench/activations_ab.py                          # the default model, 1 and 32 streams
    python bench/activations_ab.py --model FILE.gguf --batch 1 4 --max-tokens 32

One JSON object: per batch size, each mode's best decode ms per step and tokens/s, the prefill
tokens/s of ``--prompt-tokens``-word prompts of random common words (one per stream), and int16 / exact ratios;
with the machine record (bench/machine.py).

Caveat: two engines in one process are two step threads, so two OpenMP teams on the same cores;
libgomp then cuts its spin-wait, which distorts 1-row steps. On a 2-core Zen 5 this reported int16
at 0.77x exact at batch 1 where one process per mode measured 1.11x
(bench/history/2026-12-02-int16-on-avx512-and-the-zen5-targets.md): trust its many-row figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import describe
from trillium import LLM, SamplingParams

MODES = ("quantized", "quantized-int16")


WORDS = "the of and to in is was for on that with as by at from his her an were which are this be".split()


def timed(llm: LLM, prompts: list[str], max_tokens: int) -> float:
    """Seconds to generate ``max_tokens`` tokens (``ignore_eos``) for every prompt at once."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    llm.generate(prompts, params)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--batch", type=int, nargs="*", default=[1, 32])
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    llms = {
        m: LLM(model=args.model, weights=m, speculative_config=None, enable_prefix_cache=False, progress=False)
        for m in MODES
    }
    gen = torch.Generator().manual_seed(0)
    command = " ".join(["bench/activations_ab.py", *sys.argv[1:]])
    out = {"bench": "activations_ab", "command": command, "machine": describe(), "model": args.model or "default"}
    out["rows"] = []
    for batch in args.batch:
        # ~prompt_tokens tokens of random common words each (one token per word), different per stream
        prompts = [
            " ".join(WORDS[i] for i in torch.randint(0, len(WORDS), (args.prompt_tokens,), generator=gen).tolist())
            for _ in range(batch)
        ]
        best = {m: {"prefill_s": 1e9, "total_s": 1e9} for m in MODES}
        for _ in range(args.rounds):
            for m in MODES:
                best[m]["prefill_s"] = min(best[m]["prefill_s"], timed(llms[m], prompts, 1))
                best[m]["total_s"] = min(best[m]["total_s"], timed(llms[m], prompts, args.max_tokens + 1))
        row = {"batch": batch}
        for m in MODES:
            decode_s = best[m]["total_s"] - best[m]["prefill_s"]
            row[m] = {
                "prefill_tok_s": round(batch * args.prompt_tokens / best[m]["prefill_s"], 1),
                "decode_ms_per_step": round(1000 * decode_s / args.max_tokens, 2),
                "decode_tok_s": round(batch * args.max_tokens / decode_s, 1),
            }
        row["int16_over_exact_decode"] = round(row[MODES[1]]["decode_tok_s"] / row[MODES[0]]["decode_tok_s"], 3)
        row["int16_over_exact_prefill"] = round(row[MODES[1]]["prefill_tok_s"] / row[MODES[0]]["prefill_tok_s"], 3)
        out["rows"].append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
