"""Where the time between two streamed tokens goes, as a client sees it, at batch 1, 8 and 32.

    python bench/step_profile.py                        # batches 1 8 32, 64 tokens, ~256-word prompts
    python bench/step_profile.py --batches 1 4 16 --max-tokens 128 --temperature 1
    python bench/step_profile.py --fused-layers         # the server's default path: the one-call decoder stack
    python bench/step_profile.py --quick                # smoke mode: batches 1 and 2, 8 tokens

The real server runs in this process (``serve_engine`` on a loopback port, the default model);
the client is a subprocess of this script (``stream_request`` of bench/serving_client.py: streamed
legacy completions, ``ignore_eos``, one random-words prompt per stream) that records when every
SSE chunk arrives. A separate process, so that parsing the streams takes neither this event loop
nor this GIL -- it still takes CPU, as a client on the same machine would.

For each batch B, B streams start together. The measured window is the steady decode: from the
moment every stream has its first token to the moment the first stream has its last; the model
steps that start inside it are all decode steps of B requests (``mixed_steps`` says otherwise).
Over those steps the script sums the time spent in each part, from wrappers installed before the
server starts:

    part                      what is timed
    scheduling + metadata     SchedulerPolicy.schedule and .update, plus ModelRunner.execute minus
                              forward, head and sampling (AttentionMetadata.build, input tensors)
    op dispatch               model forward minus the kernel calls inside it: the Python layers
                              and typed wrappers around the kernels
    projections               _core.quant_linear inside the forward
    attention                 _core.store_kv + _core.paged_attention
    norms/activations         _core.rms_norm + _core.rotary_inplace + _core.silu_and_mul
    fused decoder stack       (--fused-layers only) DecoderStack.forward: all of the three above
    output head               model.compute_logits (its quant_linear included)
    sampling                  sampler.sample
    detokenize + SSE          IncrementalDetokenizer and StopStringMatcher, ResponseShape.chunk
                              and sse.event (the JSON encoding of each chunk)
    other/gaps                client inter-token gap minus everything above: the HTTP stack,
                              trio and mailboxes, the thread hop, GIL and CPU contention

By default the model runs its layers one operation at a time (``fused_layers`` off), so that each
kernel is a separate call and the split above exists. The server's own default is the fused
decoder stack (every layer in one core call); ``--fused-layers`` profiles that path, where
projections, attention and norms are one "fused decoder stack" row and dispatch is nearly none.

Kernels are timed by replacing the ``_core`` reference of each ops module with a proxy whose
kernel attributes wrap the real functions; a thread-local region (forward / head) says where a
kernel call counts. Timers accumulate under a lock, so they work from whichever thread runs steps.

Per step = seconds in the window / steps in the window: what one stream waits between two tokens
(at batch B one step yields B tokens, so the client's gap is about one step). Per token = per
step / B. The client's gap is taken over the same steps: per stream, from the chunk of the step
before the window to the chunk of its last step. Event-loop parts (detokenization, SSE) may
overlap the next step on the other core, so "other/gaps" can come out slightly negative; it is
printed as measured. ``diagnostics`` add the engine's own cycle (step start to step start), the
event loop's busy time (a trio instrument), the step thread's off-CPU time in the forward, and
the timer overhead.

Timer overhead: each wrapped kernel call costs about 0.7 us more on a 2-vCPU EPYC (measured at
start-up; ``timer_overhead_ms`` is its total): ~300 kernel calls per step make ~0.2 ms per step,
which is subtracted from "op dispatch" (where it lands). The other wrappers run a few times per
step or per token (~1 us each); the event loop's idle clock adds ~1 us per loop iteration.

Prints one JSON line (settings, per-batch parts in ms per step and per token, diagnostics), then
two Markdown tables (ms per step, ms per token). A failed request, or a window with fewer than
two steps, raises (exit status 1).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import platform
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx
import trio

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serving_client import load_prompts, stream_request

SCRIPT = os.path.abspath(__file__)  # the client subprocess runs this file

# (key, label) in table order; "other" is the client gap minus the rest.
PARTS = (
    ("scheduling", "Python scheduling + metadata"),
    ("dispatch", "per-layer op dispatch (Python around kernels)"),
    ("projections", "projections (quant_linear kernels)"),
    ("attention", "attention (store_kv + paged_attention)"),
    ("norms", "norms/activations (rms_norm, rotary, silu_and_mul)"),
    ("decoder_stack", "fused decoder stack (all layers in one core call)"),
    ("output_head", "output head (compute_logits)"),
    ("sampling", "sampling"),
    ("detok_sse", "detokenization + SSE framing"),
    ("other", "other/gaps"),
)
# Kernel name -> part; each is timed wherever an ops module calls it through ``_core``.
KERNELS = {
    "quant_linear": "projections",
    "store_kv": "attention",
    "paged_attention": "attention",
    "rms_norm": "norms",
    "rotary_inplace": "norms",
    "silu_and_mul": "norms",
    "decoder_stack": "decoder_stack",  # DecoderStack.forward: every layer's kernels in one call
}
# The ops modules that call ``_core``; decoder_stack only where the fused stack exists.
OPS_MODULES = (
    "trillium.ops.quant_linear",
    "trillium.ops.attention",
    "trillium.ops.layer_ops",
    "trillium.ops.decoder_stack",
)
REGIONS = ("forward", "head", "outside")
OPTIONAL_PARTS = {"decoder_stack"}  # tabled only when measured (--fused-layers)


# ------------------------------------------------------------------------------------------ timers
class Timers:
    """Cumulative seconds and calls per name, added from any thread, plus the event loop's idle
    time (time in trio's I/O wait). ``snapshot`` is consistent: it takes the same lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seconds: dict[str, float] = {}
        self._calls: dict[str, int] = {}
        self._idle_since: float | None = None

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            self._seconds[name] = self._seconds.get(name, 0.0) + seconds
            self._calls[name] = self._calls.get(name, 0) + 1

    def begin_idle(self) -> None:
        with self._lock:
            self._idle_since = time.perf_counter()

    def end_idle(self) -> None:
        with self._lock:
            if self._idle_since is not None:
                idle = time.perf_counter() - self._idle_since
                self._seconds["loop.idle"] = self._seconds.get("loop.idle", 0.0) + idle
            self._idle_since = None

    def snapshot(self) -> tuple[dict[str, float], dict[str, int]]:
        """(seconds, calls) so far; an idle wait in progress counts up to now."""
        with self._lock:
            seconds, calls = dict(self._seconds), dict(self._calls)
            if self._idle_since is not None:
                seconds["loop.idle"] = seconds.get("loop.idle", 0.0) + time.perf_counter() - self._idle_since
        return seconds, calls


class _Region(threading.local):
    name = "outside"  # where a kernel call counts: inside the forward, the head, or neither


_REGION = _Region()


def timed(timers: Timers, name: str, fn: Any, region: str | None = None) -> Any:
    """``fn`` wrapped: its wall time is added to ``name``; with ``region``, kernel calls made
    during it count in that region."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        outer = _REGION.name
        if region is not None:
            _REGION.name = region
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            timers.add(name, time.perf_counter() - start)
            _REGION.name = outer

    return wrapper


def timed_kernel(timers: Timers, name: str, fn: Any) -> Any:
    """A kernel wrapped as leanly as possible (it runs ~300 times per step): its time counts under
    ``<region>.<name>``."""
    keys = {region: f"{region}.{name}" for region in REGIONS}

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            timers.add(keys[_REGION.name], time.perf_counter() - start)

    return wrapper


class CoreProxy:
    """Stands in for ``trillium._core`` in one ops module: the kernels are timed (the fused stack's
    ``forward`` too, on every ``DecoderStack`` made through it), every other attribute is the real
    module's."""

    def __init__(self, core: Any, timers: Timers) -> None:
        self._core = core
        for name in KERNELS:
            if hasattr(core, name):
                setattr(self, name, timed_kernel(timers, name, getattr(core, name)))
        if hasattr(core, "DecoderStack"):
            self.DecoderStack = lambda *args: TimedStack(core.DecoderStack(*args), timers)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._core, name)


