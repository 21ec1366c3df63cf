"""Offline decode speed of the default model in each dtype / weight format, same run.

    python bench/offline_formats.py                       # bf16 dense vs fp32 quantized, 2 rounds
    python bench/offline_formats.py --formats fp32:dense fp32:quantized --rounds 1

Each format loads the model through ``LLM`` and generates 64 tokens (``ignore_eos``) for one
prompt, then for 32 prompts at once; formats alternate for ``--rounds`` rounds so that drift on
a shared machine falls on all of them. Prints one JSON line per (round, format). Used to choose
what ``--dtype auto`` / ``--weights auto`` resolve to.
"""

from __future__ import annotations

import argparse
import json
import time

from trillium import LLM, SamplingParams


def measure(dtype: str, weights: str, max_tokens: int, batch: int) -> dict:
    llm = LLM(dtype=dtype, weights=weights, progress=False)
    llm.generate("hi", SamplingParams(max_tokens=4))  # warm up
    sampling = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    llm.generate("Tell me a story about a dragon.", sampling)
    one = time.perf_counter() - start
    prompts = [f"Write a poem about the number {i}." for i in range(batch)]
    start = time.perf_counter()
    llm.generate(prompts, sampling)
    many = time.perf_counter() - start
    return {
        "dtype": dtype,
        "weights": weights,
        "tok_s_1": round(max_tokens / one, 1),
        f"tok_s_{batch}": round(batch * max_tokens / many, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--formats",
        nargs="+",
        default=["bf16:dense", "fp32:quantized"],
        help="dtype:weights pairs (weights: dense, quantized, quantized-int8, auto)",
    )
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    args = p.parse_args()
    for r in range(args.rounds):
        for fmt in args.formats:
            dtype, _, weights = fmt.partition(":")
            print(
                json.dumps({"round": r, **measure(dtype, weights or "auto", args.max_tokens, args.batch)}), flush=True
            )


if __name__ == "__main__":
    main()
