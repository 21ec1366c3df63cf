"""The client side of an engine: messages to its actors, and each request's output as text.

:class:`EngineClient` is the only way the HTTP server, the offline :class:`trillium.LLM` and
``trillium chat`` talk to the engine: every call is a message into a bounded actor inbox (a full
inbox is :class:`EngineOverloaded`). :class:`RequestStream` turns one request's token deltas into
text (incremental detokenization, stop strings), so every caller sees the same text, finish
reasons and token counts. The engine is built by ``trillium.launch``.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec
import trio

from trillium.models import ModelConfig
from trillium.protocol import (
    AbortRequest,
    AddRequest,
    CompileGrammar,
    DetokenizeRequest,
    DetokenizeResult,
    FinishReason,
    FlushPrefixCache,
    GrammarCompiled,
    GrammarStats,
    SamplingParams,
    SchedulerStats,
    StructuredOutputs,
    TokenDelta,
    TokenizeRequest,
    TokenizeResult,
)
from trillium.runtime import Mailbox, MailboxClosed, Snapshot
from trillium.scheduler.actor import merge_deltas
from trillium.structured import CompiledGrammar, GrammarError
from trillium.tokenizer import Tokenizer
from trillium.tokenizer.detokenizer import IncrementalDetokenizer
from trillium.tokenizer.stop import StopStringMatcher

Reply = TypeVar("Reply")

# Requests that may wait for the scheduler (its waiting queue plus its inbox) before new ones
# get 503; ``trillium serve --max-waiting``.
DEFAULT_MAX_WAITING = 256


class EngineOverloaded(Exception):
    """An actor's inbox is full: the caller should retry later (HTTP 429/503)."""


class ActorFailed(Exception):
    """The actor failed while it held this request (the supervisor restarts it): HTTP 500."""


class TokenizeError(ValueError):
    """The prompt could not be rendered, encoded or decoded (HTTP 400)."""


async def ask(
    inbox: trio.MemorySendChannel[Any], name: str, message_with_reply: Callable[[trio.MemorySendChannel[Reply]], Any]
) -> Reply:
    """Send ``message_with_reply(reply)`` to an actor's inbox and wait for its one answer.

    The request/reply pattern of every actor that answers (tokenizer, grammar): ``reply`` is a
    fresh one-slot channel, so the actor's ``send_nowait`` never blocks it. Raises
    EngineOverloaded (naming the actor) when the inbox is full; nothing is sent then; ActorFailed
    when the actor closed the reply unanswered (it failed while holding the message).
    """
    send, recv = trio.open_memory_channel[Reply](1)
    try:
        inbox.send_nowait(message_with_reply(send))
    except trio.WouldBlock:
        raise EngineOverloaded(f"{name} queue is full") from None
    async with recv:
        try:
            return await recv.receive()
        except trio.EndOfChannel:  # the actor closes every reply it holds when it fails
            raise ActorFailed(f"the {name} failed while handling this request") from None


