"""The load generator's client side: prompts, and one streamed request against any
OpenAI-compatible server (trillium, vLLM, llama.cpp's llama-server, ...)."""

from __future__ import annotations

import json
import os
import random
import time

import httpx

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "sharegpt_first_turns_500.json")


def load_prompts(path: str | None, n: int, synthetic_words: int, seed: int) -> list[str]:
    """``n`` prompts: ShareGPT first turns (shuffled with ``seed``, cut to 4,000 characters) or,
    without a file, ``synthetic_words`` random common words each (different for every request, so
    no engine's prefix cache can serve one prompt from another)."""
    if path and os.path.exists(path):
        with open(path) as f:
            items = json.load(f)
        texts = [it["conversations"][0]["value"][:4000] for it in items if it.get("conversations")]
        random.Random(seed).shuffle(texts)
        return [texts[i % len(texts)] for i in range(n)]
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(synthetic_words)) for _ in range(n)]


_WORDS = (
    "time year people way day man thing woman life child world school state family student group "
    "country problem hand part place case week company system program question work government "
    "number night point home water room mother area money story fact month lot right study book eye "
    "job word business issue side kind head house service friend father power hour game line end"
).split()


async def stream_request(
    client: httpx.AsyncClient,
    endpoint: str,
    model: str,
    prompt: str,
    max_tokens: int,
    ignore_eos: bool,
    sampling: dict | None = None,
    messages: list[dict] | None = None,
) -> dict:
    """Send one streamed request; return its record (see serving_metrics). Never raises for HTTP or
    protocol errors: the record is marked ``ok: False`` with the error text, as is a stream that
    ends without a finish_reason (a server that died mid-answer). ``sampling``: OpenAI sampling
    fields (default: greedy, ``{"temperature": 0}``). ``messages``: the chat conversation to send
    instead of one user turn of ``prompt``."""
    payload: dict = {
        "model": model,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        **(sampling or {"temperature": 0}),
    }
    if ignore_eos:
        payload["ignore_eos"] = True
    if endpoint == "chat":
        payload["messages"] = messages or [{"role": "user", "content": prompt}]
        path = "/v1/chat/completions"
    else:
        payload["prompt"] = prompt
        path = "/v1/completions"
    rec = {"start": time.perf_counter(), "chunk_times": [], "output_tokens": 0, "prompt_tokens": 0, "ok": False}
    usage = None
    try:
        async with client.stream("POST", path, json=payload) as r:
            if r.status_code != 200:
                rec["error"] = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                if r.status_code in (429, 503):  # overload: the server says when to come back
                    rec["retry_after"] = r.headers.get("retry-after")
                return rec
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line.strip() == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    usage = chunk["usage"]
                choices = chunk.get("choices") or []
                if choices:
                    piece = (
                        choices[0].get("text") if endpoint != "chat" else (choices[0].get("delta") or {}).get("content")
                    )
                    if piece:
                        rec["chunk_times"].append(time.perf_counter())
                    if choices[0].get("finish_reason"):
                        rec["finish_reason"] = choices[0]["finish_reason"]
        rec["ok"] = "finish_reason" in rec
        if not rec["ok"]:
            rec["error"] = "the stream ended without a finish_reason"
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        rec["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        rec["end"] = time.perf_counter()
    rec["output_tokens"] = usage["completion_tokens"] if usage else len(rec["chunk_times"])
    rec["prompt_tokens"] = usage["prompt_tokens"] if usage else 0
    return rec
