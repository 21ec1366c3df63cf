"""N-gram speculation end to end on the default model: lossless for greedy requests.

The same prompts run through an engine without speculation and one with it; every greedy output
must be token-identical (the verify kernel accepts a draft only where the model's own argmax
agrees, and the kernels compute a row the same way whatever else is in the step). The prompts
include text the model is asked to copy, so drafts are proposed and accepted, and the engine's
blocks must all be back afterwards.
"""

from __future__ import annotations

import json
import os

import httpx
import pytest

from tests.integration.conftest import SERVER_ARGS, ServerProcess
from tests.integration.test_hf_parity import CHAT, RAW
from trillium import LLM, SamplingParams

pytestmark = [
    pytest.mark.slow,
    # Token identity with and without speculation rests on the CPU kernels giving a token the
    # same bits in every kind of step. On a GPU a verify step (k + 1 tokens per request) and a
    # decode step run other kernels and matmul shapes, so bf16 logits round differently and a
    # near-tie may flip: lossless in distribution, not bit for bit (docs/gpu.md).
    pytest.mark.skipif(
        os.environ.get("TRILLIUM_DEVICE", "cpu") not in ("", "cpu"),
        reason="bitwise identity with speculation is a CPU-kernel property",
    ),
]

COPY = [
    "Repeat exactly: the cat sat on the mat, the cat sat on the mat, the cat sat on the mat,",
    "def area(r):\n    return 3.14159 * r * r\n\n\ndef area(r):\n    return 3.14159 * r * r\n\n\ndef area(r):\n",
    "1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3,",
]


@pytest.fixture(scope="module")
def engines():
    plain = LLM(progress=False, speculative_config=None)
    spec = LLM(progress=False, speculative_config='{"method": "ngram", "num_speculative_tokens": 4}')
    yield plain, spec
    plain.engine.close()
    spec.engine.close()


def _blocks_all_back(llm: LLM) -> bool:
    kv = llm.engine.scheduler.policy.kv
    kv.check_invariants()
    return kv.num_reclaimable_blocks == kv.num_total_blocks


def test_greedy_outputs_are_token_identical_with_speculation(engines) -> None:
    plain, spec = engines
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    prompts = RAW + COPY
    want = [o.token_ids for o in plain.generate(prompts, params)]
    want_chat = [o.token_ids for o in plain.chat(CHAT, params)]
    before = spec.engine.scheduler.policy.spec_stats.num_accepted_tokens
    for batch in (prompts, [prompts[-1]]):  # together (speculation stands aside at 4+) and alone
        got = [o.token_ids for o in spec.generate(batch, params)]
        assert got == want[len(prompts) - len(batch) :]
    assert [o.token_ids for o in spec.chat(CHAT, params)] == want_chat
    stats = spec.engine.scheduler.policy.spec_stats
    assert stats.num_accepted_tokens > before  # the copy prompts were sped up, not just allowed
    assert _blocks_all_back(spec)


def test_seeded_sampling_gives_the_same_tokens_with_speculation(engines) -> None:
    """A seeded request's number for each sequence position is fixed, and an n-gram draft is
    accepted exactly when it equals the draw there: the same text with or without speculation,
    whatever shares the batch. Unseeded sampled requests speculate too (no leak, valid output)."""
    plain, spec = engines
    params = [
        SamplingParams(max_tokens=40, temperature=t, top_p=p, top_k=k, seed=s, ignore_eos=True)
        for t, p, k, s in ((0.7, 1.0, -1, 1), (1.0, 0.9, -1, 2), (0.5, 1.0, 20, 3))
    ]
    prompts = COPY
    want = [o.token_ids for o in plain.generate(prompts, params)]
    before = spec.engine.scheduler.policy.spec_stats.num_drafts
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        assert spec.generate(prompt, p)[0].token_ids == want[i]
    assert spec.engine.scheduler.policy.spec_stats.num_drafts > before
    assert [o.token_ids for o in spec.generate(prompts, params)] == want  # batched
    unseeded = spec.generate(COPY[0], SamplingParams(max_tokens=20, temperature=0.8, ignore_eos=True))[0]
    assert len(unseeded.token_ids) == 20
    assert _blocks_all_back(spec)


