"""Offline throughput: trillium's ``LLM.generate`` vs Hugging Face transformers' static-batch
``generate`` (the naive baseline), same prompts, same model weights, same run.

    python bench/hf_offline.py --num-prompts 32 --max-tokens 64      # --quick: smoke mode

HF runs the GGUF as transformers dequantizes it (fp32), batches of ``--hf-batch`` prompts left-
padded, greedy, ``min_new_tokens = max_new_tokens`` so every sequence produces exactly
``--max-tokens`` tokens (the same as trillium's ``ignore_eos``). Prints one JSON line per engine
and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))
from serving_client import DATA, load_prompts  # noqa: E402


def run_trillium(prompts: list[str], max_tokens: int) -> dict:
    from trillium import LLM, SamplingParams

    llm = LLM(progress=False)
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(max_tokens=4, temperature=0))  # warm-up
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    wall = time.perf_counter() - start
    tokens = sum(len(o.token_ids) for o in outs)
    return {"engine": "trillium", "output_tokens": tokens, "wall_s": round(wall, 2), "tok_s": round(tokens / wall, 1)}


def load_hf(dtype: torch.dtype, device: str = "cpu") -> tuple:
    """(tokenizer padding on the left, model in eval mode on ``device``): the embedded GGUF as
    transformers dequantizes it (tests/hf_oracle.py's cached copy)."""
    from pathlib import Path

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.hf_oracle import reference_dir
    from trillium.models.registry import default_model_path

    cache = Path(ROOT) / ".pytest_cache"
    cache.mkdir(exist_ok=True)
    folder = reference_dir(cache, default_model_path())
    tok = AutoTokenizer.from_pretrained(folder)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok, AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()


def run_hf(prompts: list[str], max_tokens: int, batch: int) -> dict:
    tok, model = load_hf(torch.float32)
    tokens, start = 0, time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(prompts), batch):
            enc = tok(prompts[i : i + batch], return_tensors="pt", padding=True, truncation=True, max_length=1024)
            out = model.generate(
                **enc,
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
            )
            tokens += (out.shape[1] - enc["input_ids"].shape[1]) * out.shape[0]
    wall = time.perf_counter() - start
    return {
        "engine": "hf-transformers",
        "output_tokens": tokens,
        "wall_s": round(wall, 2),
        "tok_s": round(tokens / wall, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--hf-batch", type=int, default=32)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    if args.quick:
        args.num_prompts, args.max_tokens, args.hf_batch = 2, 4, 2
    prompts = load_prompts(DATA, args.num_prompts, 0, seed=0)
    ours = run_trillium(prompts, args.max_tokens)
    print(json.dumps(ours), flush=True)
    theirs = run_hf(prompts, args.max_tokens, args.hf_batch)
    print(json.dumps(theirs), flush=True)
    print(json.dumps({"ratio_trillium_over_hf": round(ours["tok_s"] / theirs["tok_s"], 2)}))


if __name__ == "__main__":
    main()
