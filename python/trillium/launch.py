"""Wiring: load one engine's model and tokenizer, size its KV pool, and build its actors.

Everything here runs once, synchronously, at start-up. The server (``serve.py``), the offline
:class:`trillium.LLM` and ``trillium chat`` all build an :class:`Engine` and then talk to it only
through :attr:`Engine.client` (messages), so they share one scheduler and one request path.
"""

from __future__ import annotations

import dataclasses
import logging
import weakref

import torch

from trillium import _core
from trillium.cluster.kv_events import KVEventPublisher
from trillium.config import EngineConfig, SpeculativeConfig
from trillium.engine.cuda_graphs import CudaGraphSteps
from trillium.engine.runner import ModelRunner, kv_bytes_per_block
from trillium.engine.step_costs import StepCosts, measure_step_costs
from trillium.engine.step_costs_cache import cached_step_costs
from trillium.engine.step_costs_cache import key as step_costs_key
from trillium.engine.step_thread import StepThread
from trillium.engine_client import EngineClient
from trillium.models import default_model_path, load_model
from trillium.models.config import ModelConfig
from trillium.models.registry import can_run_quantized
from trillium.models.step_buckets import StepBuckets
from trillium.ops.cpu_isa import kernel_isa
from trillium.ops.quant_linear import Activations
from trillium.runtime import (
    GRAMMAR_INBOX_BOUND,
    INBOX_BOUND,
    TOKENIZER_INBOX_BOUND,
    Actor,
    open_inbox,
)
from trillium.runtime.memory import return_freed_memory
from trillium.scheduler import SchedulerConfig
from trillium.scheduler.actor import SchedulerActor
from trillium.scheduler.kv_manager import KVBlockManager, cache_namespace
from trillium.speculative.draft import check_same_tokenizer, load_draft
from trillium.structured import BitmaskFiller, GrammarCompiler, build_ll_tokenizer
from trillium.structured.actor import GrammarActor
from trillium.tokenizer import load_tokenizer
from trillium.tokenizer.actor import TokenizerActor

log = logging.getLogger("trillium")


def weight_activations(weights: str) -> Activations:
    """How a resolved ``--weights`` value's quantized matmuls treat their activations."""
    return {"quantized-int8": Activations.INT8, "quantized-int16": Activations.INT16}.get(weights, Activations.EXACT)


def resolve_weights(config: EngineConfig, path: str) -> EngineConfig:
    """``config`` with ``weights`` and ``dtype`` settled for this model file on this machine.

    Pure: returns a new config, ``config`` is unchanged. ``weights`` becomes ``dense``,
    ``quantized``, ``quantized-int16`` or ``quantized-int8`` (``auto``: see :func:`auto_quantized`). With ``--dtype auto`` and ``--weights auto``, a model
    whose projections the quantized kernel takes is served that way in fp32 even on a CPU with
    native bf16: measured on an AVX512-BF16 EPYC, quantized fp32 decoded 1.3-1.7x (1 stream) and
    1.0-1.2x (32 streams) faster than dense bf16 (docs/decisions/quantized-weights.md).
    On a GPU the quantized kernels do not run: ``auto`` is ``dense`` there (a GGUF file's blocks
    are dequantized to the dtype, bf16 by default, at load).
    Raises ValueError when a quantized format was asked for and cannot run here.
    """
    if config.weights == "dense":
        return config
    device = config.device or "cpu"
    if (
        config.weights == "auto"
        and config.dtype_auto
        and config.dtype != "fp32"
        and can_run_quantized(path, torch.float32, device)[0]
    ):
        return dataclasses.replace(config, dtype="fp32", weights=auto_quantized(config))
    if config.weights != "auto" and config.dtype_auto and config.dtype != "fp32":
        # An explicit quantized format implies the fp32 activations its kernels take.
        config = dataclasses.replace(config, dtype="fp32")
    ok, why = can_run_quantized(path, config.torch_dtype, device, activations=weight_activations(config.weights))
    if config.weights != "auto" and not ok:
        raise ValueError(f"--weights {config.weights}: {why}")
    if not ok:
        log.info("dense weights: %s", why)
        return dataclasses.replace(config, weights="dense")
    return dataclasses.replace(config, weights=auto_quantized(config) if config.weights == "auto" else config.weights)


def auto_quantized(config: EngineConfig) -> str:
    """The quantized ``--weights`` mode ``auto`` picks: int16 activations under ``--precision auto``
    wherever a SIMD kernel runs them -- measured faster than exact fp32 on AVX2 and, with their
    512-bit tiles, on AVX-512 with and without VNNI at every row count (bench/RESULTS.md, "int16
    activations"; their quality: a mean KL divergence to exact of ~1e-7, the same bits on every
    ISA) -- else (the portable loops, ``--precision exact``) exact."""
    if config.precision == "auto" and kernel_isa() != "portable":
        return "quantized-int16"
    return "quantized"