class TimedStack:
    """A ``_core.DecoderStack`` whose ``forward`` is timed as the ``decoder_stack`` kernel."""

    def __init__(self, stack: Any, timers: Timers) -> None:
        self._stack = stack
        self.forward = timed_kernel(timers, "decoder_stack", stack.forward)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stack, name)


class IdleClock(trio.abc.Instrument):
    """Counts the event loop's time in the I/O wait (nothing runnable) as idle."""

    def __init__(self, timers: Timers) -> None:
        self.timers = timers

    def before_io_wait(self, timeout: float) -> None:
        self.timers.begin_idle()

    def after_io_wait(self, timeout: float) -> None:
        self.timers.end_idle()


def calibrate_overhead(calls: int = 200_000) -> float:
    """Seconds a kernel wrapper adds per call (a cheap C function, called bare and wrapped)."""
    fn, args = max, tuple(range(10))  # a C function taking ~10 positional arguments, as kernels do
    wrapped = timed_kernel(Timers(), "calibration", fn)
    start = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    bare = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(calls):
        wrapped(*args)
    return max(0.0, (time.perf_counter() - start - bare) / calls)


# ------------------------------------------------------------------------------------------ wiring
@dataclass
class StepMark:
    """Taken as a step starts: the counters up to then, and what the step runs."""

    time: float
    seconds: dict[str, float]
    calls: dict[str, int]
    num_requests: int
    num_tokens: int
    end: float = 0.0  # when execute returned


