"""Decode step: the eager model vs the custom-operator forward, eager and ``torch.compile``d.

    TORCHINDUCTOR_CACHE_DIR=/tmp/ind python bench/compiled_decode.py          # cold compile
    TORCHINDUCTOR_CACHE_DIR=/tmp/ind python bench/compiled_decode.py          # again: warm
    python bench/compiled_decode.py --weights dense --mode max-autotune-no-cudagraphs

Prints JSON lines: ``load`` (model load seconds), ``compile`` (seconds to compile, or load from
inductor's on-disk caches, each batch bucket), ``check`` (greedy tokens of a few prompts decoded
eagerly and compiled, in a half-padded bucket), then one ``step`` line per batch size: median ms
of one decode forward + compute_logits at ``--context`` tokens of context for

    eager      LlamaForCausalLM.forward + compute_logits, per operation (``fused_layers`` off)
    stack      the same with ``fused_layers`` on: every decoder layer in one core call
    op_eager   models.compiled.decode_forward uncompiled (the torch.ops.trillium.* operators)
    compiled   decode_forward through torch.compile (inductor, dynamic=False)

    kernels    only the C++ kernel calls of one ``eager`` step, replayed (a floor, see kernel_replay)

and the input preparation each needs (AttentionMetadata.build vs CompiledDecoder.prepare), not
included in the step times. Variants alternate in short rounds so load from other processes on
the machine hits them alike.

Everything (load, compile, steps) runs on the main thread: libgomp keeps one OpenMP team per
thread that opens a parallel region, and two teams on a small machine make each step ~1.5x
slower (see trillium/engine/step_thread.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from trillium import _core
from trillium.models import default_model_path, load_model
from trillium.models.compiled import CompiledDecoder
from trillium.ops.attention import AttentionMetadata
from trillium.tokenizer import load_tokenizer

BLOCK_SIZE = 16
KERNELS = ("quant_linear", "store_kv", "paged_attention", "rms_norm", "silu_and_mul", "rotary_inplace")
PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "def fibonacci(n):",
    "Once upon a time, in a village by the mountains,",
]


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--context", type=int, default=300)
    p.add_argument("--weights", choices=("quantized", "dense"), default="quantized")
    p.add_argument("--mode", default=None, help="torch.compile mode (default: inductor's default)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps-per-round", type=int, default=10)
    p.add_argument("--check-steps", type=int, default=16)
    args = p.parse_args()
    batches = [int(b) for b in args.batches.split(",")]

    path = default_model_path()
    start = time.perf_counter()
    model, cfg = load_model(path, dtype=torch.float32, progress=False, quantized=args.weights == "quantized")
    emit(
        event="load",
        seconds=round(time.perf_counter() - start, 2),
        weights=args.weights,
        threads=torch.get_num_threads(),
    )
    width = -(-cfg.max_position_embeddings // BLOCK_SIZE)
    blocks_per_request = -(-(args.context + args.check_steps + 64) // BLOCK_SIZE)
    num_blocks = 1 + max(batches) * blocks_per_request
    kv_caches = model.allocate_kv_caches(num_blocks, BLOCK_SIZE, torch.float32)

    compiled = CompiledDecoder(model, kv_caches, BLOCK_SIZE, width, buckets=batches, mode=args.mode)
    again = CompiledDecoder(model, kv_caches, BLOCK_SIZE, width, buckets=batches, mode=args.mode)
    op_eager = CompiledDecoder(model, kv_caches, BLOCK_SIZE, width, buckets=batches, compile=False)
    seconds = compiled.warm_up()
    emit(
        event="compile",
        cache_dir=os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
        mode=args.mode,
        seconds={b: round(s, 2) for b, s in seconds.items()},
        # the same graphs again in this process: dynamo traces, inductor's caches answer
        again_seconds={b: round(s, 2) for b, s in again.warm_up().items()},
    )

    check(model, compiled, load_tokenizer(path), args.check_steps, blocks_per_request)

    gen = torch.Generator().manual_seed(0)
    for batch in batches:
        perm = (torch.randperm(num_blocks - 1, generator=gen) + 1)[: batch * blocks_per_request]
        tables = perm.view(batch, blocks_per_request).tolist()
        ids = torch.randint(0, cfg.vocab_size, (batch,), generator=gen).tolist()
        positions = [args.context - 1] * batch
        times = time_step(model, kv_caches, compiled, op_eager, ids, positions, tables, args)
        speedup = round(times["eager_ms"] / times["compiled_ms"], 3)
        emit(event="step", batch=batch, context=args.context, **times, speedup=speedup)


def time_step(model, kv_caches, compiled, op_eager, ids, positions, tables, args) -> dict[str, float]:
    """Median ms per step of each variant (inputs prepared once), and of preparing the inputs."""

    def build_meta():
        meta = AttentionMetadata.build([1] * len(ids), [p + 1 for p in positions], tables, BLOCK_SIZE)
        return meta, torch.tensor(ids), torch.tensor(positions)

    meta, ids_t, pos_t = build_meta()
    inputs = compiled.prepare(ids, positions, tables)

    def eager(fused_layers: bool):
        def step() -> None:
            model.fused_layers = fused_layers
            with torch.inference_mode():
                model.compute_logits(model(ids_t, pos_t, kv_caches, meta))

        return step

    variants = {
        "eager": eager(False),
        "stack": eager(True),
        "op_eager": lambda: op_eager.run(inputs),
        "compiled": lambda: compiled.run(inputs),
        "kernels": kernel_replay(eager(False)),
        "prepare_eager": build_meta,
        "prepare_compiled": lambda: compiled.prepare(ids, positions, tables),
    }
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for fn in variants.values():
        fn()  # warm-up
    for _ in range(args.rounds):
        for name, fn in variants.items():
            for _ in range(args.steps_per_round):
                t = time.perf_counter()
                fn()
                samples[name].append(time.perf_counter() - t)
    return {f"{name}_ms": round(1e3 * statistics.median(s), 3) for name, s in samples.items()}


class _KeepAlive(TorchDispatchMode):
    """Holds every tensor created under it, so that addresses recorded meanwhile stay valid."""

    def __init__(self) -> None:
        super().__init__()
        self.outputs: list[object] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.outputs.append(out)
        return out


def kernel_replay(step):
    """Run ``step`` once, recording its ``_core`` kernel calls; return a function that replays only
    those calls (same addresses, the tensors kept alive): the kernels' own time plus one pybind call
    each -- the floor that removing the Python around them could reach."""
    calls = []
    originals = {name: getattr(_core, name) for name in KERNELS}

    def recorder(fn):
        def record(*args):
            calls.append((fn, args))
            return fn(*args)

        return record

    keep = _KeepAlive()
    try:
        for name, fn in originals.items():
            setattr(_core, name, recorder(fn))
        with keep:
            step()
    finally:
        for name, fn in originals.items():
            setattr(_core, name, fn)

    def replay() -> None:
        for fn, args in calls:
            fn(*args)

    replay.keep_alive = keep.outputs
    return replay


def check(model, compiled, tokenizer, num_steps: int, blocks_per_request: int) -> None:
    """Prefill each prompt eagerly, then decode ``num_steps`` greedy tokens for all of them in one
    batch, once with the eager model and once compiled from the same KV; report both."""
    kv_caches = compiled.kv_caches
    model.fused_layers = False  # the per-operation path the custom operators mirror
    prompts = [tokenizer.encode(text) for text in PROMPTS[: compiled.buckets[-1]]]
    tables = [list(range(1 + r * blocks_per_request, 1 + (r + 1) * blocks_per_request)) for r in range(len(prompts))]
    first = []
    with torch.inference_mode():
        for ids, table in zip(prompts, tables):
            n = len(ids)
            meta = AttentionMetadata.build([n], [n], [table], BLOCK_SIZE)
            hidden = model(torch.tensor(ids), torch.arange(n), kv_caches, meta)
            first.append(int(model.compute_logits(hidden[-1:]).argmax()))
        saved = [(k.clone(), v.clone()) for k, v in kv_caches]

        def decode(step_fn) -> tuple[list[list[int]], float]:
            for (k, v), (k0, v0) in zip(kv_caches, saved):
                k.copy_(k0)
                v.copy_(v0)
            tokens, positions = list(first), [len(ids) for ids in prompts]
            out = [[t] for t in tokens]
            logits_seen = []
            for _ in range(num_steps):
                logits = step_fn(tokens, positions)
                logits_seen.append(logits)
                tokens = logits.argmax(-1).tolist()
                positions = [p + 1 for p in positions]
                for o, t in zip(out, tokens):
                    o.append(t)
            return out, torch.stack(logits_seen)

        def eager_step(tokens, positions):
            meta = AttentionMetadata.build([1] * len(tokens), [p + 1 for p in positions], tables, BLOCK_SIZE)
            return model.compute_logits(model(torch.tensor(tokens), torch.tensor(positions), kv_caches, meta))

        eager_tokens, eager_logits = decode(eager_step)
        compiled_tokens, compiled_logits = decode(lambda tokens, positions: compiled.step(tokens, positions, tables))
    emit(
        event="check",
        bucket=compiled.bucket(len(prompts)),
        requests=len(prompts),
        tokens_equal=eager_tokens == compiled_tokens,
        max_abs_logit_diff=float((eager_logits - compiled_logits).abs().max()),
        eager=[tokenizer.decode(t) for t in eager_tokens],
        compiled=[tokenizer.decode(t) for t in compiled_tokens] if eager_tokens != compiled_tokens else "same",
    )


if __name__ == "__main__":
    main()
