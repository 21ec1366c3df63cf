"""The rest of the completions surface on a real server: a list of prompts in one request
(strings or token-id lists, answered as choices in order), ``echo`` with ``logprobs`` (prompt
logprobs, checked against the Hugging Face transformers oracle) and vLLM's ``prompt_logprobs``
on both endpoints."""

from __future__ import annotations

import json
import math

import httpx
import pytest
import torch

MODEL = "SmolLM2-135M-Instruct"
PROMPTS = ["The capital of France is", "1, 2, 3, 4,", "Once upon a time"]


def complete(http, **body):
    r = http.post("/v1/completions", json={"model": MODEL, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_batched_prompts_answer_in_order(http):
    batch = complete(http, prompt=PROMPTS, max_tokens=6, n=2)
    assert [c["index"] for c in batch["choices"]] == list(range(6))
    singles = [complete(http, prompt=p, max_tokens=6) for p in PROMPTS]
    for k, single in enumerate(singles):
        for j in range(2):  # index = prompt index x n + choice
            assert batch["choices"][k * 2 + j]["text"] == single["choices"][0]["text"]
    assert batch["usage"]["prompt_tokens"] == sum(s["usage"]["prompt_tokens"] for s in singles)
    assert batch["usage"]["completion_tokens"] == 2 * sum(s["usage"]["completion_tokens"] for s in singles)


def test_token_id_lists_and_streaming(http):
    ids = [http.post("/tokenize", json={"prompt": p}).json()["tokens"] for p in PROMPTS[:2]]
    whole = complete(http, prompt=ids, max_tokens=5)
    assert [c["text"] for c in whole["choices"]] == [
        complete(http, prompt=p, max_tokens=5)["choices"][0]["text"] for p in ids
    ]
    texts = ["", ""]
    with http.stream(
        "POST", "/v1/completions", json={"prompt": ids, "max_tokens": 5, "temperature": 0, "stream": True}
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    texts[choice["index"]] += choice["text"]
    assert texts == [c["text"] for c in whole["choices"]]


@pytest.mark.parametrize(
    "prompt, param",
    [
        (["text", [1, 2]], "prompt"),
        ([1, "text"], "prompt"),
        (["ok", [99999999]], "prompt"),
        ([[1], [10**9]], "prompt[1]"),
    ],
)
def test_mixed_or_bad_prompts_name_the_field(http, prompt, param):
    r = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_suffix_stays_a_clear_400(http):
    r = http.post("/v1/completions", json={"prompt": "def f(", "suffix": "return x", "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"


def test_echo_with_logprobs_scores_the_prompt_like_the_hf_oracle(exact_server, hf_reference_dir):
    from transformers import AutoModelForCausalLM

    http = httpx.Client(base_url=exact_server.base_url, timeout=120)

    prompt = "The quick brown fox jumps over the lazy dog."
    body = complete(http, prompt=prompt, max_tokens=1, echo=True, logprobs=3, prompt_logprobs=3)
    choice = body["choices"][0]
    assert choice["text"].startswith(prompt)
    lp = choice["logprobs"]
    ids = http.post("/tokenize", json={"prompt": prompt}).json()["tokens"]
    n = len(ids)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert "".join(lp["tokens"][:n]) == prompt and lp["text_offset"][:n] == [
        sum(len(t) for t in lp["tokens"][:i]) for i in range(n)
    ]
    hf = AutoModelForCausalLM.from_pretrained(hf_reference_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        logits = hf(torch.tensor([ids])).logits[0].float()
    truth = torch.log_softmax(logits, dim=-1)
    tol = 2e-4 * float(logits.abs().max())  # the logits parity test's bound, through a log-softmax
    for p in range(1, n):
        assert math.isclose(lp["token_logprobs"][p], float(truth[p - 1, ids[p]]), abs_tol=tol), p
        for text, value in lp["top_logprobs"][p].items():
            assert value >= float(truth[p - 1].topk(3).values[-1]) - tol, (p, text)
    # vLLM's prompt_logprobs: the same numbers, keyed by token id
    vllm = choice["prompt_logprobs"]
    assert vllm[0] is None and len(vllm) == n
    for p in range(1, n):
        assert vllm[p][str(ids[p])]["logprob"] == lp["token_logprobs"][p]


def test_chat_prompt_logprobs(http):
    r = http.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 2, "prompt_logprobs": 1},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    n = body["usage"]["prompt_tokens"]
    assert len(body["prompt_logprobs"]) == n and body["prompt_logprobs"][0] is None
    assert all(len(entry) in (1, 2) for entry in body["prompt_logprobs"][1:])
    bad = http.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "prompt_logprobs": -1}
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt_logprobs"


def test_siblings_share_their_prompts_logprobs_and_offsets_follow_the_tokens(http):
    body = complete(http, prompt=[[1, 504, 3050, 314]], max_tokens=3, n=2, echo=True, logprobs=1, prompt_logprobs=1)
    first, second = body["choices"]
    assert first["prompt_logprobs"] == second["prompt_logprobs"] and first["prompt_logprobs"][0] is None
    for choice in body["choices"]:
        lp = choice["logprobs"]
        assert lp["token_logprobs"][:4] == first["logprobs"]["token_logprobs"][:4]
        # offsets never go back, and each token starts where the tokens before it end
        assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(len(lp["tokens"]))]


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": ["x"] * 257, "max_tokens": 1}, "prompt"),  # more prompts than --max-prompts
        ({"prompt": "word " * 1700, "max_tokens": 1, "prompt_logprobs": 20, "n": 2}, "prompt_logprobs"),
    ],
)
def test_batch_and_prompt_logprob_limits(http, body, param):
    r = http.post("/v1/completions", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and r.json()["error"]["code"] == "limit_exceeded"


def test_echo_with_zero_max_tokens_scores_the_prompt_alone(http):
    prompt = "The quick brown fox jumps over the lazy dog."
    ids = http.post("/tokenize", json={"prompt": prompt}).json()["tokens"]
    body = complete(http, prompt=prompt, max_tokens=0, echo=True, logprobs=0)
    (choice,) = body["choices"]
    assert choice["text"] == prompt and choice["finish_reason"] == "length"
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(ids) and lp["token_logprobs"][0] is None
    assert all(v < 0 for v in lp["token_logprobs"][1:])
    assert body["usage"]["completion_tokens"] == 0 and body["usage"]["total_tokens"] == len(ids)
    # the same scores as echo with a generated token, which follows them
    longer = complete(http, prompt=prompt, max_tokens=1, echo=True, logprobs=0)["choices"][0]["logprobs"]
    assert longer["token_logprobs"][: len(ids)] == lp["token_logprobs"]
    streamed = ""
    with http.stream(
        "POST", "/v1/completions", json={"prompt": prompt, "max_tokens": 0, "echo": True, "stream": True}
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                streamed += "".join(c["text"] for c in json.loads(line[6:])["choices"])
    assert streamed == prompt
    bad = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 0})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"