def instrument(engine: Any, timers: Timers, marks: list[StepMark], fused_layers: bool) -> None:
    """Install every timer (before the server starts; the patches last for this process) and pick
    the model's layer path: per operation, or the fused decoder stack where the model has one."""
    _time_kernels(timers)
    _time_python(timers)
    _time_model(engine, timers, marks, fused_layers)


def _time_kernels(timers: Timers) -> None:
    from trillium import _core

    for module_name in OPS_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue  # an ops module this version does not have
        module._core = CoreProxy(_core, timers)  # type: ignore[attr-defined]


def _time_python(timers: Timers) -> None:
    """The scheduler's, the sampler's and the frontend's per-step and per-token Python."""
    import trillium.engine.runner as runner_module
    import trillium.server.sse as sse
    from trillium.ops.attention import AttentionMetadata
    from trillium.scheduler.policy import SchedulerPolicy
    from trillium.server.openai_shapes import ResponseShape
    from trillium.tokenizer.detokenizer import IncrementalDetokenizer
    from trillium.tokenizer.stop import StopStringMatcher

    SchedulerPolicy.schedule = timed(timers, "policy.schedule", SchedulerPolicy.schedule)
    SchedulerPolicy.update = timed(timers, "policy.update", SchedulerPolicy.update)
    AttentionMetadata.build = staticmethod(timed(timers, "metadata.build", AttentionMetadata.build))
    runner_module.sample = timed(timers, "sampler.sample", runner_module.sample)
    for cls, method in ((IncrementalDetokenizer, "add"), (StopStringMatcher, "feed")):
        setattr(cls, method, timed(timers, "detok", getattr(cls, method)))
        cls.flush = timed(timers, "detok", cls.flush)  # type: ignore[method-assign]
    ResponseShape.chunk = timed(timers, "sse", ResponseShape.chunk)
    sse.event = timed(timers, "sse", sse.event)


def _time_model(engine: Any, timers: Timers, marks: list[StepMark], fused_layers: bool) -> None:
    """The runner's execute (marking each step's start and end), the forward and the head."""
    model, runner = engine.runner.model, engine.runner
    if not model.is_quantized:
        # Dense projections are torch matmuls, not _core kernels: they would count as dispatch.
        raise RuntimeError("the profile splits the quantized-kernel path; this model runs dense weights here")
    if hasattr(model, "fused_layers"):
        model.fused_layers = fused_layers
    elif fused_layers:
        raise RuntimeError("--fused-layers: this version's model has no fused decoder stack")
    model.forward = _forward_timer(timers, model.forward)
    model.compute_logits = timed(timers, "model.compute_logits", model.compute_logits, region="head")
    execute = timed(timers, "runner.execute", runner.execute)

    def marked_execute(step_input: Any) -> Any:
        seconds, calls = timers.snapshot()
        num_tokens = sum(len(r.token_ids) for r in step_input.requests)
        mark = StepMark(time.perf_counter(), seconds, calls, len(step_input.requests), num_tokens)
        marks.append(mark)
        try:
            return execute(step_input)
        finally:
            mark.end = time.perf_counter()

    runner.execute = marked_execute


