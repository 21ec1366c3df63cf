"""Block-quantized linear (``_core.quant_linear``) vs torch's fp32 ``F.linear`` on the dense weight.

The shapes of SmolLM2-135M's projections (4-bit) and its tied output head (8-bit), at the row
counts of decode batches and of prefill. One JSON line per configuration:
``op, rows, out_features, in_features, bits, trillium_us, torch_us, speedup, gops, int8_us,
int16_us, int16_speedup`` (trillium_us: the exact fp32-activation mode; int8_us and int16_us: the
activations rounded per 32-block, ``Activations.INT8`` / ``INT16``; int16_speedup: exact / int16).
``--model qwen2.5-1.5b`` takes Qwen2.5-Coder-1.5B's shapes instead; ``--bits`` overrides every
shape's code width (6: Q6_K's).

    python bench/kernels/quant_linear.py            # full table
    python bench/kernels/quant_linear.py --quick    # smoke mode (seconds)
    python bench/kernels/quant_linear.py --isa avx512 --rows 1 6 32 256   # without VNNI
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from trillium import _core
from trillium.ops.quant_linear import Activations, QuantWeight, quant_linear

SHAPES = [  # (name, N, K, bits)
    ("qkv_proj", 960, 576, 4),
    ("o_proj", 576, 576, 4),
    ("gate_up_proj", 3072, 576, 4),
    ("down_proj", 576, 1536, 4),
    ("lm_head", 49152, 576, 8),
]
SHAPES_1_5B = [
    ("qkv_proj", 2048, 1536, 4),
    ("o_proj", 1536, 1536, 4),
    ("gate_up_proj", 17920, 1536, 4),
    ("down_proj", 1536, 8960, 6),
    ("lm_head", 151936, 1536, 6),
]


def timeit(fn, min_seconds: float) -> float:
    fn()
    calls, start = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds and calls >= 3:
            return elapsed / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smoke mode: two shapes, short timings")
    parser.add_argument("--rows", type=int, nargs="*", default=[1, 16, 32, 256])
    parser.add_argument("--layers", type=int, default=30, help="distinct weights per shape, cycled (default: 30)")
    parser.add_argument("--model", choices=["smollm2-135m", "qwen2.5-1.5b"], default="smollm2-135m")
    parser.add_argument("--bits", type=int, choices=[4, 5, 6, 8], default=None, help="every shape's code width")
    parser.add_argument("--ops", nargs="*", default=None, help="only these ops (default: all)")
    parser.add_argument(
        "--isa", default=None, help="force a kernel ISA (avx2, avx512, avx512vnni; default: the best here)"
    )
    args = parser.parse_args()
    if args.isa:
        _core.set_kernel_isa(args.isa)
    shapes = SHAPES_1_5B if args.model == "qwen2.5-1.5b" else SHAPES
    shapes = shapes[:2] if args.quick else shapes
    if args.bits:
        shapes = [(name, n, k, args.bits) for name, n, k, _ in shapes]
    if args.ops:
        shapes = [shape for shape in shapes if shape[0] in args.ops]
    rows_list = [1, 16] if args.quick else args.rows
    min_seconds = 0.02 if args.quick else 0.3
    gen = torch.Generator().manual_seed(0)
    print(json.dumps({"kernel_isa": _core.kernel_isa(), "threads": torch.get_num_threads()}))
    for name, n, k, bits in shapes:
        low, high = (-128, 128) if bits == 8 else (0, 1 << bits)
        codes = torch.randint(low, high, (n, k), generator=gen).to(torch.int8)
        per = 16 if bits == 6 else 32
        scale = torch.rand(n, k // per, generator=gen) * 0.02
        mins = None if bits in (6, 8) else torch.rand(n, k // per, generator=gen) * 0.01
        # One weight per layer, as in the model: a step streams every layer's weights from memory,
        # so timing one matrix that stays in cache would flatter the 4x larger dense weights.
        copies = 1 if name == "lm_head" or args.quick else max(1, min(args.layers, 64_000_000 // (n * k)))
        weights = [QuantWeight.pack(codes, scale, mins, bits) for _ in range(copies)]
        # The dense model's layout: [out, in] seen through a column-major copy (models/llama.py).
        denses = [torch.randn(n, k, generator=gen).t().contiguous().t() for _ in range(copies)]
        for rows in rows_list:
            x = torch.randn(rows, k, generator=gen)

            def each(fn, copies=copies):
                def run():
                    for i in range(copies):
                        fn(i)

                return run

            ours = timeit(each(lambda i, x=x, w=weights: quant_linear(x, w[i])), min_seconds) / copies
            int8 = (
                timeit(each(lambda i, x=x, w=weights: quant_linear(x, w[i], activations=Activations.INT8)), min_seconds)
                / copies
                if bits in (4, 8)
                else float("nan")
            )
            int16 = (
                timeit(
                    each(lambda i, x=x, w=weights: quant_linear(x, w[i], activations=Activations.INT16)), min_seconds
                )
                / copies
            )
            theirs = timeit(each(lambda i, x=x, d=denses: F.linear(x, d[i])), min_seconds) / copies
            print(
                json.dumps(
                    {
                        "op": name,
                        "rows": rows,
                        "out_features": n,
                        "in_features": k,
                        "bits": bits,
                        "trillium_us": round(ours * 1e6, 1),
                        "torch_us": round(theirs * 1e6, 1),
                        "speedup": round(theirs / ours, 2),
                        "gops": round(2 * rows * n * k / ours / 1e9, 1),
                        "int8_us": round(int8 * 1e6, 1),
                        "int16_us": round(int16 * 1e6, 1),
                        "int16_speedup": round(ours / int16, 2),
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
