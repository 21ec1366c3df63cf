"""msgspec messages exchanged by the actors.

The wire structs are ``array_like`` and ``gc=False`` (they hold no cycles), so they are cheap
to build per token. ``reply`` fields carry the in-process sink that the receiver answers on;
those structs never leave the process and are never encoded.
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec

from trillium.protocol.structured import StructuredOutputs, ThinkSection


class FinishReason(enum.IntEnum):
    """Why a request stopped producing tokens (OpenAI ``finish_reason`` for the first two)."""

    STOP = 0  # EOS, a stop token id, or a stop string
    LENGTH = 1  # max_tokens or the model's context length reached
    ABORT = 2  # client disconnect or an explicit abort
    ERROR = 3  # the engine failed this request; the server keeps serving

    @property
    def openai_name(self) -> str:
        return ("stop", "length", "abort", "error")[self]


MAX_STOP_STRINGS = 16
MAX_STOP_TOKEN_IDS = 1024  # each generated token is looked up in them
MAX_LOGPROBS = 20  # alternatives per token (OpenAI's top_logprobs limit)
# Seeds seed a torch.Generator, which takes a 64-bit value (negative ones wrap, as in torch).
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1


class SamplingParamError(ValueError):
    """A sampling parameter out of range; ``param`` names it (the server's 400 carries it)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param} {message}")
        self.param = param


class SamplingParams(msgspec.Struct, omit_defaults=True, kw_only=True):
    """How to pick the next tokens of one request.

    ``temperature == 0`` means greedy. ``max_tokens=None`` means "until the context is full".
    ``stop`` strings are matched on detokenized text by the frontend; ``stop_token_ids`` and
    EOS are matched on token ids by the scheduler.
    """

    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop: list[str] = msgspec.field(default_factory=list)
    stop_token_ids: list[int] = msgspec.field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    min_p: float = 0.0
    presence_penalty: float = 0.0  # OpenAI: subtracted once from every token already generated
    frequency_penalty: float = 0.0  # OpenAI: subtracted per occurrence in the output so far
    repetition_penalty: float = 1.0  # vLLM/HF: divides positive (multiplies negative) logits of
    #                                  tokens seen in prompt or output
    logit_bias: dict[int, float] = msgspec.field(default_factory=dict)
    min_tokens: int = 0  # EOS and stop token ids are ignored before this many output tokens
    logprobs: int | None = None  # None: off; k >= 0: chosen token's logprob plus top k
    # None: off; k >= 0: each prompt token's logprob given the tokens before it (the model's raw
    # log-softmax: no bias, penalties, temperature or grammar) plus the top k at its position.
    # Such a request computes its whole prompt (no prefix-cache reuse).
    prompt_logprobs: int | None = None
    structured: StructuredOutputs | None = None  # output constraint (JSON Schema, regex, choice, grammar)
    # With a JSON constraint: close the structure (shortest valid completion) when the allowance
    # left reaches the tokens closing needs, so a LENGTH-cut output still parses (see
    # docs/decisions/structured-output.md). False: cut wherever max_tokens falls.
    close_structured_output: bool = True
    # With a constraint: it applies only after the model's think section (a reasoning model's
    # answer after its thinking; ``structured.controller``). None: from the first token.
    structured_after_think: ThinkSection | None = None

    @property
    def needs_history(self) -> bool:
        """Whether the sampler needs the request's token ids (penalties)."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    def __post_init__(self) -> None:
        """The one place sampling ranges are checked (the server maps the error to a 400 naming
        ``param``). Vocabulary-dependent checks are in :meth:`check_vocab`."""
        if self.max_tokens is not None and self.max_tokens < 1:
            raise SamplingParamError("max_tokens", f"must be at least 1, got {self.max_tokens}")
        _check_range("temperature", self.temperature, 0.0, 2.0)
        if not 0.0 < self.top_p <= 1.0:
            raise SamplingParamError("top_p", f"must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise SamplingParamError("top_k", f"must be -1 (disabled) or at least 1, got {self.top_k}")
        _check_range("min_p", self.min_p, 0.0, 1.0)
        _check_range("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _check_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        if not self.repetition_penalty > 0.0:
            raise SamplingParamError("repetition_penalty", f"must be greater than 0, got {self.repetition_penalty}")
        if self.min_tokens < 0 or (self.max_tokens is not None and self.min_tokens > self.max_tokens):
            raise SamplingParamError("min_tokens", f"must be between 0 and max_tokens, got {self.min_tokens}")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise SamplingParamError("stop", f"at most {MAX_STOP_STRINGS} stop strings are allowed")
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise SamplingParamError("stop_token_ids", f"at most {MAX_STOP_TOKEN_IDS} token ids are allowed")
        if self.seed is not None and not SEED_MIN <= self.seed <= SEED_MAX:
            raise SamplingParamError("seed", f"must be between {SEED_MIN} and {SEED_MAX}, got {self.seed}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise SamplingParamError("logprobs", f"must be between 0 and {MAX_LOGPROBS}, got {self.logprobs}")
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= MAX_LOGPROBS:
            raise SamplingParamError(
                "prompt_logprobs", f"must be between 0 and {MAX_LOGPROBS}, got {self.prompt_logprobs}"
            )
        for token_id, bias in self.logit_bias.items():
            if not -100.0 <= bias <= 100.0:
                raise SamplingParamError(
                    "logit_bias", f"values must be between -100 and 100, got {bias} for token {token_id}"
                )

    def check_vocab(self, vocab_size: int) -> None:
        """Token ids in ``stop_token_ids`` and ``logit_bias`` must be in ``[0, vocab_size)``."""
        if any(not 0 <= t < vocab_size for t in self.stop_token_ids):
            raise SamplingParamError("stop_token_ids", f"must be in [0, {vocab_size})")
        for token_id in self.logit_bias:
            if not 0 <= token_id < vocab_size:
                raise SamplingParamError(
                    "logit_bias", f"token id {token_id} is outside the vocabulary [0, {vocab_size})"
                )


def _check_range(param: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise SamplingParamError(param, f"must be between {low:g} and {high:g}, got {value}")


class AddRequest(msgspec.Struct, gc=False, kw_only=True):
    """Frontend -> scheduler: start generating for a tokenized prompt.

    ``reply`` is a :class:`trillium.runtime.Mailbox` that receives :class:`TokenDelta`s; the
    scheduler stops delivering (and aborts the request) once the mailbox is closed.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    reply: Any
    arrival_time: float = 0.0
    cache_salt: str | None = None  # isolates this request's prefix cache entries (inside its scope)
    # The prefix-cache namespace of the request's tenant (``AccessConfig.cache_scopes``); None on
    # an open server, where every request shares the model's namespace.
    cache_scope: str | None = None
    # Leading prompt tokens shared with a declared public prefix: their blocks are cached once for
    # every tenant (scheduler/kv_manager.py). 0 with a ``cache_salt`` or on an open server.
    num_public_tokens: int = 0
    grammar: Any = None  # structured.CompiledGrammar for ``sampling.structured`` (compiled by the grammar actor)
    tenant: str = ""  # whose fair share of the scheduler it uses (API key's tenant, else ``user``)
    priority: int = 0  # inside its tenant: lower is scheduled sooner (vLLM's ``priority``)


class AbortRequest(msgspec.Struct, array_like=True, gc=False):
    """Frontend -> scheduler: forget this request and free its blocks now."""

    request_id: str


class FlushPrefixCache(msgspec.Struct, array_like=True, gc=False):
    """Frontend -> scheduler: drop every cached prefix no running request holds (``POST
    /flush_cache``; a router fans it out to its workers). Blocks a request uses stay."""


class TokenDelta(msgspec.Struct, array_like=True, gc=False, omit_defaults=True):
    """Scheduler -> frontend: new token ids of one request, oldest first.

    The last delta of a request carries ``finish_reason``; ``error`` is set only with
    ``FinishReason.ERROR``. Several deltas may be merged by the mailbox when a client is slow.
    ``prompt_logprobs`` (when the request asked for them) come once, in the request's first
    delta (its prefill is complete then): one entry per prompt position 1 .. P-1, the logprob of
    that prompt token given the ones before it and the top alternatives there (position 0 has
    nothing before it, so no entry).
    """

    request_id: str
    token_ids: list[int]
    finish_reason: FinishReason | None = None
    num_prompt_tokens: int = 0
    error: str | None = None
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    # One entry per token id when the request asked for logprobs:
    # (logprob of the chosen token, [(top token id, logprob), ...] best first)
    logprobs: list[tuple[float, list[tuple[int, float]]]] | None = None
    queue_time: float | None = None  # seconds from arrival to the request's first step, once it had one
    # (logprob of prompt token p, [(top token id, logprob), ...] best first) for p = 1 .. P-1
    prompt_logprobs: list[tuple[float, list[tuple[int, float]]]] | None = None
    # With LENGTH: the output's JSON structure was closed by the grammar's shortest completion
    # before max_tokens cut it (its last tokens were appended, not sampled: no logprobs).
    closed_early: bool = False
    # With closed_early: the value check (a keyword beyond the grammar) that no closing within
    # max_tokens satisfied; the output parses but fails that check. None: it passes every check.
    unsatisfied_check: str | None = None


class TokenizeRequest(msgspec.Struct, gc=False, kw_only=True):
    """Frontend -> tokenizer: render (for chat) and encode one prompt.

    Exactly one of ``prompt`` (raw text) and ``messages`` (chat) is set. ``reply`` is a
    one-shot sink (``trio.MemorySendChannel``) that receives a :class:`TokenizeResult`.
    """

    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    add_special_tokens: bool = True  # raw text only: the tokenizer's BOS (chat templates bring their own)
    add_generation_prompt: bool = True  # chat only: end with the assistant turn's header
    tools: list[dict[str, Any]] | None = None  # chat only: OpenAI ``tools``, for a template that renders them
    # chat only: more variables for the template (a request's ``chat_template_kwargs``: ``enable_thinking``)
    chat_template_kwargs: dict[str, Any] | None = None
    suffix: str | None = None  # raw text only: a fill-in-the-middle prompt (``Tokenizer.fim_prompt``)
    reply: Any = None


class TokenizeResult(msgspec.Struct, gc=False):
    """Tokenizer -> frontend: the prompt ids, or the error that prevented them."""

    token_ids: list[int]
    error: str | None = None


class DetokenizeRequest(msgspec.Struct, gc=False):
    """Frontend -> tokenizer: decode token ids to text (special tokens skipped).

    ``reply`` is a one-shot sink that receives a :class:`DetokenizeResult`."""

    token_ids: list[int]
    reply: Any = None


class DetokenizeResult(msgspec.Struct, gc=False):
    """Tokenizer -> frontend: the text, or the error that prevented it."""

    text: str
    error: str | None = None