class FairAdmission:
    """The waiting queue's bound, held at the front door so that a refused request gets its 503
    (with ``Retry-After``) before its response starts, shared fairly between tenants:

    - under half full, every request is queued;
    - from half full, a tenant is refused once it has its fair share of the engine in flight
      (``(max_running + max_waiting) / tenants in flight``, counting itself);
    - full, a tenant under its share may still queue (while others are in flight too) up to twice
      ``max_waiting``: a flood that raced to fill the queue cannot lock another tenant out;
    - at twice ``max_waiting``, every request is refused.

    So a tenant at its share stops at half the queue, and one under its share finds room; the
    queue holds at most ``2 x max_waiting`` (plus what the stats snapshot has not counted yet, at
    most the inbox bound), and a lone tenant at most ``max_waiting``. The scheduler's fair queue
    decides the order.
    """

    def __init__(self, max_running: int, max_waiting: int) -> None:
        if max_waiting < 1:
            raise ValueError(f"max_waiting must be at least 1, got {max_waiting}")
        self.max_running = max_running
        self.max_waiting = max_waiting
        self.in_flight: Counter[str] = Counter()  # per tenant: streams opened and not ended

    def check(self, tenant: str, num_waiting: int) -> None:
        """Raises EngineOverloaded if ``tenant`` may not queue a request while ``num_waiting`` wait."""
        num_tenants = len(self.in_flight) + (tenant not in self.in_flight)
        under_share = self.in_flight[tenant] * num_tenants < self.max_running + self.max_waiting
        full = num_waiting >= self.max_waiting and (num_tenants == 1 or not under_share)
        if full or num_waiting >= 2 * self.max_waiting:
            raise EngineOverloaded(f"scheduler queue is full ({num_waiting} requests waiting)")
        if 2 * num_waiting >= self.max_waiting and not under_share:
            raise EngineOverloaded("scheduler queue is busy and this tenant has its fair share in flight")

    def opened(self, tenant: str) -> None:
        self.in_flight[tenant] += 1

    def ended(self, tenant: str) -> None:
        self.in_flight[tenant] -= 1
        if self.in_flight[tenant] <= 0:
            del self.in_flight[tenant]


