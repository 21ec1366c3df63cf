"""Constraint -> llguidance grammar -> a compiled, cached :class:`CompiledGrammar`.

Compiling builds llguidance's lexer and parser tables for one grammar against the model's
vocabulary (milliseconds for most JSON Schemas, up to seconds for large ones). The result is
a pristine matcher that every request with the same constraint deep-copies (microseconds), so
the cache maps a content hash of the normalized constraint to it, least recently used first
out. Thread-safe: :meth:`GrammarCompiler.compile` runs in the grammar actor's worker threads.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import llguidance

from trillium.protocol import SamplingParamError, SamplingParams, StructuredOutputs
from trillium.protocol.structured import JSON_OPTIONS
from trillium.structured.call_checks import CallChecks, prepare_call_grammar
from trillium.structured.closer import Closer
from trillium.structured.controller import OutputController, StructuredCounters
from trillium.structured.formats import ignored_formats_warning
from trillium.structured.guard import CompletionIndex, OutputGuard
from trillium.structured.matcher import GrammarMatcher
from trillium.structured.schema_rewrite import prepare_schema
from trillium.structured.value_checks import CheckNode, ValueChecker

if TYPE_CHECKING:
    import tokenizers

CACHE_SIZE = 256  # compiled grammars kept; an agent fleet reuses a handful of schemas

# llguidance's own resource limits bound the work of one compile (its "fuel"); the actor's
# wall-clock limit is the second line of defence. Its per-step Earley limits are raised 4x:
# with the defaults, an any-JSON value (additionalProperties: true) holding a key like
# `type':'integer` stopped the parser as "too complex" in the middle of a speculative step's
# draft-row fill, and the request failed with a token its mask had allowed.
PARSER_LIMITS = llguidance.LLParserLimits(max_items_in_row=8000, step_max_items=200_000)


class GrammarError(ValueError):
    """The constraint is malformed, uses an unsupported feature, or could not be compiled.
    ``param`` names the request field it came from (set by the frontend)."""


class _Vocabulary(Protocol):
    """What :func:`build_ll_tokenizer` reads of a ``trillium.tokenizer.Tokenizer`` (a module of
    the same layer, so not imported here)."""

    _backend: tokenizers.Tokenizer
    eos_token_ids: frozenset[int]


def build_ll_tokenizer(tokenizer: _Vocabulary, vocab_size: int) -> llguidance.LLTokenizer:
    """llguidance's view of our tokenizer (its ``tokenizers`` JSON, the model's vocabulary size and
    EOS ids). Takes ~0.3 s for a 50k vocabulary: build once per engine."""
    return llguidance.LLTokenizer(
        tokenizer._backend.to_str(), n_vocab=vocab_size, eos_token=sorted(tokenizer.eos_token_ids)
    )


def constraint_key(constraint: StructuredOutputs) -> tuple[str, str]:
    """(kind, normalized text) of the one constraint set; ValueError naming the problem otherwise.

    JSON Schemas keep their key order (it is the order properties are generated in); only
    whitespace is normalized, so equal schemas sent with different formatting share a cache entry.
    """
    set_fields = [
        name
        for name in ("json", "regex", "choice", "grammar", "json_object")
        if getattr(constraint, name) not in (None, False)
    ]
    if len(set_fields) != 1:
        raise GrammarError(
            f"exactly one of json, regex, choice, grammar, json_object must be set, got {set_fields or 'none'}"
        )
    kind = set_fields[0]
    value: Any = getattr(constraint, kind)
    if kind == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise GrammarError(f"the JSON schema is not valid JSON: {exc}") from None
        if not isinstance(value, (dict, bool)):
            raise GrammarError(f"a JSON schema must be an object, got {type(value).__name__}")
        return "json", json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    if kind == "choice":
        if not value or any(not isinstance(c, str) or not c for c in value):
            raise GrammarError("choice must be a non-empty list of non-empty strings")
        return "choice", json.dumps(value, ensure_ascii=False)
    if kind == "json_object":
        return "json", '{"type":"object"}'
    if not value:
        raise GrammarError(f"{kind} must not be empty")
    return kind, value


class CompiledGrammar:
    """A compiled constraint: hands out fresh per-request matchers. Immutable after construction."""

    def __init__(
        self,
        key: str,
        kind: str,
        template: llguidance.LLMatcher,
        closer: Closer | None = None,
        checks: CheckNode | CallChecks | None = None,
        completion_index: CompletionIndex | None = None,
        token_bytes: Callable[[int], bytes] | None = None,
        ignored_formats: tuple[str, ...] = (),
    ) -> None:
        self.key = key  # content hash of (kind, normalized text)
        self.kind = kind
        self._template = template  # never advanced: only deep-copied
        self.closer = closer  # JSON constraints: how outputs are closed before max_tokens
        # The schema's keywords the grammar could not express, checked as values complete
        # (``guard``): a JSON Schema's, or a tool-call grammar's calls'; None when the grammar
        # enforces the whole constraint. ``token_bytes`` comes with them.
        self.checks = checks
        self._completion_index = completion_index
        self._token_bytes = token_bytes
        # Formats the JSON Schema names that the server does not know: not enforced (annotations,
        # as JSON Schema reads them since 2019-09); the frontend tells the client.
        self.ignored_formats = ignored_formats
        # Tokens of the shortest complete output the closer finds from the start (0: no closer):
        # a smaller max_tokens could not be closed in time.
        closing = closer.closing(template) if closer is not None else None
        self.min_output_tokens = len(closing) if closing is not None else 0

    @property
    def warning(self) -> str | None:
        """What the client should be told of this constraint (the formats it ignored), or None."""
        return ignored_formats_warning(self.ignored_formats) if self.ignored_formats else None

    def check_allowance(self, sampling: SamplingParams) -> None:
        """SamplingParamError naming ``max_tokens`` when the request asks to close its output
        (the default) but allows fewer tokens than the shortest complete output takes."""
        limit = sampling.max_tokens
        if sampling.close_structured_output and limit is not None and limit < self.min_output_tokens:
            raise SamplingParamError(
                "max_tokens",
                f"is {limit}: the shortest output the schema allows takes "
                f"{self.min_output_tokens} tokens (or set close_structured_output to false)",
            )

    def new_matcher(self, *, close: bool = True) -> GrammarMatcher:
        """A fresh matcher; ``close=False`` opts out of closing the output early."""
        guard = None
        if self.checks is not None:
            assert self._token_bytes is not None  # given with the checks
            checks = self.checks
            new_checker = checks.new_checker if isinstance(checks, CallChecks) else lambda: ValueChecker(checks)
            guard = OutputGuard(new_checker, self._token_bytes, self._completion_index)
        return GrammarMatcher(self._template.deep_copy(), self.closer if close else None, guard, self._template)

    def new_controller(
        self,
        *,
        limit: int,
        sampling: SamplingParams,
        eos_token_ids: frozenset[int],
        jump_forward: bool,
        counters: StructuredCounters,
    ) -> OutputController:
        """The structured output of one new request (``structured.controller``): a fresh matcher,
        closing the output early unless the request opted out. ``limit``: its output tokens in
        all (``max_tokens`` clamped to the context)."""
        return OutputController(
            self.new_matcher(close=sampling.close_structured_output),
            limit=limit,
            sampling=sampling,
            eos_token_ids=eos_token_ids,
            jump_forward=jump_forward,
            counters=counters,
        )


class GrammarCompiler:
    """Compiles constraints for one tokenizer, with an LRU cache by content hash and scope.

    ``scope`` (the asker's tenant's cache namespace, ``None`` on an open server) is part of the
    cache key: a tenant's compile is a hit only for a constraint its own scope compiled, so how
    fast a compile answers says nothing of what other tenants sent.

    ``strict_formats``: a JSON Schema ``format`` the server does not know is an error (GrammarError)
    instead of an ignored annotation (``structured.formats``)."""

    def __init__(
        self, ll_tokenizer: llguidance.LLTokenizer, cache_size: int = CACHE_SIZE, *, strict_formats: bool = False
    ) -> None:
        self.ll_tokenizer = ll_tokenizer
        self.strict_formats = strict_formats
        self.closer = Closer(ll_tokenizer)
        self._completion_index: CompletionIndex | None = None  # built with the first checked schema
        self.cache_size = cache_size
        self._cache: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()
        self.num_compiled = 0
        self.num_cache_hits = 0

    @staticmethod
    def key_of(constraint: StructuredOutputs, scope: str | None = None) -> tuple[str, str, str]:
        """(content hash, kind, text). GrammarError if the constraint is malformed."""
        kind, text = constraint_key(constraint)
        key = f"{kind}\0{text}" if scope is None else f"{kind}\0{text}\0{scope}"
        digest = hashlib.sha256(key.encode()).hexdigest()
        return digest, kind, text

    def cached(self, constraint: StructuredOutputs, scope: str | None = None) -> CompiledGrammar | None:
        """The cached grammar for ``constraint`` in ``scope``, or None. GrammarError if it is
        malformed."""
        digest, _, _ = self.key_of(constraint, scope)
        with self._lock:
            hit = self._cache.get(digest)
            if hit is not None:
                self._cache.move_to_end(digest)
                self.num_cache_hits += 1
            return hit

    def compile(self, constraint: StructuredOutputs, scope: str | None = None) -> CompiledGrammar:
        """Compile (or fetch) ``constraint`` for ``scope``. Blocking: call from a worker thread.
        Raises GrammarError with llguidance's message when the grammar is rejected."""
        hit = self.cached(constraint, scope)
        if hit is not None:
            return hit
        digest, kind, text = self.key_of(constraint, scope)
        checks: CheckNode | CallChecks | None = None
        ignored: list[str] = []
        try:  # keywords llguidance cannot compile are relaxed out and checked
            if kind == "json":
                prepared = prepare_schema(json.loads(text), strict_formats=self.strict_formats)
                text, checks = json.dumps(prepared.grammar_schema, ensure_ascii=False), prepared.root
                ignored = prepared.ignored_formats
            elif kind == "grammar":  # a tool-call grammar's calls (others come back as they are)
                text, checks = prepare_call_grammar(text, strict_formats=self.strict_formats)
        except ValueError as exc:  # unsatisfiable, or a keyword not even a check enforces
            raise GrammarError(_describe(kind, str(exc))) from None
        template = llguidance.LLMatcher(
            self.ll_tokenizer, _to_llguidance(kind, text), log_level=0, limits=PARSER_LIMITS
        )
        if template.is_error():
            raise GrammarError(_describe(kind, template.get_error()))
        probe = template.deep_copy()  # llguidance's lexer limits show at the first mask
        probe.compute_bitmask()
        if probe.is_error():
            raise GrammarError(_describe(kind, f"the grammar is too complex to generate from: {probe.get_error()}"))
        if checks is not None and self._completion_index is None:
            self._completion_index = CompletionIndex(self.ll_tokenizer.vocab_size, self.closer.token_bytes)
        compiled = CompiledGrammar(
            digest,
            kind,
            template,
            self.closer if kind == "json" else None,
            checks,
            self._completion_index,
            self.closer.token_bytes,
            tuple(ignored),
        )
        with self._lock:
            self._cache[digest] = compiled
            self.num_compiled += 1
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return compiled


def _to_llguidance(kind: str, text: str) -> str:
    try:
        if kind == "json":
            return llguidance.LLMatcher.grammar_from_json_schema(text, defaults=JSON_OPTIONS)
        if kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(text)
        if kind == "choice":
            return llguidance.grammar_from("choice", text)
        return llguidance.grammar_from("grammar", text)  # Lark, or GBNF converted to Lark
    except ValueError as exc:
        raise GrammarError(_describe(kind, str(exc))) from None


def _describe(kind: str, message: str) -> str:
    what = {"json": "JSON schema", "regex": "regex", "choice": "choice", "grammar": "grammar"}[kind]
    return f"invalid {what}: {message.strip()}"
