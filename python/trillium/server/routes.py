"""Route handlers: OpenAI chat completions, completions, models, health, tokenize.

All JSON and chat-template work stays here and in the tokenizer actor; the scheduler only
ever sees token ids (llama.cpp server's rule).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

import msgspec
import trio
from starlette.requests import Request
from starlette.responses import Response

from trillium.engine_client import (
    ActorFailed,
    EngineClient,
    EngineOverloaded,
    RequestStream,
    StreamOutput,
    TokenizeError,
)
from trillium.protocol import FinishReason, SamplingParamError, SamplingParams, StructuredOutputs, ThinkSection
from trillium.protocol.messages import SEED_MAX
from trillium.runtime import Health, Snapshot
from trillium.server import sse
from trillium.server.accounting import Accounting, RequestAccount
from trillium.server.choice_split import ChoiceSplitter, OutputParsing, ReasoningDelta
from trillium.server.disconnect import unless_disconnected
from trillium.server.errors import APIError, overloaded
from trillium.server.limits import InputLimits
from trillium.server.openai_shapes import (
    ChoiceFanout,
    JSONObject,
    LogprobsFormatter,
    PromptLogprobs,
    ResponseShape,
    TokenLogprobs,
    error_payload,
    reasoning_usage,
)
from trillium.server.openapi import package_version
from trillium.server.public_prefixes import PublicPrefixes
from trillium.server.reasoning import ReasoningFormat, reasoning_format
from trillium.server.schema import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeBody,
    TokenizeBody,
    chat_logprobs,
    chat_messages,
    chat_template_kwargs,
    chat_tools,
    completion_logprobs,
    decode_body,
    sampling_params,
    structured_param,
)
from trillium.server.tool_calls import ToolCalling
from trillium.structured import CompiledGrammar, GrammarError
from trillium.tools import ContentDelta, ToolCallReady, ToolFormat, ToolSpecError

T = TypeVar("T")

# Legacy completions default to 16 tokens, as in OpenAI's API; chat defaults to the room left.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


def json_response(payload: JSONObject, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(msgspec.json.encode(payload), status, headers, media_type="application/json")


class Routes:
    """Handlers bound to one engine client. ``draining`` refuses new work during shutdown."""

    def __init__(
        self,
        client: EngineClient,
        draining: trio.Event,
        accounting: Accounting,
        health: Snapshot[Health],
        limits: InputLimits | None = None,
    ) -> None:
        self.client = client
        self._limits = limits or InputLimits()
        self.draining = draining
        self.accounting = accounting  # API keys, tenant limits, usage records, metrics
        self._health = health  # the supervisor's watchdog verdict

    @functools.cached_property
    def public_prefixes(self) -> PublicPrefixes:
        """The access config's public prefixes as tokens (built on first use, like ``limits``)."""
        return PublicPrefixes(self.client.tokenizer)

    @functools.cached_property
    def limits(self) -> InputLimits:
        """The input limits with the engine's defaults filled in (on first use: building the routes
        asks nothing of the client)."""
        return self._limits.for_engine(self.client.max_model_len, self.client.num_kv_tokens)

    @functools.cached_property
    def _reasoning(self) -> tuple[ReasoningFormat, int | None, bool] | None:
        """The served model's reasoning format (``--reasoning-parser``), the id of the one token
        that spells its closing tag (None: the vocabulary has none), and whether its tags are
        special tokens (text that skips special tokens would lose them); None without a parser.
        Read on first use."""
        if self.client.reasoning_parser is None:
            return None
        fmt = reasoning_format(self.client.reasoning_parser)
        tokenizer = self.client.tokenizer
        end_ids = tokenizer.encode(fmt.close_tag)
        special = any(len(ids) == 1 and not tokenizer.decode(ids) for ids in (end_ids, tokenizer.encode(fmt.open_tag)))
        return fmt, end_ids[0] if len(end_ids) == 1 else None, special

    @functools.cached_property
    def _think_tokens(self) -> tuple[int, int] | None:
        """The ids of the served model's think-section tags when each is one token (the grammar of
        structured output then starts after the closing one), else None; None without a parser."""
        if self._reasoning is None:
            return None
        fmt, close_id, _ = self._reasoning
        open_ids = self.client.tokenizer.encode(fmt.open_tag)
        return (open_ids[0], close_id) if len(open_ids) == 1 and close_id is not None else None

    def _think_first(self, sampling: SamplingParams, template_kwargs: dict[str, Any] | None) -> SamplingParams:
        """Structured output from a thinking model (``--reasoning-parser``): the constraint applies
        to the answer after its think section (``SamplingParams.structured_after_think``), unless
        thinking is switched off (``enable_thinking: false``) or the tags are not single tokens."""
        tags = self._think_tokens
        if tags is None or (template_kwargs or {}).get("enable_thinking") is False:
            return sampling
        assert self._reasoning is not None
        think = ThinkSection(open_id=tags[0], close_id=tags[1], opened=self._reasoning[0].starts_inside)
        return msgspec.structs.replace(sampling, structured_after_think=think)

    def output_parsing(self, calling: ToolCalling | None, sampling: SamplingParams) -> OutputParsing | None:
        """How a prepared chat request's outputs are split (``choice_split.py``): its reasoning, under
        ``--reasoning-parser``, and its tool calls; None when there is neither. An output that a
        grammar writes from its first token (structured output) starts inside no reasoning,
        whatever the prompt opened: it has reasoning only if it opens a think section itself; a
        tool-call grammar lets the model think first (``ToolCalling.lets_reasoning_first``).
        (Responses and Messages share it.)"""
        reasoning = self._reasoning
        if reasoning is None and calling is None:
            return None
        if reasoning is None:
            return OutputParsing(None, calling)
        fmt, end_token_id, _ = reasoning
        if fmt.starts_inside and not _starts_free(calling, sampling):
            fmt = dataclasses.replace(fmt, starts_inside=False)
        return OutputParsing(fmt, calling, end_token_id)

    @functools.cached_property
    def _tool_format(self) -> tuple[ToolFormat, bool]:
        """The served model's tool-call format (server/tool_calls.py), read on first use."""
        return ToolCalling.model_format(self.client.tokenizer)

    async def health(self, request: Request) -> Response:
        """Liveness (Kubernetes ``livenessProbe``): 503 with the reasons when a model step hangs,
        an actor stopped taking messages or the server gave up after repeated failures."""
        health = self._health.latest
        if not health.live:
            return json_response({"status": "unhealthy", "reasons": list(health.reasons)}, 503)
        return json_response({"status": "ok"})

    async def ready(self, request: Request) -> Response:
        """Readiness (``readinessProbe``): 200 once every actor runs, 503 while starting, draining or
        restarting an actor after a failure (send traffic elsewhere meanwhile)."""
        health = self._health.latest
        if self.draining.is_set() or not health.ready:
            reasons = list(health.reasons) or ["draining"]
            return json_response({"status": "not ready", "reasons": reasons}, 503, {"Retry-After": "1"})
        return json_response({"status": "ready"})

    async def stats(self, request: Request) -> Response:
        """Scheduler, KV-pool and grammar counters as JSON (llama.cpp's ``/slots`` idea; ``/metrics``
        has the same gauges for Prometheus). Admin key with ``--config``."""
        self.accounting.auth.require_operator(request)
        return json_response(self.client.stats())

    async def load(self, request: Request) -> Response:
        """``{"load": running + waiting}``: the load vllm-router's ``power_of_two`` policy polls."""
        stats = self.client.stats()
        return json_response(
            {"load": int(stats.get("num_requests_running", 0)) + int(stats.get("num_requests_waiting", 0))}
        )

    async def flush_cache(self, request: Request) -> Response:
        """Drop the prefix cache's unheld prefixes (applied before the scheduler's next step);
        503 + Retry-After while its inbox is full. Admin key with ``--config``."""
        self.accounting.auth.require_operator(request)
        try:
            self.client.flush_prefix_cache()
        except EngineOverloaded as exc:
            raise overloaded(str(exc)) from exc
        return json_response({"status": "flushing"})

    async def server_info(self, request: Request) -> Response:
        """The served model and the KV geometry (the keys vLLM's ``/get_server_info`` uses where
        they mean the same; no file paths)."""
        return json_response(
            {
                "engine": "trillium",
                "version": package_version(),
                "model_id": self.client.model_name,
                "max_model_len": self.client.max_model_len,
                "kv_block_size": self.client.block_size,
                "kv_cache_tokens": self.client.num_kv_tokens,
            }
        )

    async def models(self, request: Request) -> Response:
        self.accounting.auth.tenant(request)
        return json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.client.model_name,
                        "object": "model",
                        "created": 0,
                        "owned_by": "trillium",
                        "max_model_len": self.client.max_model_len,
                    }
                ],
            }
        )

    async def chat_completions(self, request: Request) -> Response:
        with self.accounting.admit(request, chat=True) as account, named_errors(account.request_id):
            return await self._chat_completions(request, account)

    async def completions(self, request: Request) -> Response:
        with self.accounting.admit(request, chat=False) as account, named_errors(account.request_id):
            return await self._completions(request, account)

    async def _chat_completions(self, request: Request, account: RequestAccount) -> Response:
        body = decode_body(await request.body(), ChatCompletionRequest)
        return await unless_disconnected(request, account, functools.partial(self._chat_body, body, account))

    async def _chat_body(self, body: ChatCompletionRequest, account: RequestAccount) -> Response:
        prompt_ids, sampling, calling = await self.prepare_chat(body, account)
        parsing = self.output_parsing(calling, sampling)
        return await self._run(body, [prompt_ids], sampling, account, chat=True, parsing=parsing)

    async def prepare_chat(
        self, body: ChatCompletionRequest, account: RequestAccount
    ) -> tuple[list[int], SamplingParams, ToolCalling | None]:
        """A chat request checked and tokenized: (prompt ids, sampling, its tool calling or None).
        Raises APIError naming the field at fault. (The Responses API shares it: server/responses.py.)"""
        self._check_model(body.model)
        self._check_admission(account, body)
        messages, template_tools, calling = self._chat_conversation(body)
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        sampling = sampling_params(
            body,
            max_tokens,
            default_max_tokens=None,
            vocab_size=self.client.model_config.vocab_size,
            logprobs=chat_logprobs(body),
            prompt_logprobs=body.prompt_logprobs,
        )
        self._check_structured(body, sampling)
        if calling.active:
            sampling = self._tool_sampling(calling, sampling)
        elif sampling.structured is not None:
            sampling = self._think_first(sampling, chat_template_kwargs(body))
        if self._reasoning is not None and self._reasoning[2]:
            sampling = msgspec.structs.replace(sampling, skip_special_tokens=False)  # keep the tags in the text
        prompt_ids = await self._chat_prompt_ids(messages, template_tools, chat_template_kwargs(body))
        self._check_length(len(prompt_ids), sampling.max_tokens, "messages")
        self._check_tokens(len(prompt_ids), sampling.max_tokens, body.n)
        self.limits.check_prompt_logprobs(len(prompt_ids), sampling.prompt_logprobs, 1)  # chat: once, at the top
        sampling = self._limit_tokens(account, sampling, len(prompt_ids), body.n)
        return prompt_ids, sampling, calling if calling.active else None

    def _tool_sampling(self, calling: ToolCalling, sampling: SamplingParams) -> SamplingParams:
        """The request's sampling with its tool-call grammar (tools/grammar.py)."""
        if sampling.structured is not None:
            raise APIError(
                "response_format and structured_outputs cannot be combined with tools; "
                'set tool_choice to "none" or leave the tools out',
                param="tool_choice",
            )
        constraint = calling.constraint()
        self.limits.check_structured(constraint, "tools")
        return msgspec.structs.replace(
            sampling,
            structured=constraint,
            skip_special_tokens=sampling.skip_special_tokens and not calling.special_tags,
        )

    def _chat_conversation(self, body: ChatCompletionRequest) -> tuple[list[Any], list[Any] | None, ToolCalling]:
        """The messages the chat template renders (tool calls folded in as the model's format
        wants), the tools it lists, and the request's tool calling. APIError names the field."""
        self.limits.check_body(messages=body.messages, logit_bias=body.logit_bias, stop=body.stop)
        messages = chat_messages(body)
        tools, choice = chat_tools(body)
        reasoning = self._reasoning[0] if self._reasoning is not None else None
        calling = ToolCalling(tools, choice, body.parallel_tool_calls, *self._tool_format, reasoning=reasoning)
        for i, tool in enumerate(tools):
            self.limits.check_structured(StructuredOutputs(json=tool.parameters), f"tools[{i}].function.parameters")
        try:
            messages, template_tools = calling.conversation(messages)
        except ToolSpecError as exc:
            raise APIError(str(exc), param=exc.param) from None
        return messages, template_tools, calling

    async def _chat_prompt_ids(
        self, messages: list[Any], template_tools: list[Any] | None, template_kwargs: dict[str, Any] | None = None
    ) -> list[int]:
        self.limits.check_prompt_chars(_with_tool_text(messages, template_tools), "messages")
        return await self._tokenize(messages=messages, tools=template_tools, chat_template_kwargs=template_kwargs)

    async def render_chat(self, request: Request) -> Response:
        """vLLM's ``POST /v1/chat/completions/render``: a chat request's prompt token ids, exactly
        as a chat completion would run it (template, tools), without running it. vllm-router's
        kv_aware policy asks for them to score replicas by their cached prefix blocks."""
        self.accounting.auth.tenant(request)
        body = decode_body(await request.body(), ChatCompletionRequest)
        self._check_model(body.model)
        return self._rendered(await self.render_prompt(body))

    async def render_prompt(self, body: ChatCompletionRequest) -> list[int]:
        """A chat request's prompt token ids as :meth:`prepare_chat` renders them (template, tools),
        without the sampling and admission checks. Raises APIError naming the field at fault.
        (Anthropic's count_tokens shares it: server/messages.py.)"""
        messages, template_tools, _ = self._chat_conversation(body)
        return await self._chat_prompt_ids(messages, template_tools, chat_template_kwargs(body))

    async def render_completion(self, request: Request) -> Response:
        """vLLM's ``POST /v1/completions/render``: the (first) prompt's token ids, as a completion
        would run it."""
        self.accounting.auth.tenant(request)
        body = decode_body(await request.body(), CompletionRequest)
        self._check_model(body.model)
        items = _prompt_items(body.prompt)
        self.limits.check_body(prompts=items)
        self._check_suffix(body.suffix)
        if isinstance(items[0], list):
            self.limits.check_token_ids(items[0], "prompt")
        return self._rendered(await self._completion_prompt_ids(items[0], body.suffix, "prompt"))

    def _check_suffix(self, suffix: str | None) -> None:
        if suffix and self.client.tokenizer.fim_token_ids is None:
            raise APIError("suffix is not supported: this model has no fill-in-the-middle tokens", param="suffix")

    async def _completion_prompt_ids(self, item: str | list[int], suffix: str | None, param: str) -> list[int]:
        """One completion prompt as token ids: given ids checked against the vocabulary (they take
        no suffix), text tokenized with the suffix. APIError names ``param`` (or ``suffix``)."""
        if isinstance(item, list):
            if suffix:
                raise APIError("suffix needs text prompts (it is tokenized with them)", param="suffix")
            vocab = self.client.model_config.vocab_size
            if any(not 0 <= t < vocab for t in item):
                raise APIError(f"prompt token ids must be in [0, {vocab})", param=param)
            return item
        self.limits.check_prompt_chars(item + (suffix or ""), param)
        return await self._tokenize(prompt=item, suffix=suffix or None)

    def _rendered(self, token_ids: list[int]) -> Response:
        return json_response({"model": self.client.model_name, "token_ids": token_ids, "count": len(token_ids)})

    async def _completions(self, request: Request, account: RequestAccount) -> Response:
        body = decode_body(await request.body(), CompletionRequest)
        return await unless_disconnected(request, account, functools.partial(self._completions_body, body, account))

    async def _completions_body(self, body: CompletionRequest, account: RequestAccount) -> Response:
        self._check_model(body.model)
        self._check_admission(account, body)
        items = _prompt_items(body.prompt)
        self.limits.check_body(logit_bias=body.logit_bias, stop=body.stop, prompts=items)
        self._check_suffix(body.suffix)
        logprobs = completion_logprobs(body)
        # max_tokens 0 with echo scores the prompt without generating (OpenAI's legacy API; eval
        # harnesses use it): one token is generated and left out of the response.
        score_only = bool(body.echo) and body.max_tokens == 0
        # echo + logprobs scores the prompt: each prompt token's logprob (and top k), as OpenAI's
        # legacy API did; vLLM's prompt_logprobs asks for the same in its own shape.
        wanted = [k for k in (logprobs if body.echo else None, body.prompt_logprobs) if k is not None]
        sampling = sampling_params(
            body,
            1 if score_only else body.max_tokens,
            default_max_tokens=COMPLETIONS_DEFAULT_MAX_TOKENS,
            vocab_size=self.client.model_config.vocab_size,
            logprobs=logprobs,
            prompt_logprobs=max(wanted) if wanted else None,
        )
        self._check_structured(body, sampling)
        num_choices = body.n * len(items)
        self._check_tokens(1, sampling.max_tokens, num_choices)  # its least, before tokenizing them all
        prompts: list[list[int]] = []
        for k, item in enumerate(items):
            param = "prompt" if len(items) == 1 else f"prompt[{k}]"
            if isinstance(item, list):
                self._check_length(len(item), sampling.max_tokens, param)  # before the O(len) checks
            prompts.append(await self._completion_prompt_ids(item, body.suffix, param))
            self._check_length(len(prompts[-1]), sampling.max_tokens, param)
        longest = max(len(ids) for ids in prompts)
        self._check_tokens(longest, sampling.max_tokens, num_choices)
        self.limits.check_prompt_logprobs(sum(len(ids) for ids in prompts), sampling.prompt_logprobs, body.n)
        sampling = account.limit_tokens(
            sampling, sum(len(ids) for ids in prompts), num_choices, self.client.max_model_len - longest
        )
        echo = None
        if body.echo:
            echo = [
                item if isinstance(item, str) else await self._detokenize(ids, "prompt")
                for item, ids in zip(items, prompts)
            ]
        return await self._run(body, prompts, sampling, account, chat=False, echo=echo, score_only=score_only)

    async def tokenize(self, request: Request) -> Response:
        """vLLM's ``POST /tokenize``: ``{prompt | messages}`` -> ``{count, max_model_len, tokens}``."""
        self.accounting.auth.tenant(request)
        body = decode_body(await request.body(), TokenizeBody)
        self._check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise APIError("exactly one of prompt and messages is required", param="prompt")
        if body.messages is not None:
            self.limits.check_body(messages=body.messages)
            messages = chat_messages(ChatCompletionRequest(messages=body.messages))
            self.limits.check_prompt_chars(messages, "messages")
            tokens = await self._tokenize(
                messages=messages,
                add_generation_prompt=body.add_generation_prompt,
                chat_template_kwargs=chat_template_kwargs(body),
            )
        else:
            assert body.prompt is not None
            self.limits.check_prompt_chars(body.prompt, "prompt")
            tokens = await self._tokenize(prompt=body.prompt, add_special_tokens=body.add_special_tokens)
        return json_response({"count": len(tokens), "max_model_len": self.client.max_model_len, "tokens": tokens})

    async def detokenize(self, request: Request) -> Response:
        """vLLM's ``POST /detokenize``: ``{tokens}`` -> ``{prompt}``."""
        self.accounting.auth.tenant(request)
        body = decode_body(await request.body(), DetokenizeBody)
        self._check_model(body.model)
        self.limits.check_token_ids(body.tokens, "tokens")
        vocab = self.client.model_config.vocab_size
        if any(not 0 <= t < vocab for t in body.tokens):
            raise APIError(f"tokens must be in [0, {vocab})", param="tokens")
        return json_response({"prompt": await self._detokenize(body.tokens, "tokens")})

    # ---- shared -------------------------------------------------------------------------------

    def _check_model(self, model: str | None) -> None:
        if model is not None and model != self.client.model_name:
            raise APIError(
                f"The model `{model}` does not exist.",
                status=404,
                type="NotFoundError",
                param="model",
                code="model_not_found",
            )

    async def _tokenize(self, **kwargs: Any) -> list[int]:
        return await self._ask_tokenizer(
            lambda: self.client.tokenize(**kwargs), "messages", "could not build the prompt"
        )

    async def _detokenize(self, token_ids: list[int], param: str) -> str:
        return await self._ask_tokenizer(
            lambda: self.client.detokenize(token_ids), param, "could not decode the tokens"
        )

    async def _ask_tokenizer(self, call: Callable[[], Awaitable[T]], param: str, failure: str) -> T:
        """A tokenizer-actor call with its failures as HTTP errors: 503 while draining or when the
        actor's inbox is full, 400 naming ``param`` when the input cannot be (de)tokenized."""
        if self.draining.is_set():
            raise overloaded("server is shutting down")
        try:
            return await call()
        except EngineOverloaded as exc:
            raise overloaded(str(exc)) from None
        except ActorFailed as exc:
            raise actor_failed(exc) from None
        except TokenizeError as exc:
            raise APIError(f"{failure}: {exc}", param=param) from None

    async def _compile_grammar(self, constraint: StructuredOutputs, param: str, scope: str | None) -> CompiledGrammar:
        """Compile the request's output constraint (each choice gets its own matcher from it);
        ``param`` is the request field a compile error points at; ``scope`` the tenant's cache
        namespace (the compile cache is kept per namespace)."""
        try:
            return await self.client.compile_grammar(constraint, scope)
        except GrammarError as exc:
            raise APIError(str(exc), param=param, code="invalid_grammar") from None
        except EngineOverloaded as exc:
            raise overloaded(str(exc)) from None
        except ActorFailed as exc:
            raise actor_failed(exc) from None

    def _check_length(self, num_prompt_tokens: int, max_tokens: int | None, param: str) -> None:
        if num_prompt_tokens == 0:  # a text of characters the vocabulary has no token for
            raise APIError(f"the {param} has no tokens after tokenization", param=param)
        limit = self.client.max_model_len
        wanted = num_prompt_tokens + (max_tokens or 1)
        if num_prompt_tokens >= limit or wanted > limit:
            raise APIError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{wanted} tokens ({num_prompt_tokens} in the {param}, {max_tokens or 1} in the completion).",
                param=param if num_prompt_tokens >= limit else "max_tokens",
                code="context_length_exceeded",
            )

    def _check_tokens(self, num_prompt_tokens: int, max_tokens: int | None, n: int) -> None:
        """n x max_tokens and the KV cache the request would hold (after :meth:`_check_length`)."""
        room = self.client.max_model_len - num_prompt_tokens  # max_tokens=None: until the context is full
        self.limits.check_tokens(
            num_prompt_tokens, room if max_tokens is None else max_tokens, n, self.client.num_kv_tokens
        )

    def _check_structured(self, body: ChatCompletionRequest | CompletionRequest, sampling: SamplingParams) -> None:
        """Grammar size and depth, before anything walks the constraint (the compile is later)."""
        if sampling.structured is not None:
            self.limits.check_structured(sampling.structured, structured_param(body))

    def _fair_tenant(self, account: RequestAccount, body: ChatCompletionRequest | CompletionRequest) -> str:
        """Whose fair share of the scheduler a request uses: the API key's tenant; on an open server
        the request's ``user``, else the one shared tenant (scheduler/fair_queue.py)."""
        return account.tenant if self.accounting.auth.access is not None else body.user or account.tenant

    def _check_admission(self, account: RequestAccount, body: ChatCompletionRequest | CompletionRequest) -> None:
        """503 now, before tokenizing, if the waiting queue would refuse the request (it checks
        again when the request is submitted): refusals stay cheap under a flood."""
        try:
            self.client.check_admission(self._fair_tenant(account, body))
        except EngineOverloaded as exc:
            raise overloaded(str(exc)) from None

    def _limit_tokens(
        self, account: RequestAccount, sampling: SamplingParams, num_prompt_tokens: int, n: int
    ) -> SamplingParams:
        """The tenant's token limits, before the scheduler sees the request (429)."""
        return account.limit_tokens(sampling, num_prompt_tokens, n, self.client.max_model_len - num_prompt_tokens)

    async def _run(
        self,
        body: ChatCompletionRequest | CompletionRequest,
        prompts: list[list[int]],
        sampling: SamplingParams,
        account: RequestAccount,
        *,
        chat: bool,
        echo: list[str] | None = None,
        parsing: OutputParsing | None = None,
        score_only: bool = False,
    ) -> Response:
        """Run the request's choices (``body.n`` per prompt) and answer in the endpoint's shape;
        ``echo``: each prompt's text, to put before its choices' text (completions); ``parsing``:
        how a chat choice's text splits into reasoning, content and tool calls;
        ``score_only``: leave the generated tokens out (echo with ``max_tokens: 0``)."""
        fanout = await self.start(body, prompts, sampling, account)
        tokenizer = self.client.tokenizer
        formatter = LogprobsFormatter(tokenizer, chat) if sampling.logprobs is not None else None
        vllm_prompt = LogprobsFormatter(tokenizer, chat) if body.prompt_logprobs is not None else None
        shape = ResponseShape(account.request_id, self.client.model_name, chat, formatter, parsing, vllm_prompt)
        echoed = _Echo(prompts, echo, echo is not None and formatter is not None, score_only)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return account.streaming_response(
                _sse_body(fanout, shape, include_usage, echoed, account),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        response = await _full_response(fanout, shape, echoed)
        account.http_status = response.status_code
        await account.finish_committed(echoed.usage(fanout.usage()))  # in the ledger before the body goes out
        return response

    async def start(
        self,
        body: ChatCompletionRequest | CompletionRequest,
        prompts: list[list[int]],
        sampling: SamplingParams,
        account: RequestAccount,
    ) -> ChoiceFanout:
        """Submit a checked request's ``body.n`` choices per prompt (its grammar compiled first);
        the fanout reads them. A prompt's choice ``j`` runs with ``seed + j``, as if it were a
        request of its own. A full queue is a 503 here."""
        request_id = account.request_id
        if body.cache_salt is not None and not body.cache_salt:
            raise APIError("cache_salt must be a non-empty string", param="cache_salt")
        grammar = None
        scope = self.accounting.cache_scope(account.tenant)
        access = self.accounting.auth.access
        public = access.public_prefixes if access is not None and body.cache_salt is None else ()
        num_public = [self.public_prefixes.num_public_tokens(public, prompt) for prompt in prompts]
        if sampling.structured is not None:
            grammar = await self._compile_grammar(sampling.structured, structured_param(body), scope)
            if grammar.warning is not None:
                account.warnings.append(grammar.warning)
            try:
                grammar.check_allowance(sampling)
            except SamplingParamError as exc:
                raise APIError(str(exc), param=exc.param) from None
        tenant = self._fair_tenant(account, body)

        def open_choice(i: int) -> RequestStream:
            choice_sampling = sampling
            j = i % body.n
            if j > 0 and sampling.seed is not None:
                seed = sampling.seed + j
                if seed > SEED_MAX:  # wrap within the 64 bits a generator takes
                    seed -= 2**64
                choice_sampling = msgspec.structs.replace(choice_sampling, seed=seed)
            if j > 0 and sampling.prompt_logprobs is not None:
                # The prompt's logprobs are its first choice's (the response copies them); without
                # them a sibling reuses the prompt's blocks from the prefix cache.
                choice_sampling = msgspec.structs.replace(choice_sampling, prompt_logprobs=None)
            choice_id = request_id if i == 0 else f"{request_id}-{i}"
            return self.client.open_stream(
                choice_id,
                prompts[i // body.n],
                choice_sampling,
                cache_salt=body.cache_salt,
                grammar=grammar,
                tenant=tenant,
                priority=body.priority,
                cache_scope=scope,
                num_public_tokens=num_public[i // body.n],
            )

        try:
            fanout = ChoiceFanout(open_choice, body.n, len(prompts))
        except EngineOverloaded as exc:
            raise overloaded(str(exc)) from None
        account.fanout = fanout
        return fanout


def actor_failed(exc: ActorFailed) -> APIError:
    """500 in OpenAI's shape: an actor failed while it held this request (it is being restarted)."""
    return APIError(f"{exc}; retry", status=500, type="internal_error", code="internal_error")


@contextlib.contextmanager
def named_errors(request_id: str) -> Iterator[None]:
    """Every error response of a generation request carries its id (``x-request-id``, and in the
    message of a 5xx), so that an operator can find the request in the log and the ledger."""
    try:
        yield
    except APIError as exc:
        exc.headers.setdefault("x-request-id", request_id)
        if exc.status >= 500 and request_id not in exc.message:
            exc.message = f"{exc.message} (request id {request_id})"
        raise


class _ChoiceLogprobs:
    """Accumulates one choice's logprobs (and, for completions, the running text offset)."""

    def __init__(self, formatter: LogprobsFormatter, text_offset: int) -> None:
        self.formatter = formatter
        self.offset = text_offset
        self.chat_content: list[JSONObject] = []
        self.completion: dict[str, list[Any]] = {
            "tokens": [],
            "token_logprobs": [],
            "top_logprobs": [],
            "text_offset": [],
        }

    def add(self, token_ids: list[int], logprobs: TokenLogprobs | None) -> JSONObject | list[JSONObject] | None:
        """Formats the new tokens' logprobs, remembers them, and returns them (for a chunk)."""
        if not logprobs:
            return None
        if self.formatter.chat:
            content = self.formatter.chat_content(token_ids, logprobs)
            self.chat_content.extend(content)
            return content
        new = self.formatter.completion(token_ids, logprobs, self.offset)
        self.offset += sum(len(t) for t in new["tokens"])
        for key, values in new.items():
            self.completion[key].extend(values)
        return new

    def add_prompt(self, prompt_ids: list[int], logprobs: PromptLogprobs) -> JSONObject:
        """The echoed prompt's logprobs, before the generated tokens' (completions only)."""
        new = self.formatter.completion_prompt(prompt_ids, logprobs)
        for key, values in new.items():
            self.completion[key][:0] = values
        # The generated tokens' offsets follow the prompt's tokens (whose text may differ from the
        # echoed prompt by special tokens such as a BOS): offsets stay consistent with ``tokens``.
        self.offset = sum(len(t) for t in new["tokens"])
        return new

    def result(self) -> JSONObject | list[JSONObject]:
        return self.chat_content if self.formatter.chat else self.completion


@dataclasses.dataclass(frozen=True)
class _Echo:
    """A request's prompts, as the response may repeat them (``echo``), with their logprobs."""

    prompts: list[list[int]]
    texts: list[str] | None  # each prompt's text, with ``echo``
    logprobs: bool  # echo + logprobs: the prompt tokens' logprobs lead each choice's logprobs
    score_only: bool = False  # max_tokens 0: the response holds the prompt alone
    # each prompt's logprobs, from its first choice (the only one that computes them)
    prompt_logprobs: dict[int, PromptLogprobs] = dataclasses.field(default_factory=dict)

    def text(self, prompt: int) -> str:
        return self.texts[prompt] if self.texts is not None else ""

    def shown(self, out: StreamOutput) -> StreamOutput:
        """``out`` as the response shows it: without its generated tokens when scoring only."""
        if not self.score_only:
            return out
        return dataclasses.replace(out, text="", token_ids=[], logprobs=None)

    def usage(self, usage: JSONObject) -> JSONObject:
        if not self.score_only:
            return usage
        return {**usage, "completion_tokens": 0, "total_tokens": usage["prompt_tokens"]}


def _with_tool_text(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """``messages`` for the prompt-size check, counting what a native template also renders: the
    tools' definitions and earlier calls' arguments (message content alone would miss them)."""
    extra = [msgspec.json.encode(tools).decode()] if tools else []
    extra += [msgspec.json.encode(m["tool_calls"]).decode() for m in messages if m.get("tool_calls")]
    return [*messages, {"role": "", "content": "".join(extra)}] if extra else messages


def _prompt_items(prompt: str | list[Any]) -> list[str | list[int]]:
    """A completions ``prompt`` as a list of prompts, each text or token ids."""
    if isinstance(prompt, str):
        return [prompt]
    kinds = {type(p) for p in prompt}
    if kinds == {int}:
        return [prompt]
    if len(kinds) != 1:
        raise APIError(
            "prompt must be a string, a list of strings, a list of token ids, or a list of token-id lists",
            param="prompt",
        )
    return list(prompt)


def _prompt_logprobs(
    shape: ResponseShape, echo: _Echo, prompt: int, out: StreamOutput, choice: _ChoiceLogprobs | None
) -> tuple[JSONObject | None, list[JSONObject | None] | None]:
    """On a choice's first output: (the echoed prompt's logprobs in the completions shape, vLLM's
    ``prompt_logprobs``), each None when not asked for. A prompt's first choice brings them; its
    siblings, started after that, get the same."""
    if out.prompt_logprobs is not None:
        echo.prompt_logprobs[prompt] = out.prompt_logprobs
    logprobs = echo.prompt_logprobs.get(prompt)
    if logprobs is None:
        return None, None
    ids = echo.prompts[prompt]
    echoed = choice.add_prompt(ids, logprobs) if echo.logprobs and choice is not None else None
    vllm = shape.prompt_logprobs.vllm_prompt(ids, logprobs) if shape.prompt_logprobs else None
    return echoed, vllm


async def _full_response(fanout: ChoiceFanout, shape: ResponseShape, echo: _Echo) -> Response:
    n, per_prompt = fanout.n, fanout.per_prompt
    parts: list[list[str]] = [[echo.text(i // per_prompt)] for i in range(n)]
    reasons = [""] * n
    logprobs = [
        _ChoiceLogprobs(shape.logprobs, len(echo.text(i // per_prompt))) if shape.logprobs else None for i in range(n)
    ]
    vllm_prompt: list[list[JSONObject | None] | None] = [None] * n
    splitters = _splitters(shape, n)
    started = [False] * n
    closed: set[int] = set()
    unsatisfied: dict[int, str] = {}
    try:
        while (item := await fanout.next()) is not None:
            i, out = item
            out = echo.shown(out)
            parts[i].append(out.text)
            splitter = splitters[i]
            if splitter is not None:
                splitter.feed(out.text, out.token_ids, out.finish_reason)
            choice_logprobs = logprobs[i]
            if not started[i]:
                started[i] = True
                _, vllm_prompt[i] = _prompt_logprobs(shape, echo, i // per_prompt, out, choice_logprobs)
            if choice_logprobs is not None:
                choice_logprobs.add(out.token_ids, out.logprobs)
            raise_on_failure(out)
            if out.finish_reason is not None:
                reasons[i] = out.finish_reason.openai_name
            if out.closed_early:
                closed.add(i)
            if out.unsatisfied_check is not None:
                unsatisfied[i] = out.unsatisfied_check
    except EngineOverloaded as exc:
        raise overloaded(str(exc)) from None
    finally:
        fanout.abort()  # a no-op unless we are being cancelled mid-generation
    choices = [
        ("".join(text), reason, lp.result() if lp else None) for text, reason, lp in zip(parts, reasons, logprobs)
    ]
    return json_response(
        shape.full(
            choices,
            reasoning_usage(echo.usage(fanout.usage()), splitters),
            vllm_prompt if shape.prompt_logprobs is not None else None,
            frozenset(closed),
            unsatisfied,
            splitters,
        )
    )


def raise_on_failure(out: StreamOutput) -> None:
    """A choice that failed (500) or was aborted by shutdown (503 + Retry-After), as the error of a
    whole response; ``named_errors`` adds the request id."""
    if out.finish_reason == FinishReason.ERROR:
        raise APIError(out.error or "generation failed", status=500, type="internal_error", code="internal_error")
    if out.finish_reason == FinishReason.ABORT:
        raise APIError(
            "request aborted: the server is shutting down",
            status=503,
            type="server_overloaded",
            headers={"Retry-After": "1"},
        )


def _splitters(shape: ResponseShape, n: int) -> list[ChoiceSplitter | None]:
    """A splitter per choice of a chat request whose outputs are parsed (None each otherwise)."""
    parsing = shape.parsing if shape.chat else None
    return [parsing.new_splitter() if parsing is not None else None for _ in range(n)]


def _starts_free(calling: ToolCalling | None, sampling: SamplingParams) -> bool:
    """Whether the model writes its output's start freely: nothing constrains it, its constraint
    applies after its think section, or it has only a tool-call grammar that lets it reason first."""
    return (
        sampling.structured is None
        or sampling.structured_after_think is not None
        or (calling is not None and calling.lets_reasoning_first)
    )


def _tool_call_deltas(ready: ToolCallReady) -> list[JSONObject]:
    """A whole call as OpenAI streams one: its id and name (empty arguments), then the arguments."""
    call = ready.call
    head = {"index": ready.index, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
    return [head, {"index": ready.index, "function": {"arguments": call.arguments}}]


async def _sse_body(
    fanout: ChoiceFanout, shape: ResponseShape, include_usage: bool, echo: _Echo, account: RequestAccount
) -> AsyncIterator[bytes]:
    """SSE events of one request. No awaits in ``finally``: a cancelled generator can't await.
    The account is finished, and its record committed to the ledger, before the last events, so
    that a client that has read ``[DONE]`` finds the request in the metrics and the ledger, even
    if the server is killed the next moment. A choice's first chunk carries the echoed prompt and
    the prompt logprobs asked for."""
    n, per_prompt = fanout.n, fanout.per_prompt
    started = [False] * n
    logprobs = [
        _ChoiceLogprobs(shape.logprobs, len(echo.text(i // per_prompt))) if shape.logprobs else None for i in range(n)
    ]
    splitters = _splitters(shape, n)
    try:
        while True:
            try:
                item = await fanout.next()
            except EngineOverloaded as exc:
                yield sse.event(error_payload(f"could not start all choices: {exc}", shape.request_id))
                break
            if item is None:
                break
            i, out = item
            out = echo.shown(out)
            choice_logprobs = logprobs[i]
            if not started[i]:
                started[i] = True
                echoed, vllm = _prompt_logprobs(shape, echo, i // per_prompt, out, choice_logprobs)
                if shape.chat:
                    yield sse.event(shape.chunk(i, "", None, first=True, prompt_logprobs=vllm))
                elif echo.texts is not None or vllm is not None:
                    yield sse.event(
                        shape.chunk(i, echo.text(i // per_prompt), None, logprobs=echoed, prompt_logprobs=vllm)
                    )
            reason = out.finish_reason
            if reason == FinishReason.ERROR:
                yield sse.event(error_payload(out.error or "generation failed", shape.request_id))
                break
            if reason == FinishReason.ABORT:
                yield sse.event(error_payload("request aborted: the server is shutting down"))
                break
            lp = choice_logprobs.add(out.token_ids, out.logprobs) if choice_logprobs is not None else None
            reason_name = reason.openai_name if reason is not None else None
            splitter = splitters[i]
            text: str | None = out.text or None
            if splitter is not None:
                text = ""
                for piece in splitter.feed(out.text, out.token_ids, reason):
                    if isinstance(piece, ContentDelta):
                        text += piece.text
                        continue
                    if text:  # content before a call goes first
                        yield sse.event(shape.chunk(i, text, None))
                        text = ""
                    if isinstance(piece, ReasoningDelta):  # (reasoning comes before any content)
                        yield sse.event(shape.chunk(i, None, None, reasoning=piece.text))
                        continue
                    for delta in _tool_call_deltas(piece):
                        yield sse.event(shape.chunk(i, None, None, tool_calls=[delta]))
                text = text or None
                if reason == FinishReason.STOP and splitter.calls:
                    reason_name = "tool_calls"
            if text or reason is not None or lp:
                yield sse.event(
                    shape.chunk(
                        i,
                        text,
                        reason_name,
                        logprobs=lp,
                        closed_early=out.closed_early,
                        unsatisfied_check=out.unsatisfied_check,
                    )
                )
        usage = echo.usage(fanout.usage())
        await account.finish_committed(usage)
        if include_usage:
            yield sse.event(shape.usage_chunk(reasoning_usage(usage, splitters)))
        yield sse.DONE
    finally:
        fanout.abort()