class EngineClient:
    """The message API to one engine's actors. Every method runs on the Trio event loop.

    ``tokenizer`` is read-only here: the frontend uses it for per-token incremental
    detokenization and logprob token strings; whole prompts go through the tokenizer actor.
    """

    def __init__(
        self,
        *,
        model_name: str,
        model_config: ModelConfig,
        max_model_len: int,
        tokenizer: Tokenizer,
        scheduler: trio.MemorySendChannel[Any],
        tokenizer_inbox: trio.MemorySendChannel[Any],
        grammar: trio.MemorySendChannel[Any],
        scheduler_stats: Snapshot[SchedulerStats],
        grammar_stats: Snapshot[GrammarStats],
        max_running: int = 64,
        max_waiting: int = DEFAULT_MAX_WAITING,
        num_kv_tokens: int | None = None,
        block_size: int | None = None,
        precision: dict[str, str] | None = None,
        reasoning_parser: str | None = None,
    ) -> None:
        self.model_name = model_name
        # The served model's reasoning format (``--reasoning-parser``), which the frontend splits
        # its outputs by (server/reasoning.py); None: outputs are all content. Read-only.
        self.reasoning_parser = reasoning_parser
        # What the engine computes with (launch.precision_report): shown in /stats; read-only.
        self.precision = precision or {}
        self.block_size = block_size  # tokens per KV block (None: unknown); read-only
        self.model_config = model_config
        self.max_model_len = max_model_len
        self.num_kv_tokens = num_kv_tokens  # the KV pool's capacity (None: unknown); read-only
        self.tokenizer = tokenizer
        self._scheduler = scheduler
        self._tokenizer = tokenizer_inbox
        self._grammar = grammar
        self._scheduler_stats = scheduler_stats
        self._grammar_stats = grammar_stats
        self._ids = itertools.count()
        self.admission = FairAdmission(max_running, max_waiting)

    def new_request_id(self, prefix: str = "req") -> str:
        return f"{prefix}-{next(self._ids)}"

    async def tokenize(
        self,
        *,
        prompt: str | None = None,
        messages: list[dict[str, Any]] | None = None,
        add_special_tokens: bool = True,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        suffix: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """Encode a prompt (raw text or chat messages). Raises TokenizeError or EngineOverloaded.

        ``add_special_tokens`` applies to raw text (BOS); chat messages get the template's own.
        ``add_generation_prompt`` ends a chat with the assistant turn's header; ``tools`` are
        given to a chat template that renders them; ``chat_template_kwargs`` are more variables
        for it (``enable_thinking``); ``suffix`` makes raw text a fill-in-the-middle prompt (the
        model must have FIM tokens)."""
        result: TokenizeResult = await ask(
            self._tokenizer,
            "tokenizer",
            lambda reply: TokenizeRequest(
                prompt=prompt,
                messages=messages,
                add_special_tokens=add_special_tokens,
                add_generation_prompt=add_generation_prompt,
                tools=tools,
                suffix=suffix,
                chat_template_kwargs=chat_template_kwargs,
                reply=reply,
            ),
        )
        if result.error is not None:
            raise TokenizeError(result.error)
        return result.token_ids

    async def detokenize(self, token_ids: list[int]) -> str:
        """Decode token ids (special tokens skipped). Raises TokenizeError or EngineOverloaded."""
        result: DetokenizeResult = await ask(
            self._tokenizer, "tokenizer", lambda reply: DetokenizeRequest(token_ids, reply=reply)
        )
        if result.error is not None:
            raise TokenizeError(result.error)
        return result.text

    async def compile_grammar(self, constraint: StructuredOutputs, scope: str | None = None) -> CompiledGrammar:
        """Compile an output constraint (cached by content, per ``scope``: the asker's tenant's
        cache namespace). Raises GrammarError (malformed, unsupported, or over the compile time
        limit) or EngineOverloaded."""
        result: GrammarCompiled = await ask(
            self._grammar, "grammar", lambda reply: CompileGrammar(constraint=constraint, reply=reply, scope=scope)
        )
        if result.error is not None:
            raise GrammarError(result.error)
        grammar: CompiledGrammar = result.grammar  # protocol/ carries it untyped (no upward import)
        return grammar

    def check_admission(self, tenant: str) -> None:
        """Raises EngineOverloaded if ``tenant`` may not queue a request now (:class:`FairAdmission`).
        :meth:`submit` checks; callers may check first to refuse before costlier work."""
        # Waiting: as the scheduler last published it, plus the messages it has not drained yet.
        num_waiting = self._scheduler_stats.latest.num_requests_waiting
        self.admission.check(tenant, num_waiting + self._scheduler.statistics().current_buffer_used)

    def submit(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: SamplingParams,
        cache_salt: str | None = None,
        grammar: CompiledGrammar | None = None,
        *,
        tenant: str = "",
        priority: int = 0,
        cache_scope: str | None = None,
        num_public_tokens: int = 0,
    ) -> Mailbox[TokenDelta]:
        """Queue a request; its deltas arrive in the returned mailbox. Raises EngineOverloaded (the
        waiting queue is full, or ``tenant`` has its share of it: :class:`FairAdmission`), or
        SamplingParamError for token ids outside the vocabulary.
        A request with ``sampling.structured`` needs its ``grammar`` from :meth:`compile_grammar`;
        ValueError for a prompt of no tokens (nothing for the model to continue). ``cache_scope``:
        the tenant's prefix-cache namespace (``AddRequest.cache_scope``); ``num_public_tokens``: the
        leading tokens shared with a declared public prefix (``AddRequest.num_public_tokens``)."""
        if not prompt_token_ids:
            raise ValueError("the prompt has no tokens")
        if (sampling.structured is None) != (grammar is None):
            raise ValueError("a constrained request needs its compiled grammar (and only it)")
        sampling.check_vocab(self.model_config.vocab_size)  # SamplingParamError (a ValueError)
        if grammar is not None:
            grammar.check_allowance(sampling)  # SamplingParamError
        self.check_admission(tenant)
        mailbox: Mailbox[TokenDelta] = Mailbox(merge_deltas)
        message = AddRequest(
            request_id=request_id,
            prompt_token_ids=prompt_token_ids,
            sampling=sampling,
            reply=mailbox,
            arrival_time=time.monotonic(),
            cache_salt=cache_salt,
            cache_scope=cache_scope,
            num_public_tokens=num_public_tokens,
            grammar=grammar,
            tenant=tenant,
            priority=priority,
        )
        try:
            self._scheduler.send_nowait(message)
        except trio.WouldBlock:
            raise EngineOverloaded("scheduler queue is full") from None
        return mailbox

    def open_stream(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: SamplingParams,
        cache_salt: str | None = None,
        grammar: CompiledGrammar | None = None,
        *,
        tenant: str = "",
        priority: int = 0,
        cache_scope: str | None = None,
        num_public_tokens: int = 0,
    ) -> RequestStream:
        """Submit a request and return its text stream. Raises EngineOverloaded. ``tenant`` (whose
        fair share it uses) and ``priority`` (inside the tenant, lower first): see
        ``scheduler/fair_queue.py``; the stream counts in its tenant's share until it ends."""
        mailbox = self.submit(
            request_id,
            prompt_token_ids,
            sampling,
            cache_salt,
            grammar,
            tenant=tenant,
            priority=priority,
            cache_scope=cache_scope,
            num_public_tokens=num_public_tokens,
        )
        self.admission.opened(tenant)
        return RequestStream(
            self, request_id, len(prompt_token_ids), sampling, mailbox, on_end=lambda: self.admission.ended(tenant)
        )

    def abort(self, request_id: str, mailbox: Mailbox[TokenDelta] | None = None) -> None:
        """Abort without awaiting (safe in ``finally`` blocks). The closed mailbox is the fallback
        signal: the scheduler also aborts requests whose consumer went away."""
        if mailbox is not None:
            mailbox.close_consumer()
        try:
            self._scheduler.send_nowait(AbortRequest(request_id))
        except (trio.WouldBlock, trio.ClosedResourceError):
            pass

    def flush_prefix_cache(self) -> None:
        """Ask the scheduler to drop every cached prefix no request holds (applied before its next
        step; ``num_cached_blocks`` in :meth:`stats` shows it). EngineOverloaded when its inbox is
        full."""
        try:
            self._scheduler.send_nowait(FlushPrefixCache())
        except trio.WouldBlock as exc:
            raise EngineOverloaded("scheduler inbox is full") from exc

    def stats(self) -> dict[str, Any]:
        """The latest counters the scheduler and grammar actors published (``/stats``, ``/metrics``)."""
        return {
            **msgspec.structs.asdict(self._scheduler_stats.latest),
            **msgspec.structs.asdict(self._grammar_stats.latest),
            **self.precision,
        }


@dataclasses.dataclass
class StreamOutput:
    """What one iteration of a :class:`RequestStream` adds.

    ``prompt_logprobs`` is set on the stream's first output only, when the request's sampling
    params asked for them (``SamplingParams.prompt_logprobs``) and its prefill completed (not on
    an output that ends the request before its first token, e.g. an error): aligned with the
    prompt's token ids, entry p the (logprob of prompt token p given tokens 0 .. p-1, [(token
    id, logprob)] top k best first) and entry 0 None (nothing precedes the first token), as
    OpenAI's ``echo`` and vLLM's ``prompt_logprobs`` report them. :attr:`RequestStream.prompt_logprobs`
    keeps the same list.
    """

    text: str  # new text; always whole UTF-8 characters, never part of a stop string
    token_ids: list[int]  # new token ids
    finish_reason: FinishReason | None = None
    error: str | None = None
    # One (chosen logprob, [(token id, logprob)] best first) per new token id, when asked.
    logprobs: list[tuple[float, list[tuple[int, float]]]] | None = None
    prompt_logprobs: list[tuple[float, list[tuple[int, float]]] | None] | None = None
    closed_early: bool = False  # with LENGTH: the JSON output was closed before max_tokens (TokenDelta)
    unsatisfied_check: str | None = None  # with closed_early: the check the closing fails (TokenDelta)


class RequestStream:
    """Async iterator of :class:`StreamOutput` for one submitted request.

    Stopping early (a stop string, or the consumer leaving) aborts the engine request;
    :meth:`abort` is synchronous so that it is safe in ``finally`` blocks.
    """

    def __init__(
        self,
        client: EngineClient,
        request_id: str,
        num_prompt_tokens: int,
        sampling: SamplingParams,
        mailbox: Mailbox[TokenDelta],
        on_end: Callable[[], None] | None = None,
    ) -> None:
        self.client = client
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens
        self.num_completion_tokens = 0
        self.num_cached_tokens = 0
        self.finish_reason: FinishReason | None = None
        # Timing for metering (monotonic seconds): when tokens reached this stream, the seconds
        # between consecutive deltas spread over their tokens (k tokens after t seconds count
        # t/k each), and the scheduler's queue time.
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        self.inter_token_seconds: list[float] = []
        self.queue_time: float | None = None
        # With ``sampling.prompt_logprobs``: set when the first delta arrives (see StreamOutput).
        self.prompt_logprobs: list[tuple[float, list[tuple[int, float]]] | None] | None = None
        self._mailbox = mailbox
        self._engine_done = False  # the engine finished or was told to abort
        self._on_end = on_end  # called once, when the engine is done with the request
        self._detok = IncrementalDetokenizer(client.tokenizer, skip_special_tokens=sampling.skip_special_tokens)
        self._stop = StopStringMatcher(sampling.stop)
        self._eos = client.tokenizer.eos_token_ids

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> StreamOutput:
        if self.finish_reason is not None:
            raise StopAsyncIteration
        try:
            delta = await self._mailbox.get()
        except MailboxClosed:
            self._engine_done = True
            self._ended()
            self.finish_reason = FinishReason.ABORT
            return StreamOutput("", [], FinishReason.ABORT)
        self.num_completion_tokens += len(delta.token_ids)
        if delta.token_ids:
            self._time_tokens(len(delta.token_ids))
        if delta.queue_time is not None:
            self.queue_time = delta.queue_time
        self.num_cached_tokens = max(self.num_cached_tokens, delta.num_cached_tokens)
        prompt_logprobs = None
        if delta.prompt_logprobs is not None:
            prompt_logprobs = self.prompt_logprobs = [None, *delta.prompt_logprobs]
        reason = delta.finish_reason
        self._engine_done = reason is not None
        if self._engine_done:
            self._ended()
        shown = delta.token_ids
        if reason == FinishReason.STOP and shown and shown[-1] in self._eos:
            shown = shown[:-1]  # the end-of-turn token that stopped it is no text, special tokens shown or not
        text = self._detok.add(shown)
        if reason is not None:
            text += self._detok.flush()
        text = self._stop.feed(text)
        if self._stop.stopped:
            if reason is None:
                self.abort()  # the engine would go on generating past the stop string
            reason = FinishReason.STOP
        elif reason is not None:
            text += self._stop.flush()
        self.finish_reason = reason
        return StreamOutput(
            text,
            delta.token_ids,
            reason,
            delta.error,
            delta.logprobs,
            prompt_logprobs,
            delta.closed_early,
            delta.unsatisfied_check,
        )

    @property
    def stop_string(self) -> str | None:
        """The request's stop string that ended it (None: none did, or not yet)."""
        return self._stop.matched

    def _time_tokens(self, num_tokens: int) -> None:
        now = time.monotonic()
        if self.last_token_time is None:
            self.first_token_time = now
        else:
            gap = (now - self.last_token_time) / num_tokens
            self.inter_token_seconds.extend([gap] * num_tokens)
        self.last_token_time = now

    def abort(self) -> None:
        """Tell the engine to drop this request and free its blocks now (idempotent)."""
        if self._engine_done:
            return
        self._engine_done = True
        self._ended()
        self.client.abort(self.request_id, self._mailbox)

    def _ended(self) -> None:
        on_end, self._on_end = self._on_end, None
        if on_end is not None:
            on_end()
