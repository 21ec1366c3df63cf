"""Wiring: build the model, tokenizer and actors of one engine, and the client API to them.

Both the HTTP server and the offline :class:`trillium.LLM` go through :class:`EngineClient`,
so they share one scheduler and one request path.
"""

from __future__ import annotations

import itertools
import logging
import time

import torch
import trio

from trillium import _core
from trillium.config import EngineConfig
from trillium.engine.runner import ModelRunner, kv_bytes_per_block
from trillium.models import ModelConfig, default_model_path, load_model
from trillium.models.registry import can_run_quantized
from trillium.protocol import (
    AbortRequest,
    AddRequest,
    CompileGrammar,
    SamplingParams,
    StructuredOutputs,
    TokenDelta,
    TokenizeRequest,
)
from trillium.request_stream import RequestStream
from trillium.runtime import GRAMMAR_INBOX_BOUND, INBOX_BOUND, TOKENIZER_INBOX_BOUND, Actor, Mailbox, open_inbox
from trillium.scheduler import SchedulerConfig
from trillium.scheduler.actor import SchedulerActor, merge_deltas
from trillium.scheduler.kv_manager import KVBlockManager
from trillium.structured import BitmaskFiller, CompiledGrammar, GrammarCompiler, GrammarError, build_ll_tokenizer
from trillium.structured.actor import GrammarActor
from trillium.tokenizer import load_tokenizer
from trillium.tokenizer.actor import TokenizerActor

log = logging.getLogger("trillium")


class EngineOverloaded(Exception):
    """The scheduler's inbox is full: the caller should retry later (HTTP 429/503)."""


class TokenizeError(ValueError):
    """The prompt could not be rendered or encoded (HTTP 400)."""


def _use_quantized_weights(config: EngineConfig, path: str) -> bool:
    """Resolve ``config.weights`` for this model file and machine (ValueError if ``quantized``
    was asked for and cannot run here). With ``--dtype auto`` and ``--weights auto``, a model whose
    projections the quantized kernel takes is served that way in fp32 even on a CPU with native
    bf16 (``config.dtype`` is switched to fp32): measured on an AVX512-BF16 EPYC, quantized fp32
    decoded 1.3-1.7x (1 stream) and 1.0-1.2x (32 streams) faster than dense bf16."""
    if config.weights == "dense":
        return False
    if config.weights == "auto" and config.dtype_auto and config.dtype != "fp32":
        if can_run_quantized(path, torch.float32)[0]:
            config.dtype = "fp32"
            return True
    ok, why = can_run_quantized(path, config.torch_dtype)
    if config.weights != "auto" and not ok:
        raise ValueError(f"--weights {config.weights}: {why}")
    if not ok:
        log.info("dense weights: %s", why)
    return ok


class Engine:
    """Loads everything (synchronously, at start-up) and owns the actors' inboxes."""

    def __init__(self, config: EngineConfig, *, progress: bool = True) -> None:
        self.config = config
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        path = config.model or default_model_path()
        quantized = _use_quantized_weights(config, path)
        int8 = quantized and config.weights == "quantized-int8"
        log.info("loading model from %s (%s activations, %s weights)", path, "int8" if int8 else config.dtype,
                 "quantized" if quantized else "dense")
        self.model, self.model_config = load_model(path, dtype=config.torch_dtype, progress=progress,
                                                   quantized=quantized, int8_activations=int8)
        self.tokenizer = load_tokenizer(path)
        self.model_name = config.served_model_name or self.model_config.name
        self.max_model_len = min(config.max_model_len or self.model_config.max_position_embeddings,
                                 self.model_config.max_position_embeddings)

        num_blocks = int(config.kv_cache_gib * 2**30) // kv_bytes_per_block(
            self.model_config, config.block_size, config.torch_dtype
        )
        log.info("KV cache: %d blocks of %d tokens (%.2f GiB)", num_blocks, config.block_size, config.kv_cache_gib)
        allocator = _core.BlockAllocator(num_blocks)
        tree = _core.RadixTree(allocator, config.block_size) if config.enable_prefix_cache else None
        self.kv = KVBlockManager(allocator, config.block_size, tree)
        self.runner = ModelRunner(
            self.model, self.model_config, num_blocks=num_blocks, block_size=config.block_size,
            dtype=config.torch_dtype,
        )
        self.scheduler_config = SchedulerConfig(
            block_size=config.block_size,
            max_running=config.max_running,
            max_tokens_per_step=config.max_tokens_per_step,
            max_model_len=self.max_model_len,
            eos_token_ids=frozenset(self.tokenizer.eos_token_ids),
            model_key=f"{self.model_name}:{path}",
        )
        self._scheduler_send, scheduler_recv = open_inbox(INBOX_BOUND)
        self._tokenizer_send, tokenizer_recv = open_inbox(TOKENIZER_INBOX_BOUND)
        self._grammar_send, grammar_recv = open_inbox(GRAMMAR_INBOX_BOUND)
        # Structured output: llguidance's view of the vocabulary, the compile cache, and the
        # step bitmask (one row per running request) that the grammar thread fills.
        self.grammar_compiler = GrammarCompiler(build_ll_tokenizer(self.tokenizer, self.model_config.vocab_size))
        self.grammar_actor = GrammarActor(self.grammar_compiler, grammar_recv)
        bitmask_filler = BitmaskFiller(config.max_running, self.model_config.vocab_size)
        self.scheduler = SchedulerActor(self.scheduler_config, self.kv, self.runner, scheduler_recv, bitmask_filler)
        self.tokenizer_actor = TokenizerActor(self.tokenizer, tokenizer_recv)
        self.client = EngineClient(self)

    def actors(self) -> list[Actor]:
        """In start order: the tokenizer, grammar and scheduler actors before anything that sends to them."""
        return [self.tokenizer_actor, self.grammar_actor, self.scheduler]


