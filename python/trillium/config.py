"""Engine configuration, validated once. Environment variables are read here and nowhere else."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import torch

WEIGHT_FORMATS = ("auto", "quantized", "quantized-int16", "quantized-int8", "dense")
# auto: the fastest arithmetic whose quality is measured to hold on this CPU (bench/quality.py,
# DESIGN.md section 9); exact: fp32 everywhere, bit-faithful to Hugging Face.
PRECISIONS = ("auto", "exact")
KV_CACHE_DTYPES = ("auto", "bf16", "fp32")
DEVICES = ("cpu", "cuda", "auto")
# --reasoning-parser: the formats server/reasoning.py splits into reasoning and content.
REASONING_PARSERS = ("qwen3", "deepseek_r1")
DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32, "float32": torch.float32}


def cpu_has_native_bf16() -> bool:
    """True when the CPU multiplies bf16 in hardware (AVX512-BF16, AMX, or Arm BF16).

    Without it, torch emulates bf16 matmuls and they run several times slower than fp32
    (measured: 20 vs 75 GFLOP/s per core on an AVX-512 Xeon without avx512_bf16), so the
    ``auto`` dtype picks fp32 there.
    """
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(f.read().split())
    except OSError:
        return False
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def cache_dir() -> str | None:
    """Where trillium keeps what a start-up may reuse (``engine.step_costs_cache``):
    ``TRILLIUM_CACHE_DIR``, else ``$XDG_CACHE_HOME/trillium``, else ``~/.cache/trillium``; None
    when ``TRILLIUM_CACHE_DIR`` is set empty (nothing kept)."""
    root = os.environ.get("TRILLIUM_CACHE_DIR")
    if root is None:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(xdg, "trillium")
    return root or None


def resolve_dtype(name: str, device: str = "cpu") -> str:
    """``auto`` -> ``bf16`` on a GPU and on CPUs with native bf16, else ``fp32``; other names unchanged."""
    if name != "auto":
        return name
    return "bf16" if device == "cuda" or cpu_has_native_bf16() else "fp32"


def resolve_device(name: str) -> str:
    """``auto`` -> ``cuda`` when torch sees a CUDA GPU, else ``cpu``; ValueError for an unknown
    name, or ``cuda`` on a machine (or torch build) without one."""
    if name not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {name!r}")
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda: torch sees no CUDA GPU here (a CUDA build of torch and a GPU are needed)")
    return name


SPECULATIVE_METHODS = ("ngram", "draft")


SPECULATION_OFF = ("off", "none")  # --speculative-config values that turn speculation off


@dataclasses.dataclass(frozen=True)
class SpeculativeConfig:
    """How drafts are proposed, and when speculation stands aside.

    ``method``: ``ngram`` (prompt lookup: continue the latest earlier occurrence of the context's
    last 1..``prompt_lookup_max`` tokens) or ``draft`` (a smaller ``model``, a GGUF file or Hugging
    Face directory with the target's tokenizer, proposes them: k autoregressive steps in a KV
    pool of its own, ``draft_kv_cache_gib``; None: as many blocks as the target's pool, so drafting
    runs out of room no sooner than the target). ``num_speculative_tokens``: drafts per request and step
    (k; a verify step computes k + 1 tokens). ``disable_by_batch_size``: no request speculates in
    a step once this many requests are running; None (the default): derived at start-up from
    the measured cost of verify steps against decode steps (``engine.step_costs``), since a
    verify step's extra rows are nearly free at batch 1 and cost their full price at large
    batches.
    """

    method: str = "ngram"
    num_speculative_tokens: int = 5
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 1
    disable_by_batch_size: int | None = None
    model: str | None = None  # method draft: the draft model's path
    draft_kv_cache_gib: float | None = None

    def __post_init__(self) -> None:
        if self.method not in SPECULATIVE_METHODS:
            raise ValueError(f"speculative method must be one of {', '.join(SPECULATIVE_METHODS)}, got {self.method!r}")
        if (self.method == "draft") != (self.model is not None):
            raise ValueError(f"speculative method draft needs a model and only it takes one, got {self.model!r}")
        if self.draft_kv_cache_gib is not None and not self.draft_kv_cache_gib > 0:
            raise ValueError(f"draft_kv_cache_gib must be positive, got {self.draft_kv_cache_gib}")
        if not 1 <= self.num_speculative_tokens <= 16:
            raise ValueError(f"num_speculative_tokens must be in [1, 16], got {self.num_speculative_tokens}")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError(
                f"need 1 <= prompt_lookup_min <= prompt_lookup_max, got {self.prompt_lookup_min}, {self.prompt_lookup_max}"
            )
        if self.disable_by_batch_size is not None and self.disable_by_batch_size < 1:
            raise ValueError(f"disable_by_batch_size must be at least 1, got {self.disable_by_batch_size}")

    @classmethod
    def from_json(cls, text: str | dict[str, Any]) -> SpeculativeConfig:
        """Parse ``--speculative-config``. ValueError naming the bad key or value."""
        try:
            data = json.loads(text) if isinstance(text, str) else dict(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"speculative config is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError("speculative config must be a JSON object")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"unknown speculative config keys: {', '.join(unknown)} (known: {', '.join(sorted(known))})"
            )
        if "model" in data and "method" not in data:
            data["method"] = "draft"  # as vLLM infers it from a draft model
        kinds: dict[str, tuple[type | tuple[type, ...], str]] = {
            "method": (str, "a string"),
            "model": (str, "a string"),
            "draft_kv_cache_gib": ((int, float), "a number"),
        }
        for key, value in data.items():
            kind, what = kinds.get(key, (int, "an integer"))
            if not isinstance(value, kind):
                raise ValueError(f"speculative config {key} must be {what}, got {value!r}")
        return cls(**data)


@dataclasses.dataclass
class EngineConfig:
    """What to serve and how much memory and batch to give it."""

    model: str | None = None  # GGUF file or Hugging Face directory; None = embedded default
    dtype: str = "auto"  # bf16 | fp32 | auto (bf16 on a GPU and where the CPU has native bf16 math)
    # cpu | cuda | auto (cuda when torch sees a GPU); None = TRILLIUM_DEVICE, else cpu. Weights, the
    # KV pool, the step's metadata, logits and sampling live there; the block allocator and the
    # prefix cache stay on the host.
    device: str | None = None
    # CUDA: replay decode steps (1 or k+1 tokens per request) from CUDA graphs captured at start-up
    # for a set of batch sizes; False runs every step eagerly.
    cuda_graphs: bool = True
    block_size: int = 16  # tokens per KV block
    kv_cache_gib: float = 1.0  # KV pool size across all layers
    max_running: int = 64  # requests decoding at once
    max_waiting: int = 256  # requests queued for the scheduler before new ones get 503 (EngineClient)
    max_tokens_per_step: int = 2048  # token budget of one step (chunked prefill size)
    max_model_len: int | None = None  # None = the model's context length
    served_model_name: str | None = None
    # Split a thinking model's output into reasoning and content (vLLM's --reasoning-parser): one
    # of REASONING_PARSERS; None: the whole output is content.
    reasoning_parser: str | None = None
    step_timeout_s: float = 30.0  # watchdog: a step longer than max(this, 10x recent p99) -> /health 503
    enable_prefix_cache: bool = True  # reuse cached KV of shared prompt prefixes
    # Publish prefix-cache events (vLLM's KV-event wire format) on a ZMQ PUB socket bound here,
    # e.g. tcp://*:5557, for vllm-router's kv_aware policy (cluster/kv_events.py). None: off.
    kv_events_endpoint: str | None = None
    # auto: keep a GGUF file's Q4_0/Q4_1/Q8_0 projections quantized where the C++ kernel runs them
    # (AVX2 or AVX-512 CPU), else dense; quantized: require that, fp32 activations (exact); quantized-int16:
    # round activations to int16 per 32-block (near-exact, faster); quantized-int8: to int8
    # (llama.cpp's way: approximate); dense: always dequantize.
    weights: str = "auto"
    num_threads: int | None = None  # torch / OpenMP threads; None = TRILLIUM_NUM_THREADS or all cores
    # Structured output: refuse a JSON Schema whose ``format`` the server does not know (400), as
    # before JSON Schema 2019-09; False accepts it and ignores the format (structured/formats.py).
    structured_strict_formats: bool = False
    # Speculative decoding: n-gram prompt lookup by default (bench/speculative.py: it gained at every
    # concurrency measured, 1.0-1.6x, and is lossless); None or "off" turns it off; else a
    # SpeculativeConfig or its JSON / dict (vLLM's ``--speculative-config``: {"method": "ngram",
    # "num_speculative_tokens": 5, ...}).
    speculative_config: SpeculativeConfig | str | dict[str, object] | None = dataclasses.field(
        default_factory=SpeculativeConfig
    )
    # The precision policy (DESIGN.md section 9): ``exact`` pins fp32 activations, weights without
    # int8 rounding and an fp32 KV cache (Hugging Face parity); ``auto`` lets the other choices
    # take the fast arithmetic measured to hold quality (bench/quality.py). Explicit ``dtype``,
    # ``weights`` and ``kv_cache_dtype`` override it, and contradicting ``exact`` is an error.
    precision: str = "auto"
    # The KV pool's dtype, apart from the compute dtype (vLLM's --kv-cache-dtype). auto: the compute
    # dtype. bf16 (opt-in) holds the quality contract -- a mean KL divergence to exact of 4e-5, the
    # same top token at 99.7% of positions -- with half the bytes per token and decode steps
    # 1.07-1.43x faster on AVX2 (bench/RESULTS.md, "Precision, first step"); it is not the CPU
    # default yet because rounding K/V to bf16 magnifies the last-bit differences between a
    # prompt computed in one chunk and one resumed from the prefix cache (4e-5 -> 1e-2 in the
    # logits), so a seeded sample may differ between the two.
    kv_cache_dtype: str = "auto"
    # Whether ``dtype`` was ``auto``: the engine may then still pick fp32 for quantized weights.
    dtype_auto: bool = dataclasses.field(default=False, init=False)

    def __post_init__(self) -> None:
        if self.device is None:
            self.device = os.environ.get("TRILLIUM_DEVICE") or "cpu"
        self.device = resolve_device(self.device)
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise ValueError(
                f"reasoning_parser must be one of {', '.join(REASONING_PARSERS)}, got {self.reasoning_parser!r}"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}")
        if self.precision == "exact":
            for name, value, wrong in (
                ("dtype", self.dtype, ("bf16", "bfloat16")),
                ("weights", self.weights, ("quantized-int8", "quantized-int16")),
                ("kv_cache_dtype", self.kv_cache_dtype, ("bf16",)),
            ):
                if value in wrong:
                    raise ValueError(f"precision exact computes and caches in fp32; {name} {value!r} contradicts it")
            self.dtype = "fp32" if self.dtype == "auto" else self.dtype
        self.dtype_auto = self.dtype == "auto"
        self.dtype = resolve_dtype(self.dtype, self.device)
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.weights not in WEIGHT_FORMATS:
            raise ValueError(f"weights must be one of {', '.join(WEIGHT_FORMATS)}, got {self.weights!r}")
        for name in ("block_size", "max_running", "max_waiting", "max_tokens_per_step"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.step_timeout_s <= 0:
            raise ValueError(f"step_timeout_s must be positive, got {self.step_timeout_s}")
        if self.kv_cache_gib <= 0:
            raise ValueError(f"kv_cache_gib must be positive, got {self.kv_cache_gib}")
        if self.kv_events_endpoint is not None:
            if not self.kv_events_endpoint.startswith(("tcp://", "ipc://")):
                raise ValueError(
                    f"kv_events_endpoint must be tcp://HOST:PORT or ipc://PATH, got {self.kv_events_endpoint!r}"
                )
            if not self.enable_prefix_cache:
                raise ValueError("kv_events_endpoint publishes the prefix cache's events: it needs the prefix cache on")
        spec = self.speculative_config
        if isinstance(spec, str) and spec.strip().lower() in SPECULATION_OFF:
            self.speculative_config = None
        elif spec is not None and not isinstance(spec, SpeculativeConfig):
            self.speculative_config = SpeculativeConfig.from_json(spec)
        if self.num_threads is None and os.environ.get("TRILLIUM_NUM_THREADS"):
            self.num_threads = int(os.environ["TRILLIUM_NUM_THREADS"])

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def kv_dtype(self) -> str:
        """The KV pool's dtype: ``kv_cache_dtype``, or for ``auto`` the compute dtype (see there)."""
        return self.dtype if self.kv_cache_dtype == "auto" else self.kv_cache_dtype

    @property
    def torch_kv_dtype(self) -> torch.dtype:
        return DTYPES[self.kv_dtype]
