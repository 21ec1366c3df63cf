"""Offline ``LLM`` (no server) and ``trillium chat``, through the same scheduler."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from trillium import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm():
    return LLM(dtype="fp32", progress=False, max_model_len=1024, kv_cache_gib=0.1)


def test_generate_batches_prompts_and_respects_max_tokens(llm):
    prompts = ["The capital of France is", "1, 2, 3, 4,", "def fibonacci(n):"]
    outs = llm.generate(prompts, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    assert [o.prompt for o in outs] == prompts
    for o in outs:
        assert len(o.token_ids) == 8 and o.finish_reason == "length" and o.text
    assert llm.tokenizer.decode(outs[1].token_ids).startswith(" 5")
    # greedy is deterministic: the same prompt alone gives the same tokens
    alone = llm.generate(prompts[0], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))[0]
    assert alone.token_ids == outs[0].token_ids


def test_chat_stops_at_end_of_turn(llm):
    out = llm.chat(
        [{"role": "user", "content": "What is 2+2? Answer with a number."}],
        SamplingParams(max_tokens=64, temperature=0),
    )[0]
    assert out.finish_reason == "stop"
    assert "4" in out.text
    assert out.token_ids[-1] in llm.tokenizer.eos_token_ids


def test_many_prompts_more_than_the_inbox_bound(llm):
    outs = llm.generate([f"Number {i}:" for i in range(300)], SamplingParams(max_tokens=2, temperature=0))
    assert len(outs) == 300 and all(len(o.token_ids) <= 2 for o in outs)


def test_a_prompt_of_no_tokens_is_refused_and_the_engine_goes_on(llm):
    """A character the vocabulary has no token for tokenizes to nothing: a clear error, not a
    failed step."""
    with pytest.RaisesGroup(pytest.RaisesExc(ValueError, match="no tokens"), flatten_subgroups=True):
        llm.generate("\x04", SamplingParams(max_tokens=2))
    assert len(llm.generate("Hello", SamplingParams(max_tokens=2, temperature=0))[0].token_ids) == 2


def test_trillium_chat_streams_an_answer():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "trillium.cli",
            "chat",
            "--dtype",
            "fp32",
            "--max-model-len",
            "1024",
            "--kv-cache-gib",
            "0.1",
            "--temperature",
            "0",
            "--max-tokens",
            "32",
        ],
        input="What is the capital of France?\n\n",
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout


def test_every_step_runs_on_the_thread_that_loaded_the_model(llm, monkeypatch):
    """One OpenMP team per process (see trillium.engine.step_thread): the model was loaded on the
    engine's step thread, and steps run there, not on the caller's or a cached worker thread."""
    runner = llm.engine.runner
    threads: set[int] = set()
    execute = runner.execute

    def recording(step_input):
        threads.add(threading.get_ident())
        return execute(step_input)

    monkeypatch.setattr(runner, "execute", recording)
    llm.generate(["a", "b"], SamplingParams(max_tokens=4, ignore_eos=True))
    llm.generate(["c"], SamplingParams(max_tokens=4, ignore_eos=True))
    assert threads == {llm.engine.step_thread.ident}
    assert llm.engine.step_thread.ident != threading.get_ident()
