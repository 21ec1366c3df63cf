"""``trillium chat``: a terminal chat that streams answers from an in-process engine."""

from __future__ import annotations

import sys
from typing import Any

import trio

from trillium.config import EngineConfig
from trillium.launch import Engine
from trillium.protocol import SamplingParams


async def _chat_loop(engine: Engine, system: str | None, sampling: SamplingParams) -> None:
    client = engine.client
    async with trio.open_nursery() as actors:
        for actor in engine.actors():
            await actors.start(actor.run)
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        print(f"trillium chat with {client.model_name}. Empty line or Ctrl-D to quit.", flush=True)
        while True:
            try:
                line = await trio.to_thread.run_sync(input, ">>> ")
            except EOFError:
                break
            if not line.strip():
                break
            messages.append({"role": "user", "content": line})
            prompt_ids = await client.tokenize(messages=messages)
            room = client.max_model_len - len(prompt_ids)
            if room < 1:
                print("[the conversation is longer than the model's context; start a new one]")
                messages.clear()
                continue
            max_tokens = room if sampling.max_tokens is None else min(sampling.max_tokens, room)
            turn = SamplingParams(max_tokens=max_tokens, temperature=sampling.temperature)
            stream = client.open_stream(client.new_request_id("chat"), prompt_ids, turn)
            answer = []
            try:
                async for out in stream:
                    answer.append(out.text)
                    sys.stdout.write(out.text)
                    sys.stdout.flush()
                    if out.error:
                        print(f"\n[error: {out.error}]")
            finally:
                stream.abort()
            print(flush=True)
            messages.append({"role": "assistant", "content": "".join(answer)})
        actors.cancel_scope.cancel()


def run_chat(config: EngineConfig, *, system: str | None, max_tokens: int, temperature: float) -> int:
    engine = Engine(config)
    try:
        trio.run(_chat_loop, engine, system, SamplingParams(max_tokens=max_tokens, temperature=temperature))
    except KeyboardInterrupt:
        print()
    finally:
        engine.close()
    return 0