def _forward_timer(timers: Timers, forward: Any) -> Any:
    """The model's forward timed in wall time and in the calling thread's CPU time (their
    difference is time the step thread waited: for the GIL, for a core, or asleep in a kernel's
    OpenMP barrier)."""
    wall = timed(timers, "model.forward", forward, region="forward")

    def wrapper(*args: Any) -> Any:
        start = time.thread_time()
        try:
            return wall(*args)
        finally:
            timers.add("model.forward_cpu", time.thread_time() - start)

    return wrapper


# ------------------------------------------------------------------------------------------ client
async def client_main(args: argparse.Namespace) -> None:
    """The client subprocess: B concurrent streams; prints their records as one JSON line."""
    prompts = load_prompts(None, args.client_batch, args.input_words, args.seed)
    sampling = {"temperature": args.temperature}
    limits = httpx.Limits(max_connections=args.client_batch + 4, max_keepalive_connections=args.client_batch + 4)
    records: list[dict[str, Any]] = [{} for _ in prompts]
    async with httpx.AsyncClient(base_url=args.client_url, timeout=600, limits=limits) as client:

        async def one(i: int) -> None:
            records[i] = await stream_request(
                client, "completions", args.model_name, prompts[i], args.max_tokens, True, sampling
            )

        async with trio.open_nursery() as nursery:
            for i in range(len(prompts)):
                nursery.start_soon(one, i)
    print(json.dumps(records))


async def run_client(args: argparse.Namespace, url: str, model: str, batch: int, max_tokens: int, seed: int) -> list:
    """Run the client subprocess against ``url``; its records (RuntimeError if one failed)."""
    command = [sys.executable, SCRIPT, "--client-url", url, "--model-name", model]
    command += ["--client-batch", str(batch), "--max-tokens", str(max_tokens), "--seed", str(seed)]
    command += ["--input-words", str(args.input_words), "--temperature", str(args.temperature)]
    proc = await trio.run_process(command, capture_stdout=True, capture_stderr=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"client failed ({proc.returncode}): {proc.stderr.decode()[-2000:]}")
    records: list[dict[str, Any]] = json.loads(proc.stdout)
    failed = [r.get("error") for r in records if not r["ok"]]
    if failed:
        raise RuntimeError(f"{len(failed)} of {batch} requests failed, e.g. {failed[0]}")
    return records


# ------------------------------------------------------------------------------------------ analysis
def decode_window(records: list[dict], marks: list[StepMark]) -> tuple[int, int]:
    """(a, b): the first and last step that start inside the steady-decode window (every stream
    has its first token, none has its last). ValueError when fewer than 2 steps do."""
    t0 = max(r["chunk_times"][0] for r in records)
    t1 = min(r["chunk_times"][-1] for r in records)
    inside = [i for i, m in enumerate(marks) if t0 <= m.time <= t1]
    if len(inside) < 2:
        raise ValueError(f"only {len(inside)} steps in the decode window: ask for more tokens")
    return inside[0], inside[-1]


def client_gap(records: list[dict], marks: list[StepMark], a: int, b: int) -> float:
    """Mean seconds per token a client saw over steps a+1..b: per stream, from the first chunk
    after step ``a`` ended to the first after step ``b`` ended, over ``b - a`` tokens. Pairing
    chunks with steps makes the client's span cover the same steps as the counters'."""
    spans = []
    for r in records:
        after_a = next((t for t in r["chunk_times"] if t > marks[a].end), None)
        after_b = next((t for t in r["chunk_times"] if t > marks[b].end), None)
        if after_a is not None and after_b is not None:
            spans.append((after_b - after_a) / (b - a))
    if not spans:
        raise ValueError("no stream has chunks after both ends of the window")
    return sum(spans) / len(spans)


