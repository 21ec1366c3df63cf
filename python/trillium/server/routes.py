"""Route handlers: OpenAI chat completions, completions, models, health.

All JSON and chat-template work stays here and in the tokenizer actor; the scheduler only
ever sees token ids (llama.cpp server's rule).
"""

from __future__ import annotations

import time
import uuid

import msgspec
import trio
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from trillium.engine_client import EngineClient, EngineOverloaded, TokenizeError
from trillium.protocol import FinishReason
from trillium.request_stream import RequestStream
from trillium.server import sse
from trillium.server.errors import APIError, overloaded
from trillium.server.schema import (
    ChatCompletionRequest,
    CompletionRequest,
    chat_messages,
    decode_body,
    sampling_params,
)

# Legacy completions default to 16 tokens, as in OpenAI's API; chat defaults to the room left.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


def json_response(payload: dict, status: int = 200) -> Response:
    return Response(msgspec.json.encode(payload), status, media_type="application/json")


class Routes:
    """Handlers bound to one engine client. ``draining`` refuses new work during shutdown."""

    def __init__(self, client: EngineClient, draining: trio.Event) -> None:
        self.client = client
        self.draining = draining

    async def health(self, request: Request) -> Response:
        if self.draining.is_set():
            return json_response({"status": "draining"}, 503)
        return json_response({"status": "ok"})

    async def stats(self, request: Request) -> Response:
        """Scheduler and KV-pool counters (llama.cpp's ``/slots`` idea; Prometheus comes later)."""
        return json_response(self.client.stats())

    async def models(self, request: Request) -> Response:
        return json_response({
            "object": "list",
            "data": [{
                "id": self.client.model_name, "object": "model", "created": 0, "owned_by": "trillium",
                "max_model_len": self.client.max_model_len,
            }],
        })

    async def chat_completions(self, request: Request) -> Response:
        body = decode_body(await request.body(), ChatCompletionRequest)
        self._check_model(body.model)
        messages = chat_messages(body)
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        sampling = sampling_params(body, max_tokens, default_max_tokens=None)
        prompt_ids = await self._tokenize(messages=messages)
        self._check_length(len(prompt_ids), sampling.max_tokens, "messages")
        return await self._run(body, prompt_ids, sampling, chat=True)

    async def completions(self, request: Request) -> Response:
        body = decode_body(await request.body(), CompletionRequest)
        self._check_model(body.model)
        prompt = body.prompt
        if isinstance(prompt, list) and len({type(p) for p in prompt}) > 1:
            raise APIError("prompt must be a string, a list of strings, or a list of token ids", param="prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise APIError("batched prompts are not supported; send one prompt per request", param="prompt")
            prompt = prompt[0]
        if isinstance(prompt, list):
            if not prompt:
                raise APIError("prompt must not be empty", param="prompt")
            vocab = self.client.model_config.vocab_size
            if any(not 0 <= t < vocab for t in prompt):
                raise APIError(f"prompt token ids must be in [0, {vocab})", param="prompt")
            prompt_ids = list(prompt)
        else:
            if not prompt:
                raise APIError("prompt must not be empty", param="prompt")
            prompt_ids = await self._tokenize(prompt=prompt)
        sampling = sampling_params(body, body.max_tokens, default_max_tokens=COMPLETIONS_DEFAULT_MAX_TOKENS)
        self._check_length(len(prompt_ids), sampling.max_tokens, "prompt")
        return await self._run(body, prompt_ids, sampling, chat=False)

    # ---- shared -------------------------------------------------------------------------------

    def _check_model(self, model: str | None) -> None:
        if model is not None and model != self.client.model_name:
            raise APIError(f"The model `{model}` does not exist.", status=404, type="NotFoundError",
                           param="model", code="model_not_found")

    async def _tokenize(self, **kwargs) -> list[int]:
        if self.draining.is_set():
            raise overloaded("server is shutting down")
        try:
            return await self.client.tokenize(**kwargs)
        except EngineOverloaded as exc:
            raise overloaded(str(exc)) from None
        except TokenizeError as exc:
            raise APIError(f"could not build the prompt: {exc}", param="messages") from None

    def _check_length(self, num_prompt_tokens: int, max_tokens: int | None, param: str) -> None:
        limit = self.client.max_model_len
        wanted = num_prompt_tokens + (max_tokens or 1)
        if num_prompt_tokens >= limit or wanted > limit:
            raise APIError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{wanted} tokens ({num_prompt_tokens} in the {param}, {max_tokens or 1} in the completion).",
                param=param if num_prompt_tokens >= limit else "max_tokens",
                code="context_length_exceeded",
            )

    async def _run(self, body, prompt_ids: list[int], sampling, *, chat: bool) -> Response:
        prefix = "chatcmpl" if chat else "cmpl"
        request_id = f"{prefix}-{uuid.uuid4().hex}"
        try:
            if body.cache_salt is not None and not body.cache_salt:
                raise APIError("cache_salt must be a non-empty string", param="cache_salt")
            stream = self.client.open_stream(request_id, prompt_ids, sampling, cache_salt=body.cache_salt)
        except EngineOverloaded as exc:
            raise overloaded(str(exc)) from None
        shape = _Shape(request_id, self.client.model_name, chat)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(_sse_body(stream, shape, include_usage), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await _full_response(stream, shape)


class _Shape:
    """Builds OpenAI response objects for one request (chat or legacy completions)."""

    def __init__(self, request_id: str, model: str, chat: bool) -> None:
        self.request_id = request_id
        self.model = model
        self.chat = chat
        self.created = int(time.time())

    def _envelope(self, object_: str) -> dict:
        return {"id": self.request_id, "object": object_, "created": self.created, "model": self.model}

    def chunk(self, text: str | None, finish_reason: str | None, *, first: bool = False) -> dict:
        if self.chat:
            delta: dict = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return {**self._envelope("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        return {**self._envelope("text_completion"), "choices": [choice]}

    def usage_chunk(self, usage: dict) -> dict:
        return {**self._envelope("chat.completion.chunk" if self.chat else "text_completion"),
                "choices": [], "usage": usage}

    def full(self, text: str, finish_reason: str, usage: dict) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": finish_reason}
            return {**self._envelope("chat.completion"), "choices": [choice], "usage": usage}
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return {**self._envelope("text_completion"), "choices": [choice], "usage": usage}


def _usage(stream: RequestStream) -> dict:
    p, c = stream.num_prompt_tokens, stream.num_completion_tokens
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
            "prompt_tokens_details": {"cached_tokens": stream.num_cached_tokens}}


def _error_payload(message: str) -> dict:
    return {"error": {"message": message, "type": "internal_error", "param": None, "code": "internal_error"}}


async def _full_response(stream: RequestStream, shape: _Shape) -> Response:
    parts: list[str] = []
    try:
        async for out in stream:
            parts.append(out.text)
            if out.finish_reason == FinishReason.ERROR:
                return json_response(_error_payload(out.error or "generation failed"), 500)
            if out.finish_reason == FinishReason.ABORT:
                raise APIError("request aborted: the server is shutting down", status=503,
                               type="server_overloaded", headers={"Retry-After": "1"})
    finally:
        stream.abort()  # a no-op unless we are being cancelled mid-generation
    return json_response(shape.full("".join(parts), stream.finish_reason.openai_name, _usage(stream)))


async def _sse_body(stream: RequestStream, shape: _Shape, include_usage: bool):
    """SSE events of one request. No awaits in ``finally``: a cancelled generator can't await."""
    try:
        if shape.chat:
            yield sse.event(shape.chunk("", None, first=True))
        async for out in stream:
            reason = out.finish_reason
            if reason == FinishReason.ERROR:
                yield sse.event(_error_payload(out.error or "generation failed"))
                break
            if reason == FinishReason.ABORT:
                yield sse.event(_error_payload("request aborted: the server is shutting down"))
                break
            if out.text or reason is not None:
                yield sse.event(shape.chunk(out.text if out.text else None, reason.openai_name if reason is not None else None))
        if include_usage:
            yield sse.event(shape.usage_chunk(_usage(stream)))
        yield sse.DONE
    finally:
        stream.abort()