def test_penalties_logprobs_and_grammar_speculate_and_match_plain_decoding(engines) -> None:
    """Each draft position is processed as if the drafts before it were output: its penalties
    count them, its logprobs are reported, and its grammar mask is the one after them. So
    these requests speculate too, and their tokens and logprobs equal plain decoding's."""
    from trillium.protocol import StructuredOutputs

    plain, spec = engines
    schema = {"type": "object", "properties": {"text": {"type": "string", "maxLength": 200}}, "required": ["text"]}
    copy_as_json = (
        'Repeat "the cat sat on the mat, the cat sat on the mat, the cat sat on the mat" as JSON: {"text": "the'
    )
    cases = [
        (COPY[0], SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, repetition_penalty=1.05)),
        (COPY[2], SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, frequency_penalty=0.1)),
        (COPY[1], SamplingParams(max_tokens=40, temperature=0.7, seed=5, ignore_eos=True, presence_penalty=0.2)),
        (COPY[2], SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, logprobs=3)),
        (COPY[0], SamplingParams(max_tokens=30, temperature=0.8, seed=9, ignore_eos=True, logprobs=2)),
        (
            copy_as_json,
            SamplingParams(max_tokens=60, temperature=0.0, structured=StructuredOutputs(json=json.dumps(schema))),
        ),
        (
            COPY[0],
            SamplingParams(
                max_tokens=50,
                temperature=0.0,
                structured=StructuredOutputs(regex=r"(the (cat|dog) sat on the mat, ){2,8}"),
            ),
        ),
    ]
    stats = spec.engine.scheduler.policy.spec_stats
    for prompt, params in cases:
        want = plain.generate(prompt, params)[0]
        before = stats.num_drafts
        got = spec.generate(prompt, params)[0]
        assert got.token_ids == want.token_ids, params
        assert got.finish_reason == want.finish_reason
        if params.logprobs is not None:
            assert got.logprobs is not None and want.logprobs is not None
            assert len(got.logprobs) == len(got.token_ids)
            for (g_lp, g_top), (w_lp, w_top) in zip(got.logprobs, want.logprobs):
                assert g_lp == pytest.approx(w_lp, abs=1e-4)
                assert [t for t, _ in g_top] == [t for t, _ in w_top]
                assert [v for _, v in g_top] == pytest.approx([v for _, v in w_top], abs=1e-4)
        assert stats.num_drafts > before, params  # it really speculated
    assert _blocks_all_back(spec)


def test_prompt_logprobs_with_speculation_equal_plain_decoding(engines) -> None:
    """Prompt logprobs are the prefill's: a request asking for them still speculates while it
    decodes, and its prompt logprobs and tokens equal plain decoding's."""
    plain, spec = engines
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True, prompt_logprobs=2)
    stats = spec.engine.scheduler.policy.spec_stats
    for prompt in COPY[:2]:
        want = plain.generate(prompt, params)[0]
        before = stats.num_drafts
        got = spec.generate(prompt, params)[0]
        assert got.token_ids == want.token_ids
        assert stats.num_drafts > before  # it really speculated
        assert got.prompt_logprobs is not None and want.prompt_logprobs is not None
        assert len(got.prompt_logprobs) == len(got.prompt_token_ids) and got.prompt_logprobs[0] is None
        for (g_lp, g_top), (w_lp, w_top) in zip(got.prompt_logprobs[1:], want.prompt_logprobs[1:]):
            assert g_lp == pytest.approx(w_lp, abs=1e-4)
            assert [t for t, _ in g_top] == [t for t, _ in w_top]
    assert _blocks_all_back(spec)


def test_step_costs_are_measured_at_start_up(engines) -> None:
    """With speculation on, the engine times verify against decode steps at start-up: per batch
    size, the chance of acceptance a draft needs to pay for its row, and, with
    ``disable_by_batch_size`` unset, the batch size where no draft can pay any more."""
    from trillium.engine.step_costs import NEVER_PAYS

    _, spec = engines
    costs = spec.engine.spec_costs
    policy = spec.engine.scheduler.policy
    assert costs is not None and policy.config.spec_break_even == costs.break_even_table()
    assert costs.batch_sizes == [2**i for i in range(len(costs.batch_sizes))]
    assert all(d > 0 and v > 0 for d, v in zip(costs.decode_s, costs.verify_s))
    break_even = costs.break_even()
    assert all(0.0 <= p < NEVER_PAYS for p in break_even[:-1])
    threshold = spec.engine.config.speculative_config.disable_by_batch_size
    assert threshold == policy.spec_threshold
    if break_even[-1] >= NEVER_PAYS:
        assert threshold == costs.batch_sizes[-1]
    else:
        assert threshold == 2 * spec.engine.config.max_running