def parts_seconds(d: dict[str, float], kernel_calls: int, overhead: float) -> dict[str, float]:
    """Seconds per part (every part but "other") from the counters' growth ``d``."""

    def get(*names: str) -> float:
        return sum(d.get(name, 0.0) for name in names)

    def kernels(part: str) -> float:
        return get(*(f"forward.{k}" for k, p in KERNELS.items() if p == part))

    forward, head, sample = get("model.forward"), get("model.compute_logits"), get("sampler.sample")
    in_kernels = sum(kernels(p) for p in ("projections", "attention", "norms", "decoder_stack"))
    return {
        # execute minus what is timed inside it: metadata, input tensors, logits to CPU, generators
        "scheduling": get("policy.schedule", "policy.update") + get("runner.execute") - forward - head - sample,
        "dispatch": max(0.0, forward - in_kernels - overhead * kernel_calls),
        "projections": kernels("projections"),
        "attention": kernels("attention"),
        "norms": kernels("norms"),
        "decoder_stack": kernels("decoder_stack"),
        "output_head": head,
        "sampling": sample,
        "detok_sse": get("detok", "sse"),
    }


def breakdown(batch: int, records: list[dict], marks: list[StepMark], overhead: float) -> dict[str, Any]:
    """One batch's parts in ms per step and per token, with diagnostics."""
    a, b = decode_window(records, marks)
    first, last = marks[a], marks[b]
    num_steps = b - a
    d = {k: v - first.seconds.get(k, 0.0) for k, v in last.seconds.items()}
    kernel_calls = sum(n - first.calls.get(k, 0) for k, n in last.calls.items() if k.startswith("forward."))
    per_step = {k: 1e3 * v / num_steps for k, v in parts_seconds(d, kernel_calls, overhead).items()}
    # Counters from the start of step a to that of b cover steps a..b-1: so do these chunks.
    gap_ms = 1e3 * client_gap(records, marks, a - 1, b - 1)
    attributed = sum(per_step.values())
    per_step["other"] = gap_ms - attributed
    diagnostics = _diagnostics(d, last.time - first.time, num_steps, kernel_calls * overhead, records)
    diagnostics["kernel_calls_per_step"] = round(kernel_calls / num_steps, 1)
    diagnostics["mixed_steps"] = sum(1 for m in marks[a:b] if m.num_requests != batch or m.num_tokens != batch)
    return {
        "batch": batch,
        "steps": num_steps,
        "tokens": num_steps * batch,
        "client_gap_ms": round(gap_ms, 3),
        "attributed_ms": round(attributed, 3),
        "per_step_ms": {k: round(v, 3) for k, v in per_step.items()},
        "per_token_ms": {k: round(v / batch, 4) for k, v in per_step.items()},
        "diagnostics": diagnostics,
    }


def _diagnostics(
    d: dict[str, float], cycle: float, num_steps: int, timer_overhead: float, records: list[dict]
) -> dict[str, Any]:
    """Cross-checks of the split, in ms per step (``d``: the counters' growth over the window)."""

    def ms(*names: str, minus: tuple[str, ...] = (), plus: float = 0.0) -> float:
        seconds = plus + sum(d.get(n, 0.0) for n in names) - sum(d.get(n, 0.0) for n in minus)
        return round(1e3 * seconds / num_steps, 3)

    loop_busy = cycle - d.get("loop.idle", 0.0)
    return {
        "engine_cycle_ms": ms(plus=cycle),  # step start to step start: about the client gap
        "execute_ms": ms("runner.execute"),
        "metadata_build_ms": ms("metadata.build"),
        "schedule_update_ms": ms("policy.schedule", "policy.update"),
        "forward_off_cpu_ms": ms("model.forward", minus=("model.forward_cpu",)),
        "event_loop_busy_ms": ms(plus=loop_busy),
        # The event loop's time outside the timed parts: HTTP stack, trio, mailboxes.
        "event_loop_other_ms": ms(plus=loop_busy, minus=("policy.schedule", "policy.update", "detok", "sse")),
        "timer_overhead_ms": ms(plus=timer_overhead),
        "chunks_per_token": round(
            sum(len(r["chunk_times"]) for r in records) / sum(r["output_tokens"] for r in records), 3
        ),
        "prompt_tokens_mean": round(sum(r["prompt_tokens"] for r in records) / len(records), 1),
    }


