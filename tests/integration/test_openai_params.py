"""Every sampling / request parameter through the official ``openai`` client, streamed and not."""

from __future__ import annotations

import concurrent.futures

import pytest

MODEL = "SmolLM2-135M-Instruct"
BLOCK_SIZE = 16  # the server's default --block-size
CHAT = [{"role": "user", "content": "Write one sentence about the sea."}]
LONG_PROMPT = "The history of the lighthouse begins in ancient times, when fires were lit on hills " * 3


def chat(client, **kwargs):
    return client.chat.completions.create(model=MODEL, messages=kwargs.pop("messages", CHAT), **kwargs)


def complete(client, **kwargs):
    return client.completions.create(model=MODEL, prompt=kwargs.pop("prompt", "The sea is"), **kwargs)


# ---- n ----------------------------------------------------------------------------------------


def test_n_returns_choices_that_share_the_prompt_blocks(openai_client):
    r = complete(openai_client, prompt=LONG_PROMPT, n=3, max_tokens=8, temperature=1.0, seed=5)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(c.finish_reason == "length" for c in r.choices)
    assert r.usage.completion_tokens == 3 * 8
    per_choice = r.usage.prompt_tokens_details.model_extra["cached_tokens_per_choice"]
    assert all(c >= r.usage.prompt_tokens - BLOCK_SIZE for c in per_choice[1:]), (per_choice, r.usage)


