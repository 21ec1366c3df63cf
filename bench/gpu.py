"""trillium on a CUDA GPU, same run: the paged-attention kernel against SDPA, and the engine
against Hugging Face transformers' ``generate`` on the same model.

    python bench/gpu.py attention --out A.json   # kernel vs torch SDPA, bandwidth fraction
    python bench/gpu.py e2e --out E.json         # decode tok/s at 1/32/256 streams, 2k prefill
    python bench/gpu.py e2e --quick              # smoke mode (a few tokens; still needs a GPU)

``attention``: one decode step (one query token per request) of ``batch`` requests over
``context`` cached tokens each, bf16, blocks scattered through the pool. trillium's kernel reads
K/V through the block table; the baseline is ``scaled_dot_product_attention`` over K/V already
gathered into contiguous [B, H, context, D] tensors (its time excludes the gather; "sdpa_gather_us"
includes it). "kv_gbps" is the K/V bytes a call must read over the kernel's time, and
"bandwidth_fraction" that over the GPU's measured copy bandwidth (a large device-to-device copy,
bytes read plus written over its time). Shapes: the served model's (9 query heads, 3 KV heads,
head dim 64) and a Llama-3-8B-like layer (32/8/128).

``e2e``: the embedded model in bf16 on the GPU. trillium: the offline ``LLM`` (the same
scheduler, actors and sampler as the server; CUDA graphs on, speculation off, since ``generate``
has none); HF: ``generate`` on one batch, greedy, ``min_new_tokens = max_new_tokens``, from the
same GGUF as transformers dequantizes it. Decode: N prompts of a short instruction, 128 new tokens
each (``ignore_eos``), output tokens over wall time. Prefill: 16 distinct prompts of ~2048 tokens,
one new token, prompt tokens over wall time (HF: one forward of the same batch).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


# ------------------------------------------------------------------------------------ attention
def copy_bandwidth_gbps() -> float:
    """Device-to-device copy of 1 GiB: bytes read + written per second (best of 10)."""
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return 2 * src.numel() / best / 1e9


def cuda_us(fn, reps: int = 50) -> float:
    """Median time of fn() on the GPU in microseconds (CUDA events around each call)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def attention_case(batch: int, context: int, hq: int, hkv: int, d: int, copy_gbps: float) -> dict:
    import torch.nn.functional as F

    from trillium.ops.attention import AttentionMetadata, paged_attention

    bs = 16
    blocks_per = -(-context // bs)
    num_blocks = batch * blocks_per + 1
    k_cache = torch.randn(num_blocks, bs, hkv, d, dtype=torch.bfloat16, device="cuda")
    v_cache = torch.randn_like(k_cache)
    order = torch.randperm(num_blocks - 1).add_(1).tolist()  # scattered, block 0 unused
    tables = [order[r * blocks_per : (r + 1) * blocks_per] for r in range(batch)]
    meta = AttentionMetadata.build([1] * batch, [context] * batch, tables, bs, "cuda")
    q = torch.randn(batch, hq, d, dtype=torch.bfloat16, device="cuda")
    out = torch.empty_like(q)
    scale = d**-0.5
    ours = cuda_us(lambda: paged_attention(q, k_cache, v_cache, meta, scale, out=out))

    idx = torch.tensor(tables, device="cuda")  # [B, blocks]

    def gather() -> tuple[torch.Tensor, torch.Tensor]:
        k = k_cache[idx].reshape(batch, blocks_per * bs, hkv, d)[:, :context].transpose(1, 2)
        v = v_cache[idx].reshape(batch, blocks_per * bs, hkv, d)[:, :context].transpose(1, 2)
        return k.contiguous(), v.contiguous()

    k, v = gather()
    qs = q.unsqueeze(2)  # [B, Hq, 1, D]

    def sdpa(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(qs, k, v, scale=scale, enable_gqa=hq != hkv)

    theirs = cuda_us(lambda: sdpa(k, v))
    theirs_gather = cuda_us(lambda: sdpa(*gather()))
    ref = sdpa(k, v).squeeze(2)
    err = float((out.float() - ref.float()).abs().max())
    kv_bytes = 2 * batch * context * hkv * d * 2
    gbps = kv_bytes / (ours / 1e6) / 1e9
    return {
        "op": "paged_attention_decode",
        "heads": f"{hq}/{hkv}x{d}",
        "batch": batch,
        "context": context,
        "trillium_us": round(ours, 1),
        "sdpa_us": round(theirs, 1),
        "sdpa_gather_us": round(theirs_gather, 1),
        "speedup_vs_sdpa": round(theirs / ours, 2),
        "kv_gbps": round(gbps, 1),
        "bandwidth_fraction": round(gbps / copy_gbps, 3),
        "max_abs_err": round(err, 4),
    }


def run_attention(quick: bool) -> list[dict]:
    copy = copy_bandwidth_gbps()
    rows: list[dict] = [{"op": "copy_bandwidth", "gbps": round(copy, 1), "device": torch.cuda.get_device_name()}]
    print(json.dumps(rows[0]), flush=True)
    contexts = [512, 2048] if quick else [512, 2048, 4096, 8192]
    batches = [1, 32] if quick else [1, 32, 128]
    for hq, hkv, d in [(9, 3, 64), (32, 8, 128)]:
        for batch in batches:
            for context in contexts:
                row = attention_case(batch, context, hq, hkv, d, copy)
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


# ------------------------------------------------------------------------------------ e2e
def decode_prompts(n: int) -> list[str]:
    return [f"Write a long story about a lighthouse keeper named Keeper{i} and the sea." for i in range(n)]


def prefill_prompts(n: int, approx_tokens: int) -> list[str]:
    body = " ".join(f"Sentence {j} says that the weather was calm and the sea was blue." for j in range(400))
    words = body.split()
    # ~1.25 tokens per word here; a unique opening so the prefix cache shares nothing
    return [f"Document {i}. " + " ".join(words[: int(approx_tokens / 1.25)]) for i in range(n)]


def run_trillium(streams: list[int], max_tokens: int, prefill_n: int, prefill_len: int) -> list[dict]:
    from trillium import LLM, SamplingParams

    llm = LLM(
        device="cuda",
        progress=False,
        speculative_config="off",
        max_running=max(streams),
        kv_cache_gib=8,
        max_tokens_per_step=max(2048, prefill_len + 64),
    )
    rows = []
    llm.generate(decode_prompts(2), SamplingParams(max_tokens=4, temperature=0))  # warm-up
    for n in streams:
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        start = time.perf_counter()
        outs = llm.generate(decode_prompts(n), params)
        wall = time.perf_counter() - start
        tokens = sum(len(o.token_ids) for o in outs)
        rows.append({"engine": "trillium", "phase": "decode", "streams": n, "output_tokens": tokens,
                     "wall_s": round(wall, 3), "tok_s": round(tokens / wall, 1)})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    prompts = prefill_prompts(prefill_n, prefill_len)
    start = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(max_tokens=1, temperature=0))
    wall = time.perf_counter() - start
    tokens = sum(len(o.prompt_token_ids) for o in outs)
    rows.append({"engine": "trillium", "phase": "prefill", "prompts": prefill_n, "prompt_tokens": tokens,
                 "wall_s": round(wall, 3), "tok_s": round(tokens / wall, 1)})  # fmt: skip
    print(json.dumps(rows[-1]), flush=True)
    llm.engine.close()
    return rows


def run_hf(streams: list[int], max_tokens: int, prefill_n: int, prefill_len: int) -> list[dict]:
    from hf_offline import load_hf

    tok, model = load_hf(torch.bfloat16, "cuda")
    rows = []

    def generate(prompts: list[str], new: int) -> tuple[int, int, float]:
        enc = tok(prompts, return_tensors="pt", padding=True).to("cuda")
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(**enc, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                 pad_token_id=tok.pad_token_id)  # fmt: skip
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
        return int(enc["attention_mask"].sum()), (out.shape[1] - enc["input_ids"].shape[1]) * out.shape[0], wall

    generate(decode_prompts(2), 4)  # warm-up
    for n in streams:
        _, tokens, wall = generate(decode_prompts(n), max_tokens)
        rows.append({"engine": "hf-transformers", "phase": "decode", "streams": n, "output_tokens": tokens,
                     "wall_s": round(wall, 3), "tok_s": round(tokens / wall, 1)})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    prompt_tokens, _, wall = generate(prefill_prompts(prefill_n, prefill_len), 1)
    rows.append({"engine": "hf-transformers", "phase": "prefill", "prompts": prefill_n, "prompt_tokens": prompt_tokens,
                 "wall_s": round(wall, 3), "tok_s": round(prompt_tokens / wall, 1)})  # fmt: skip
    print(json.dumps(rows[-1]), flush=True)
    return rows


def run_engine(engine: str, quick: bool) -> list[dict]:
    """One engine's rows, measured in a process of its own (one engine at a time: the other's
    threads and GPU memory are gone)."""
    import subprocess

    cmd = [sys.executable, __file__, "engine", "--engine", engine] + (["--quick"] if quick else [])
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    for row in rows:
        print(json.dumps(row), flush=True)
    if done.returncode != 0:
        sys.exit(f"{engine} failed:\n{done.stderr[-3000:]}")
    return rows


def run_e2e(quick: bool) -> list[dict]:
    ours = run_engine("trillium", quick)
    theirs = run_engine("hf", quick)
    ratios = []
    for a, b in zip(ours, theirs):
        key = f"{a['phase']}@{a.get('streams', a.get('prompts'))}"
        ratios.append({"ratio_trillium_over_hf": key, "value": round(a["tok_s"] / b["tok_s"], 2)})
        print(json.dumps(ratios[-1]), flush=True)
    return ours + theirs + ratios


def e2e_sizes(quick: bool) -> tuple[list[int], int, int, int]:
    """(streams, new tokens per stream, prefill prompts, prefill prompt tokens)."""
    return ([1, 4], 8, 2, 256) if quick else ([1, 32, 256], 128, 16, 2048)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["attention", "e2e", "engine"])
    p.add_argument("--engine", choices=["trillium", "hf"], help="engine: which one (run by e2e)")
    p.add_argument("--quick", action="store_true", help="smoke mode: a few small cases")
    p.add_argument("--out", default=None, help="write the rows here as JSON")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/gpu.py needs a CUDA GPU")
    if args.what == "engine":
        run = run_trillium if args.engine == "trillium" else run_hf
        run(*e2e_sizes(args.quick))
        return
    rows = run_attention(args.quick) if args.what == "attention" else run_e2e(args.quick)
    if args.out:
        meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "command": " ".join(sys.argv)}
        Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
