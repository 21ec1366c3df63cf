"""msgspec messages exchanged by the actors.

The wire structs are ``array_like`` and ``gc=False`` (they hold no cycles), so they are cheap
to build per token. ``reply`` fields carry the in-process sink that the receiver answers on;
those structs never leave the process and are never encoded.
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec

from trillium.protocol.structured import StructuredOutputs


class FinishReason(enum.IntEnum):
    """Why a request stopped producing tokens (OpenAI ``finish_reason`` for the first two)."""

    STOP = 0  # EOS, a stop token id, or a stop string
    LENGTH = 1  # max_tokens or the model's context length reached
    ABORT = 2  # client disconnect or an explicit abort
    ERROR = 3  # the engine failed this request; the server keeps serving

    @property
    def openai_name(self) -> str:
        return ("stop", "length", "abort", "error")[self]


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
    structured: StructuredOutputs | None = None  # output constraint (JSON Schema, regex, choice, grammar)

    @property
    def needs_history(self) -> bool:
        """Whether the sampler needs the request's token ids (penalties)."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"temperature must be in [0, 2], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or at least 1, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.repetition_penalty <= 0.0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")


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
    cache_salt: str | None = None  # isolates this tenant's prefix cache entries
    grammar: Any = None  # structured.CompiledGrammar for ``sampling.structured`` (compiled by the grammar actor)


class AbortRequest(msgspec.Struct, array_like=True, gc=False):
    """Frontend -> scheduler: forget this request and free its blocks now."""

    request_id: str


class TokenDelta(msgspec.Struct, array_like=True, gc=False, omit_defaults=True):
    """Scheduler -> frontend: new token ids of one request, oldest first.

    The last delta of a request carries ``finish_reason``; ``error`` is set only with
    ``FinishReason.ERROR``. Several deltas may be merged by the mailbox when a client is slow.
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


class TokenizeRequest(msgspec.Struct, gc=False, kw_only=True):
    """Frontend -> tokenizer: render (for chat) and encode one prompt.

    Exactly one of ``prompt`` (raw text) and ``messages`` (chat) is set. ``reply`` is a
    one-shot sink (``trio.MemorySendChannel``) that receives a :class:`TokenizeResult`.
    """

    prompt: str | None = None
    messages: list[dict] | None = None
    add_generation_prompt: bool = True
    reply: Any = None


class TokenizeResult(msgspec.Struct, gc=False):
    """Tokenizer -> frontend: the prompt ids, or the error that prevented them."""

    token_ids: list[int]
    error: str | None = None