def test_stop_token_and_max_tokens_inside_an_accepted_run(engines) -> None:
    plain, spec = engines
    prompt = COPY[2]
    free = plain.generate(prompt, SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True))[0].token_ids
    stop_id = free[12]
    first = free.index(stop_id)
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True, stop_token_ids=[stop_id])
    stopped = spec.generate(prompt, params)[0]
    assert stopped.token_ids == free[: first + 1] and stopped.finish_reason == "stop"
    for n in (1, 3, 7, 11):
        out = spec.generate(prompt, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))[0]
        assert out.token_ids == free[:n] and out.finish_reason == "length"
    assert _blocks_all_back(spec)


def test_server_flag_streams_speculated_tokens_and_reports_them() -> None:
    """``trillium serve --speculative-config``: a streamed greedy completion equals the
    non-streamed one, /stats shows the acceptance rate and /metrics vLLM's spec_decode counters."""
    srv = ServerProcess(*SERVER_ARGS, "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}')
    try:
        with httpx.Client(base_url=srv.base_url, timeout=120) as http:
            body = {"prompt": COPY[2], "max_tokens": 32, "temperature": 0, "ignore_eos": True}
            whole = http.post("/v1/completions", json=body).json()["choices"][0]["text"]
            with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
                chunks = [line[6:] for line in response.iter_lines() if line.startswith("data: {")]
            assert "".join(json.loads(c)["choices"][0]["text"] for c in chunks) == whole
            stats = http.get("/stats").json()
            assert stats["spec_num_accepted_tokens"] > 0 and 0 < stats["spec_acceptance_rate"] <= 1
            assert stats["spec_disable_by_batch_size"] >= 1  # measured at start-up
            metrics = http.get("/metrics").text
            assert "trillium:spec_decode_num_accepted_tokens_total" in metrics
            assert "trillium:spec_decode_num_accepted_tokens_per_pos_total{model_name=" in metrics
        assert srv.stop() == 0
    finally:
        srv.stop()


async def test_aborts_stops_preemption_and_structured_output_leak_no_block() -> None:
    """A small KV pool (preemption), speculating copy prompts (one stopping on a token inside its
    accepted runs), a JSON-schema request in the same batch, and two clients that hang up
    mid-stream: afterwards no block is in use and the drafts were really accepted."""
    import trio

    spec = '{"method": "ngram", "num_speculative_tokens": 4, "disable_by_batch_size": 16}'
    srv = ServerProcess("--dtype", "fp32", "--kv-cache-gib", "0.02", "--speculative-config", spec)
    try:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=300) as client:
            model = (await client.get("/v1/models")).json()["data"][0]["id"]

            def completion(prompt: str, **extra: object) -> dict:
                return {
                    "model": model,
                    "prompt": prompt,
                    "max_tokens": 200,
                    "temperature": 0,
                    "ignore_eos": True,
                    **extra,
                }

            plain = (await client.post("/v1/completions", json=completion(COPY[2]))).json()
            tokens = (
                await client.post("/tokenize", json={"model": model, "prompt": plain["choices"][0]["text"]})
            ).json()
            stop_id = tokens["tokens"][20]
            finishes: dict[str, str] = {}

            async def complete(name: str, payload: dict) -> None:
                r = await client.post("/v1/completions", json=payload)
                assert r.status_code == 200, r.text
                finishes[name] = r.json()["choices"][0]["finish_reason"]

            async def hang_up(prompt: str) -> None:
                async with client.stream("POST", "/v1/completions", json=completion(prompt, stream=True)) as r:
                    seen = 0
                    async for line in r.aiter_lines():
                        seen += line.startswith("data: {")
                        if seen >= 3:
                            break

            schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
            async with trio.open_nursery() as nursery:
                for i, prompt in enumerate(COPY):
                    nursery.start_soon(complete, f"copy{i}", completion(prompt))
                nursery.start_soon(complete, "stop", completion(COPY[2], stop_token_ids=[stop_id]))
                nursery.start_soon(
                    complete,
                    "json",
                    completion(
                        "A JSON object naming a cat:",
                        response_format={"type": "json_schema", "json_schema": {"name": "cat", "schema": schema}},
                    ),
                )
                nursery.start_soon(hang_up, COPY[0])
                nursery.start_soon(hang_up, COPY[1])
            assert finishes["stop"] == "stop" and finishes["copy0"] == "length"
            with trio.fail_after(10):
                while True:
                    stats = (await client.get("/stats")).json()
                    if stats["num_blocks_in_use"] == 0 and stats["num_requests_running"] == 0:
                        break
                    await trio.sleep(0.05)
            assert stats["num_preemptions"] > 0, stats
            assert stats["spec_num_accepted_tokens"] > 0, stats
    finally:
        srv.stop()