# ------------------------------------------------------------------------------------------ run
async def profile(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Start the engine, instrument it, and measure every batch; the engine is closed after."""
    from trillium.config import EngineConfig
    from trillium.launch import Engine

    config = EngineConfig(
        max_model_len=2048,
        kv_cache_gib=args.kv_cache_gib,
        max_running=max(64, *args.batches),
        num_threads=args.num_threads,
        speculative_config=None,  # one token per request and step: the decode step is what is profiled
    )
    engine = Engine(config, progress=False)
    try:
        return await measure(args, engine)
    finally:
        close = getattr(engine, "close", None)  # ends the step thread, where the engine has one
        if close is not None:
            close()


async def measure(args: argparse.Namespace, engine: Any) -> list[dict[str, Any]]:
    """Serve ``engine`` on a loopback port, warm it up, then run the client at every batch."""
    from trillium.serve import serve_engine

    timers, marks = Timers(), []
    instrument(engine, timers, marks, args.fused_layers)
    trio.lowlevel.add_instrument(IdleClock(timers))
    overhead = calibrate_overhead()
    model = engine.client.model_name
    results = []
    async with trio.open_nursery() as server:
        serve = functools.partial(serve_engine, engine, host="127.0.0.1", port=0, handle_signals=False)
        url = (await server.start(serve))[0]
        await run_client(args, url, model, max(args.batches), 4, seed=10_000)  # warm-up
        for batch in args.batches:
            marks.clear()
            records = await run_client(args, url, model, batch, args.max_tokens, seed=batch)
            results.append(breakdown(batch, records, marks, overhead))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)  # progress
        server.cancel_scope.cancel()
    return results


def markdown(results: list[dict[str, Any]], key: str, digits: int) -> str:
    """Rows = parts (then attributed total and client gap), columns = batches."""
    lines = ["| part | " + " | ".join(f"batch {r['batch']}" for r in results) + " |"]
    lines.append("|---|" + "---:|" * len(results))
    for part, label in PARTS:
        if part in OPTIONAL_PARTS and not any(r[key][part] for r in results):
            continue  # not on this path
        lines.append(f"| {label} | " + " | ".join(f"{r[key][part]:.{digits}f}" for r in results) + " |")
    scale = [1 if key == "per_step_ms" else r["batch"] for r in results]
    for label, field in (("attributed total", "attributed_ms"), ("client inter-token gap", "client_gap_ms")):
        cells = [f"{r[field] / s:.{digits}f}" for r, s in zip(results, scale)]
        lines.append(f"| **{label}** | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--input-words", type=int, default=256, help="random common words per prompt (~1 token each)")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy, so every token is a text chunk")
    p.add_argument("--kv-cache-gib", type=float, default=1.0)
    p.add_argument("--num-threads", type=int, default=None)
    p.add_argument("--fused-layers", action="store_true", help="run the layers as one core call (no per-op split)")
    p.add_argument("--quick", action="store_true", help="smoke mode: batches 1 and 2, 8 tokens, short prompts")
    # The client subprocess (run_client) is this script with these:
    p.add_argument("--client-url", help=argparse.SUPPRESS)
    p.add_argument("--client-batch", type=int, help=argparse.SUPPRESS)
    p.add_argument("--model-name", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.client_url:
        trio.run(client_main, args)
        return 0
    if args.quick:
        args.batches, args.max_tokens, args.input_words = [1, 2], 8, 64
    results = trio.run(profile, args)
    settings = {k: v for k, v in vars(args).items() if not k.startswith("client") and k not in ("model_name", "seed")}
    machine = f"{platform.machine()} {os.cpu_count()} cpus"
    print(json.dumps({"settings": settings, "machine": machine, "results": results}))
    print()
    path = "fused decoder stack" if args.fused_layers else "per operation (fused_layers off)"
    print(f"layers: {path}. ms per step (what one stream waits between two tokens):\n")
    print(markdown(results, "per_step_ms", 3))
    print("\nms per output token (per step / batch):\n")
    print(markdown(results, "per_token_ms", 4))
    return 0


if __name__ == "__main__":
    sys.exit(main())