def test_n_streamed_chunks_carry_index(openai_client):
    chunks = list(
        chat(
            openai_client,
            n=2,
            max_tokens=6,
            temperature=1.0,
            seed=1,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    texts = {0: "", 1: ""}
    finishes = {}
    for c in chunks:
        for choice in c.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert set(finishes) == {0, 1} and all(texts.values())
    assert chunks[-1].choices == [] and 2 <= chunks[-1].usage.completion_tokens <= 12


def test_seeded_n_choices_use_seed_plus_index(openai_client):
    both = complete(openai_client, n=2, max_tokens=8, temperature=1.0, seed=40)
    second = complete(openai_client, max_tokens=8, temperature=1.0, seed=41)
    assert both.choices[1].text == second.choices[0].text


# ---- seed -------------------------------------------------------------------------------------


def test_seed_is_reproducible_inside_a_busy_batch(openai_client):
    seeded = {"prompt": "My favourite animal is", "max_tokens": 16, "temperature": 1.0, "top_p": 0.95, "seed": 1234}
    alone = complete(openai_client, **seeded).choices[0].text
    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        noise = [
            pool.submit(complete, openai_client, prompt=f"Story number {i}:", max_tokens=24, temperature=1.0)
            for i in range(4)
        ]
        busy = pool.submit(complete, openai_client, **seeded)
        assert busy.result().choices[0].text == alone
        [f.result() for f in noise]


# ---- stop, text ------------------------------------------------------------------------------


def test_stop_string_spanning_tokens(openai_client):
    base = complete(openai_client, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0).choices[0].text
    assert "6, 7" in base, base
    for stream in (False, True):
        r = complete(
            openai_client, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0, stop=["6, 7", "zz"], stream=stream
        )
        if stream:
            chunks = list(r)
            text = "".join(c.choices[0].text for c in chunks)
            reason = chunks[-1].choices[0].finish_reason
        else:
            text, reason = r.choices[0].text, r.choices[0].finish_reason
        assert text == base[: base.index("6, 7")] and reason == "stop"


def test_emoji_and_cjk_stream_without_replacement_characters(openai_client):
    prompt = "你好，世界 😀🎉 你好，世界 😀🎉 你好，世界 😀🎉 你好，世界"
    full = complete(openai_client, prompt=prompt, max_tokens=24, temperature=0).choices[0].text
    chunks = list(complete(openai_client, prompt=prompt, max_tokens=24, temperature=0, stream=True))
    pieces = [c.choices[0].text for c in chunks]
    assert "".join(pieces) == full
    assert all("\ufffd" not in p for p in pieces)
    assert any(ord(ch) > 0x2E80 for ch in full), full  # the model did produce CJK or emoji


def test_include_usage_final_chunk(openai_client):
    chunks = list(
        complete(openai_client, max_tokens=5, temperature=0, stream=True, stream_options={"include_usage": True})
    )
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    assert all(c.usage is None for c in chunks[:-1])


# ---- length and token controls ----------------------------------------------------------------


def test_max_completion_tokens_user_and_ignore_eos(openai_client):
    r = chat(
        openai_client,
        max_completion_tokens=7,
        temperature=0,
        user="alice",
        messages=[{"role": "user", "content": "Say hello."}],
        extra_body={"ignore_eos": True},
    )
    assert r.usage.completion_tokens == 7 and r.choices[0].finish_reason == "length"


def test_min_tokens_defers_eos(openai_client):
    short = chat(openai_client, messages=[{"role": "user", "content": "Say hello."}], max_tokens=32, temperature=0)
    assert short.choices[0].finish_reason == "stop"
    n = min(short.usage.completion_tokens + 2, 32)
    longer = chat(
        openai_client,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=32,
        temperature=0,
        extra_body={"min_tokens": n},
    )
    assert longer.usage.completion_tokens >= n


def test_stop_token_ids(openai_client, http):
    base = complete(openai_client, prompt="1, 2, 3, 4,", max_tokens=8, temperature=0)
    ids = http.post("/tokenize", json={"prompt": base.choices[0].text}).json()["tokens"]
    r = complete(
        openai_client,
        prompt="1, 2, 3, 4,",
        max_tokens=8,
        temperature=0,
        extra_body={"stop_token_ids": [ids[2]], "skip_special_tokens": True},
    )
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 3


def test_the_end_of_turn_token_is_no_text_even_with_special_tokens_shown(openai_client):
    # skip_special_tokens=false shows special tokens the model writes, but the one that ended the
    # answer (<|im_end|>) is a stop, not content.
    r = openai_client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hi."}],
        max_tokens=60,
        temperature=0,
        extra_body={"skip_special_tokens": False},
    )
    assert r.choices[0].finish_reason == "stop"
    assert "<|im_end|>" not in r.choices[0].message.content


def test_echo_and_suffix(openai_client):
    r = complete(openai_client, prompt="The sea is", max_tokens=4, temperature=0, echo=True)
    assert r.choices[0].text.startswith("The sea is") and len(r.choices[0].text) > len("The sea is")
    chunks = list(complete(openai_client, prompt="The sea is", max_tokens=4, temperature=0, echo=True, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text
    import openai

    with pytest.raises(openai.BadRequestError, match="suffix"):
        complete(openai_client, max_tokens=4, suffix="end")


# ---- sampling knobs ---------------------------------------------------------------------------


def test_logit_bias_forces_and_bans(openai_client, http):
    token = http.post("/tokenize", json={"prompt": " banana"}).json()["tokens"][0]
    r = complete(openai_client, max_tokens=4, temperature=0, logit_bias={str(token): 100})
    assert r.choices[0].text == " banana" * 4
    base = complete(openai_client, max_tokens=1, temperature=0)
    first = http.post("/tokenize", json={"prompt": base.choices[0].text}).json()["tokens"][0]
    banned = complete(openai_client, max_tokens=1, temperature=0, logit_bias={str(first): -100})
    assert banned.choices[0].text != base.choices[0].text


def test_penalties_top_k_min_p(openai_client):
    prompt = "one one one one one one"
    base = complete(openai_client, prompt=prompt, max_tokens=8, temperature=0).choices[0].text
    freq = complete(openai_client, prompt=prompt, max_tokens=8, temperature=0, frequency_penalty=2.0)
    assert freq.choices[0].text != base
    rep = complete(openai_client, prompt=prompt, max_tokens=8, temperature=0, extra_body={"repetition_penalty": 3.0})
    assert rep.choices[0].text != base
    # presence penalty's arithmetic is unit-tested; here: accepted, and greedy stays deterministic
    pres = [
        complete(openai_client, prompt=prompt, max_tokens=8, temperature=0, presence_penalty=1.5).choices[0].text
        for _ in range(2)
    ]
    assert pres[0] == pres[1]
    for stream in (False, True):
        r = complete(
            openai_client,
            max_tokens=4,
            temperature=0.8,
            top_p=0.9,
            stream=stream,
            extra_body={"top_k": 5, "min_p": 0.1},
        )
        text = "".join(c.choices[0].text for c in r) if stream else r.choices[0].text
        assert text


# ---- logprobs ---------------------------------------------------------------------------------


def test_chat_logprobs_shape(openai_client):
    r = chat(openai_client, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        assert entry.top_logprobs[0].token == entry.token  # greedy picks the best
        assert bytes(entry.bytes).decode() == entry.token
    chunks = list(chat(openai_client, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3, stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], abs=1e-4)
    plain = chat(openai_client, max_tokens=2, temperature=0)
    assert plain.choices[0].logprobs is None


def test_completion_logprobs_shape(openai_client):
    r = complete(openai_client, max_tokens=5, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 5
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset[0] == 0 and lp.text_offset[1] == len(lp.tokens[0])
    assert all(len(t) == 2 for t in lp.top_logprobs)
    chunks = list(complete(openai_client, max_tokens=5, temperature=0, logprobs=2, stream=True))
    tokens = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert tokens == lp.tokens


# ---- tokenize ---------------------------------------------------------------------------------


def test_tokenize_detokenize_round_trip(http):
    r = http.post("/tokenize", json={"model": MODEL, "prompt": "Hello, world"}).json()
    assert r["count"] == len(r["tokens"]) and r["max_model_len"] == 2048
    assert http.post("/detokenize", json={"tokens": r["tokens"]}).json() == {"prompt": "Hello, world"}
    m = http.post("/tokenize", json={"messages": CHAT}).json()
    assert m["count"] > r["count"]
    assert http.post("/detokenize", json={"tokens": [10**9]}).status_code == 400


def test_tokenize_honours_add_generation_prompt(http):
    """Without the generation prompt the rendered chat stops after the last message: a strict
    prefix of the tokens with it (the assistant header that follows)."""
    with_header = http.post("/tokenize", json={"messages": CHAT}).json()["tokens"]
    without = http.post("/tokenize", json={"messages": CHAT, "add_generation_prompt": False}).json()["tokens"]
    assert len(without) < len(with_header) and with_header[: len(without)] == without


def test_render_gives_the_token_ids_a_request_runs(http, openai_client):
    """vLLM's render endpoints (vllm-router's kv_aware policy asks them to score replicas): the
    prompt ids a chat completion runs -- the template, and the tools it lists -- without running it."""
    rendered = http.post("/v1/chat/completions/render", json={"model": MODEL, "messages": CHAT}).json()
    assert rendered["token_ids"] == http.post("/tokenize", json={"messages": CHAT}).json()["tokens"]
    assert rendered["count"] == len(rendered["token_ids"]) == chat(openai_client, max_tokens=1).usage.prompt_tokens
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    with_tools = http.post("/v1/chat/completions/render", json={"messages": CHAT, "tools": [tool]}).json()
    assert len(with_tools["token_ids"]) > rendered["count"]  # the template lists the tool
    assert with_tools["count"] == chat(openai_client, max_tokens=1, tools=[tool]).usage.prompt_tokens
    text = http.post("/v1/completions/render", json={"model": MODEL, "prompt": "The sea is"}).json()
    assert text["token_ids"] == http.post("/tokenize", json={"prompt": "The sea is"}).json()["tokens"]
    ids = http.post("/v1/completions/render", json={"prompt": [[5, 6, 7], [8]]}).json()
    assert ids["token_ids"] == [5, 6, 7]  # the first prompt: a request goes to one replica
    bad = http.post("/v1/completions/render", json={"prompt": [[5, 10**9]]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"
    no_fim = http.post("/v1/completions/render", json={"prompt": "def f(", "suffix": "return x"})
    assert no_fim.status_code == 400 and no_fim.json()["error"]["param"] == "suffix"
    missing = http.post("/v1/chat/completions/render", json={"model": "nope", "messages": CHAT})
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"
    assert http.post("/v1/chat/completions/render", json={"messages": []}).status_code == 400


# ---- validation -------------------------------------------------------------------------------

BAD = [
    ("temperature", -0.1),
    ("temperature", 2.5),
    ("top_p", 0.0),
    ("top_p", 1.5),
    ("n", 0),
    ("n", 17),
    ("presence_penalty", 2.5),
    ("frequency_penalty", -3),
    ("repetition_penalty", 0.0),
    ("min_p", 1.5),
    ("top_k", 0),
    ("logit_bias", {"999999": 1}),
    ("logit_bias", {"5": 200}),
    ("stop", ["x"] * 17),
    ("max_tokens", 0),
    ("min_tokens", -1),
    ("seed", 2**80),
    ("seed", -(2**64)),
]


@pytest.mark.parametrize("name,value", BAD)
def test_out_of_range_is_400_naming_the_parameter(http, name, value):
    r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": CHAT, "max_tokens": 2, name: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == name


def test_stream_options_without_stream_is_400(http):
    for path, body in (("/v1/chat/completions", {"messages": CHAT}), ("/v1/completions", {"prompt": "x"})):
        r = http.post(path, json={**body, "max_tokens": 2, "stream_options": {"include_usage": True}})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "stream_options"


def test_top_logprobs_and_completion_logprobs_limits(http):
    r = http.post("/v1/chat/completions", json={"messages": CHAT, "logprobs": True, "top_logprobs": 21})
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs"
    r = http.post("/v1/completions", json={"prompt": "x", "logprobs": 6})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs"


def test_unknown_fields_are_ignored(http):
    r = http.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2, "frobnicate": {"a": 1}})
    assert r.status_code == 200