def _check_gpu_support(config: ModelConfig) -> None:
    """ValueError naming what the CUDA kernels lack for this model (sliding-window attention and
    score soft-capping run on the CPU kernels only)."""
    windows = [config.window_of(i) for i in range(config.num_layers)]
    if any(windows) or config.attn_softcap:
        what = "sliding-window attention" if any(windows) else "attention soft-capping"
        raise ValueError(
            f"{config.architecture} needs {what}, which the CUDA attention kernel does not implement yet; "
            "serve it with --device cpu"
        )


def precision_report(config: EngineConfig) -> dict[str, str]:
    """What a resolved config computes with (``/stats``, the start-up log, ``trillium inspect``)."""
    activations = weight_activations(config.weights)
    return {
        "precision": config.precision,
        "activations": config.dtype if activations == Activations.EXACT else activations.name.lower(),
        "weights": "dense" if config.weights == "dense" else "quantized",
        "kv_cache_dtype": config.kv_dtype,
    }


class Engine:
    """One loaded model with its KV pool and actors; :attr:`client` is how everything talks to it.

    ``config`` is the resolved config (see :func:`resolve_weights`). The model is loaded, its KV
    pool allocated and every step run on :attr:`step_thread` (one OpenMP team: see
    :mod:`trillium.engine.step_thread`); :meth:`close` ends that thread.
    """

    def __init__(self, config: EngineConfig, *, progress: bool = True) -> None:
        self.kv_events: KVEventPublisher | None = None  # --kv-events-endpoint's publisher
        if config.kv_events_endpoint is not None:
            # Bound first, so a port in use fails in a second (EndpointError), not after the load.
            self.kv_events = KVEventPublisher(config.kv_events_endpoint, block_size=config.block_size)
            weakref.finalize(self, self.kv_events.close)
        self.step_thread = StepThread()
        weakref.finalize(self, self.step_thread.close)  # an LLM dropped without close() ends it too
        spec = config.speculative_config
        if isinstance(spec, SpeculativeConfig) and spec.model is not None:
            # Fail fast: a draft model of another tokenizer stops start-up before any model loads.
            target = config.model or default_model_path()
            check_same_tokenizer(target, load_tokenizer(target), spec.model, load_tokenizer(spec.model))
        self.step_thread.call(self._load, config, progress)
        self.tokenizer = load_tokenizer(self.path)
        self.step_thread.call(self._load_draft, config, progress)
        self._build_actors()
        # Building the actors ran torch ops here (the structured-output bitmask buffer); drop the
        # OpenMP team they may have started on this thread, so the step thread's is the only one.
        _core.release_openmp_threads()
        return_freed_memory()  # the load's temporary buffers (runtime/memory.py)

    def close(self) -> None:
        """End the step thread and the KV-event publisher (the actors must have stopped)."""
        self.step_thread.close()
        if self.kv_events is not None:
            self.kv_events.close()

    def _load(self, config: EngineConfig, progress: bool) -> None:
        """On the step thread: the model, its config and the runner with its KV pool."""
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.path = path = config.model or default_model_path()
        self.config = config = resolve_weights(config, path)
        quantized = config.weights != "dense"
        self.precision = precision_report(config)
        log.info(
            "loading model from %s; precision %s: %s activations, %s weights, %s KV cache",
            path,
            config.precision,
            self.precision["activations"],
            self.precision["weights"],
            self.precision["kv_cache_dtype"],
        )
        device = config.device or "cpu"
        self.model, self.model_config = load_model(
            path,
            dtype=config.torch_dtype,
            device=device,
            progress=progress,
            quantized=quantized,
            activations=weight_activations(config.weights),
        )
        if device != "cpu":
            _check_gpu_support(self.model_config)
        self.num_blocks = num_blocks = int(config.kv_cache_gib * 2**30) // kv_bytes_per_block(
            self.model_config, config.block_size, config.torch_kv_dtype
        )
        log.info("KV cache: %d blocks of %d tokens (%.2f GiB)", num_blocks, config.block_size, config.kv_cache_gib)
        self.runner = ModelRunner(
            self.model,
            self.model_config,
            num_blocks=num_blocks,
            block_size=config.block_size,
            dtype=config.torch_dtype,
            device=device,
            kv_dtype=config.torch_kv_dtype,
        )
        spec = config.speculative_config
        if device == "cuda" and config.cuda_graphs:
            # Decode steps, and verify steps of k drafts per request when speculating, replay
            # graphs captured here, before the step costs are timed (they time what will run).
            tokens = [1] + ([spec.num_speculative_tokens + 1] if isinstance(spec, SpeculativeConfig) else [])
            self.runner.graphs = CudaGraphSteps(
                self.model,
                self.runner.kv_caches,
                config.block_size,
                -(-self._max_model_len(config) // config.block_size),
                StepBuckets.up_to(config.max_running, tokens),
            )
            self.runner.graphs.capture()
        self.spec_costs: StepCosts | None = None
        if isinstance(spec, SpeculativeConfig):
            # What a draft row costs against a decoded token, per batch size (speculative.depth):
            # timed now, or kept from the last start-up on this model, build and machine.
            k = spec.num_speculative_tokens
            settings = {
                **self.precision,
                "dtype": str(config.torch_dtype),
                "device": device,
                "cuda_graphs": config.cuda_graphs,
                "threads": torch.get_num_threads(),
                "block_size": config.block_size,
                "max_running": config.max_running,
                "k": k,
            }
            threshold, self.spec_costs = cached_step_costs(
                step_costs_key(path, _core.__file__, settings),
                lambda: measure_step_costs(self.runner, k, config.max_running),
            )
            if spec.disable_by_batch_size is None:
                spec = dataclasses.replace(spec, disable_by_batch_size=threshold)
                self.config = dataclasses.replace(config, speculative_config=spec)

    def _load_draft(self, config: EngineConfig, progress: bool) -> None:
        """On the step thread, with ``method: draft``: the draft model (its tokenizer checked
        against the target's first) and its KV pool, given to the runner. ``config`` as given:
        weights and dtype are resolved for the draft's own file."""
        spec = self.config.speculative_config
        if not isinstance(spec, SpeculativeConfig) or spec.model is None:
            return
        draft = resolve_weights(config, spec.model)
        self.runner.drafter = load_draft(
            spec.model,
            target_path=self.path,
            target_tokenizer=self.tokenizer,
            target_config=self.model_config,
            target_num_blocks=self.num_blocks,
            block_size=config.block_size,
            kv_cache_gib=spec.draft_kv_cache_gib,
            max_catch_up_tokens=config.max_tokens_per_step,
            dtype=draft.torch_dtype,
            quantized=draft.weights != "dense",
            activations=weight_activations(draft.weights),
            progress=progress,
            device=config.device or "cpu",
        )

    def _max_model_len(self, config: EngineConfig) -> int:
        """The longest context a request may reach: ``--max-model-len``, at most the model's."""
        longest = self.model_config.max_position_embeddings
        return min(config.max_model_len or longest, longest)

    def _build_actors(self) -> None:
        config, path, num_blocks = self.config, self.path, self.num_blocks
        model_name = config.served_model_name or self.model_config.name
        max_model_len = self._max_model_len(config)
        scheduler_config = SchedulerConfig(
            block_size=config.block_size,
            max_running=config.max_running,
            max_tokens_per_step=config.max_tokens_per_step,
            max_model_len=max_model_len,
            eos_token_ids=frozenset(self.tokenizer.eos_token_ids),
            model_key=f"{model_name}:{path}",
            speculative=config.speculative_config if isinstance(config.speculative_config, SpeculativeConfig) else None,
            spec_break_even=self.spec_costs.break_even_table() if self.spec_costs else (),
        )
        allocator = _core.BlockAllocator(num_blocks)
        tree = _core.RadixTree(allocator, config.block_size) if config.enable_prefix_cache else None
        if tree is not None and self.kv_events is not None:
            tree.record_events = True
            self.kv_events.add_namespace(cache_namespace(scheduler_config.model_key, None))
        scheduler_send, scheduler_recv = open_inbox(INBOX_BOUND)
        tokenizer_send, tokenizer_recv = open_inbox(TOKENIZER_INBOX_BOUND)
        grammar_send, grammar_recv = open_inbox(GRAMMAR_INBOX_BOUND)
        # Structured output: llguidance's view of the vocabulary, the compile cache, and the
        # step bitmask (one row per running request) that the grammar thread fills.
        compiler = GrammarCompiler(
            build_ll_tokenizer(self.tokenizer, self.model_config.vocab_size),
            strict_formats=config.structured_strict_formats,
        )
        self.grammar_actor = GrammarActor(compiler, grammar_recv)
        bitmask_filler = BitmaskFiller(config.max_running, self.model_config.vocab_size)
        kv = KVBlockManager(allocator, config.block_size, tree)
        self.scheduler = SchedulerActor(
            scheduler_config,
            kv,
            self.runner,
            scheduler_recv,
            bitmask_filler,
            step_timeout_s=config.step_timeout_s,
            step_thread=self.step_thread,
            cache_events=self.kv_events,
        )
        self.tokenizer_actor = TokenizerActor(self.tokenizer, tokenizer_recv)
        self.client = EngineClient(
            model_name=model_name,
            model_config=self.model_config,
            max_model_len=max_model_len,
            tokenizer=self.tokenizer,
            scheduler=scheduler_send,
            tokenizer_inbox=tokenizer_send,
            grammar=grammar_send,
            scheduler_stats=self.scheduler.stats,
            grammar_stats=self.grammar_actor.stats,
            max_running=config.max_running,
            max_waiting=config.max_waiting,
            num_kv_tokens=num_blocks * config.block_size,
            block_size=config.block_size,
            precision=self.precision,
            reasoning_parser=config.reasoning_parser,
        )

    def actors(self) -> list[Actor]:
        """In start order: the tokenizer, grammar and scheduler actors before anything that sends to them."""
        return [self.tokenizer_actor, self.grammar_actor, self.scheduler]