class EngineClient:
    """The message API to an engine's actors. Every method runs on the Trio event loop."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.tokenizer = engine.tokenizer
        self.model_name = engine.model_name
        self.model_config: ModelConfig = engine.model_config
        self.max_model_len = engine.max_model_len
        self._ids = itertools.count()

    def new_request_id(self, prefix: str = "req") -> str:
        return f"{prefix}-{next(self._ids)}"

    async def tokenize(self, *, prompt: str | None = None, messages: list[dict] | None = None) -> list[int]:
        """Encode a prompt (raw text or chat messages). Raises TokenizeError or EngineOverloaded."""
        send, recv = trio.open_memory_channel(1)
        try:
            self._engine._tokenizer_send.send_nowait(TokenizeRequest(prompt=prompt, messages=messages, reply=send))
        except trio.WouldBlock:
            raise EngineOverloaded("tokenizer queue is full") from None
        async with recv:
            result = await recv.receive()
        if result.error is not None:
            raise TokenizeError(result.error)
        return result.token_ids

    async def compile_grammar(self, constraint: StructuredOutputs) -> CompiledGrammar:
        """Compile an output constraint (cached by content). Raises GrammarError (malformed,
        unsupported, or over the compile time limit) or EngineOverloaded."""
        send, recv = trio.open_memory_channel(1)
        try:
            self._engine._grammar_send.send_nowait(CompileGrammar(constraint=constraint, reply=send))
        except trio.WouldBlock:
            raise EngineOverloaded("grammar queue is full") from None
        async with recv:
            result = await recv.receive()
        if result.error is not None:
            raise GrammarError(result.error)
        return result.grammar

    def submit(self, request_id: str, prompt_token_ids: list[int], sampling: SamplingParams,
               cache_salt: str | None = None, grammar: CompiledGrammar | None = None) -> Mailbox[TokenDelta]:
        """Queue a request; its deltas arrive in the returned mailbox. Raises EngineOverloaded.
        A request with ``sampling.structured`` needs its ``grammar`` from :meth:`compile_grammar`."""
        if (sampling.structured is None) != (grammar is None):
            raise ValueError("a constrained request needs its compiled grammar (and only it)")
        mailbox: Mailbox[TokenDelta] = Mailbox(merge_deltas)
        message = AddRequest(
            request_id=request_id, prompt_token_ids=prompt_token_ids, sampling=sampling, reply=mailbox,
            arrival_time=time.monotonic(), cache_salt=cache_salt, grammar=grammar,
        )
        try:
            self._engine._scheduler_send.send_nowait(message)
        except trio.WouldBlock:
            raise EngineOverloaded("scheduler queue is full") from None
        return mailbox

    def open_stream(self, request_id: str, prompt_token_ids: list[int], sampling: SamplingParams,
                    cache_salt: str | None = None, grammar: CompiledGrammar | None = None) -> RequestStream:
        """Submit a request and return its text stream. Raises EngineOverloaded."""
        mailbox = self.submit(request_id, prompt_token_ids, sampling, cache_salt, grammar)
        return RequestStream(self, request_id, len(prompt_token_ids), sampling, mailbox)

    def abort(self, request_id: str, mailbox: Mailbox | None = None) -> None:
        """Abort without awaiting (safe in ``finally`` blocks). The closed mailbox is the fallback
        signal: the scheduler also aborts requests whose consumer went away."""
        if mailbox is not None:
            mailbox.close_consumer()
        try:
            self._engine._scheduler_send.send_nowait(AbortRequest(request_id))
        except (trio.WouldBlock, trio.ClosedResourceError):
            pass

    def stats(self) -> dict:
        return {**self._engine.scheduler.stats(), **self._engine.grammar_actor.stats()}
