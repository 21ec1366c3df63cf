"""Where a decode step's time goes: wall-clock per generated token, split by operation.

    python bench/decode_profile.py                      # 1 stream, 64 tokens, 2 rounds
    python bench/decode_profile.py --batch 32 --weights dense --dtype fp32
    python bench/decode_profile.py --batch 32 --temperature 0.8 --top-p 0.95
    python bench/decode_profile.py --model FILE.gguf --temperature 0

Wraps the model's operations (projections, RMSNorm, RoPE, KV store, paged attention, SiLU-mul,
the whole forward and the output head) with timers, generates ``--max-tokens`` tokens
(``ignore_eos``, the given temperature / top-p / top-k) for ``--batch`` prompts through ``LLM`` and prints one JSON line per round:
ms per generated token for each operation (summed over the batch's steps, divided by the
tokens generated) and its mean µs per call. ``outside_model_ms`` is the wall time not spent in
the forward pass or the head: metadata, sampling, the scheduler, the thread hop, detokenizing.
The timers add a few µs per call; compare rounds with each other, not with unwrapped runs.
"""

from __future__ import annotations

import argparse
import collections
import json
import time

import trillium.models.llama as llama
from trillium import LLM, SamplingParams

OPS = ("rotate_", "store_kv", "paged_attention", "silu_and_mul")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a GGUF file or Hugging Face directory (default: the embedded model)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--weights", default="auto")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument(
        "--speculative-config", default="off", help="off (default: one token per step is what is profiled) or JSON"
    )
    args = p.parse_args()

    seconds: collections.Counter = collections.Counter()
    calls: collections.Counter = collections.Counter()

    def timed(name, fn):
        def wrapper(*a, **k):
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                seconds[name] += time.perf_counter() - start
                calls[name] += 1

        return wrapper

    for name in OPS:  # module-level functions the layers call
        setattr(llama, name, timed(name, getattr(llama, name)))
    for cls, name in ((llama.QuantLinear, "projections"), (llama.RMSNorm, "rms_norm")):
        cls.forward = timed(name, cls.forward)
    llm = LLM(
        args.model,
        dtype=args.dtype,
        weights=args.weights,
        progress=False,
        speculative_config=args.speculative_config,
    )
    model = llm.engine.runner.model
    if not any(isinstance(m, llama.QuantLinear) for m in model.modules()):
        for m in model.modules():  # dense weights: time the nn.Linear projections instead
            if isinstance(m, llama.nn.Linear):
                m.forward = timed("projections", m.forward)
    model.forward = timed("forward", model.forward)
    model.compute_logits = timed("output_head", model.compute_logits)
    prompts = [f"Tell me a story about dragon number {i}." for i in range(args.batch)]
    llm.generate(prompts[:1], SamplingParams(max_tokens=4))  # warm up
    for r in range(args.rounds):
        seconds.clear()
        calls.clear()
        start = time.perf_counter()
        outs = llm.generate(
            prompts,
            SamplingParams(
                max_tokens=args.max_tokens,
                ignore_eos=True,
                temperature=args.temperature,
                top_p=args.top_p,
                top_k=args.top_k,
            ),
        )
        wall = time.perf_counter() - start
        tokens = sum(len(o.token_ids) for o in outs)
        per_token = {k: round(1e3 * v / tokens, 3) for k, v in sorted(seconds.items())}
        per_call = {k: round(1e6 * v / calls[k], 1) for k, v in sorted(seconds.items())}
        outside = wall - seconds["forward"] - seconds["output_head"]
        print(
            json.dumps(
                {
                    "round": r,
                    "batch": args.batch,
                    "tokens": tokens,
                    "wall_ms_per_token": round(1e3 * wall / tokens, 3),
                    "outside_model_ms": round(1e3 * outside / tokens, 3),
                    "ms_per_token": per_token,
                    "us_per_call": per_call,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
