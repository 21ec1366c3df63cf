"""Offline inference: ``LLM().generate(prompts, SamplingParams(...))`` without a server.

The same tokenizer and scheduler actors as the server run inside a private ``trio.run``;
only the I/O is swapped (mini-sglang's rule: offline = the same scheduler).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import trio

from trillium.config import EngineConfig
from trillium.launch import Engine
from trillium.protocol import SamplingParams
from trillium.runtime import INBOX_BOUND


@dataclasses.dataclass
class RequestOutput:
    """The result of one prompt."""

    prompt: str | list[dict[str, Any]]
    text: str
    token_ids: list[int]
    prompt_token_ids: list[int]
    finish_reason: str
    # With ``SamplingParams(logprobs=k)``: per output token, (its logprob, [(token id, logprob)] of
    # the k most likely, best first).
    logprobs: list[tuple[float, list[tuple[int, float]]]] | None = None
    # With ``SamplingParams(prompt_logprobs=k)``: per prompt token, (its logprob given the tokens
    # before it, [(token id, logprob)] of the k most likely there, best first); None for the first.
    prompt_logprobs: list[tuple[float, list[tuple[int, float]]] | None] | None = None
    # finish_reason "length" with a JSON constraint: the structure was closed before max_tokens.
    closed_early: bool = False
    # With closed_early: the value check (a schema keyword beyond the grammar) that no closing
    # within max_tokens satisfied -- the text parses but fails it. None: it passes every check.
    unsatisfied_check: str | None = None


class LLM:
    """An in-process engine. Construction loads the model (default: the embedded SmolLM2)."""

    def __init__(
        self, model: str | None = None, *, dtype: str = "auto", progress: bool = True, **engine_args: Any
    ) -> None:
        self.engine = Engine(EngineConfig(model=model, dtype=dtype, **engine_args), progress=progress)
        self.tokenizer = self.engine.tokenizer

    def generate(
        self, prompts: str | Sequence[str], sampling_params: SamplingParams | Sequence[SamplingParams] | None = None
    ) -> list[RequestOutput]:
        """Complete each raw-text prompt; all prompts are batched together by the scheduler.
        ``sampling_params`` is one for all prompts or one per prompt (as in vLLM)."""
        if isinstance(prompts, str):
            prompts = [prompts]
        return trio.run(self._run_all, [{"prompt": p} for p in prompts], sampling_params or SamplingParams())

    def chat(
        self,
        conversations: list[dict[str, Any]] | list[list[dict[str, Any]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Answer chat conversations (rendered with the model's chat template)."""
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]  # one conversation
        return trio.run(self._run_all, [{"messages": c} for c in conversations], sampling_params or SamplingParams())

    async def _run_all(
        self, inputs: list[dict[str, Any]], sampling_params: SamplingParams | Sequence[SamplingParams]
    ) -> list[RequestOutput]:
        results: list[RequestOutput | None] = [None] * len(inputs)
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(inputs)
        if len(sampling_params) != len(inputs):
            raise ValueError(f"{len(sampling_params)} sampling params for {len(inputs)} prompts")
        client = self.engine.client
        async with trio.open_nursery() as actors:
            for actor in self.engine.actors():
                await actors.start(actor.run)

            # Offline callers may pass thousands of prompts; keep the bounded inboxes from
            # overflowing by letting only so many be in flight.
            in_flight = trio.Semaphore(INBOX_BOUND // 2)

            async def one(i: int, kwargs: dict[str, Any]) -> None:
                async with in_flight:
                    await run_one(i, kwargs)

            async def run_one(i: int, kwargs: dict[str, Any]) -> None:
                sampling = sampling_params[i]
                prompt_ids = await client.tokenize(**kwargs)
                grammar = None
                if sampling.structured is not None:
                    grammar = await client.compile_grammar(sampling.structured)  # GrammarError: a ValueError
                stream = client.open_stream(client.new_request_id("offline"), prompt_ids, sampling, grammar=grammar)
                text, ids = [], []
                closed, unsatisfied = False, None
                logprobs: list[tuple[float, list[tuple[int, float]]]] | None = None
                prompt_logprobs: list[tuple[float, list[tuple[int, float]]] | None] | None = None
                async for out in stream:
                    text.append(out.text)
                    ids.extend(out.token_ids)
                    if out.logprobs is not None:
                        logprobs = (logprobs or []) + out.logprobs
                    if out.prompt_logprobs is not None:  # the first output's
                        prompt_logprobs = out.prompt_logprobs
                    closed = closed or out.closed_early
                    unsatisfied = unsatisfied or out.unsatisfied_check
                    if out.error:
                        raise RuntimeError(out.error)
                assert stream.finish_reason is not None  # the stream only ends once it has a reason
                prompt = kwargs["prompt"] if "prompt" in kwargs else kwargs["messages"]
                results[i] = RequestOutput(
                    prompt,
                    "".join(text),
                    ids,
                    prompt_ids,
                    stream.finish_reason.openai_name,
                    logprobs,
                    prompt_logprobs,
                    closed,
                    unsatisfied,
                )

            async with trio.open_nursery() as requests:
                for i, kwargs in enumerate(inputs):
                    requests.start_soon(one, i, kwargs)
            actors.cancel_scope.cancel()
        done = [r for r in results if r is not None]
        assert len(done) == len(results)  # every request task filled its slot or raised
        return done
