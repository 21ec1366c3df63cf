"""`trillium cluster` on loopback: real replicas behind the real vllm-router (the cluster extra).

- the official openai client through the router: chat and completions, streamed and not;
- routing on cache contents: on one request stream that shares a few long system prompts, with
  each replica's KV pool holding about half of them, ``kv_aware`` (routing on the prefix-cache
  events the replicas publish) gets at least 1.5x the prefix-cache hit rate of ``round_robin``,
  as bench/cluster.py measures it (the benchmark's smoke test too);
- a replica SIGKILLed under steady load: every request gets an answer (a response or an error,
  never a hang), new requests are served meanwhile, the replica is restarted and rejoins, and
  afterwards no replica holds a KV block.

Hit rates come from each replica's /metrics (cached prompt tokens / prompt tokens). The
benchmark that times all this is bench/cluster.py; nothing here asserts speed.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("vllm_router", reason="the cluster extra (vllm-router) is not installed")
pytest.importorskip("zmq", reason="the cluster extra (pyzmq) is not installed")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from cluster import ClusterProcess, metric_value, run_load, shared_prefix_workload  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
# A replica's pool for the hit-rate test: 0.06 GiB is ~87 blocks of 16 tokens; each system
# prompt below is ~10 blocks, so with one request running a replica caches about 8 of the 16.
HALF_POOL = ["--kv-cache-gib", "0.06", "--max-running", "4"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two replicas behind the router, kv_aware: one start-up for the tests that only send to it
    (the router-restart test last, as it kills the router)."""
    log = tmp_path_factory.mktemp("cluster") / "cluster.log"
    c = ClusterProcess(2, "kv_aware", ["--kv-cache-gib", "0.1", "--max-running", "8"], log_path=str(log))
    yield c
    assert c.stop() == 0, log.read_text()[-3000:]


def test_the_openai_client_works_through_the_router(cluster):
    from openai import OpenAI

    client = OpenAI(base_url=f"{cluster.url}/v1", api_key="none", max_retries=0, timeout=60)
    assert [m.id for m in client.models.list().data] == [MODEL]
    messages = [{"role": "user", "content": "Name a colour."}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
    assert chat.choices[0].finish_reason in ("stop", "length") and chat.usage.completion_tokens >= 1
    streamed = list(
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0, stream=True)
    )
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == chat.choices[0].message.content  # greedy: the same answer whichever replica served it
    done = client.completions.create(model=MODEL, prompt="The sea is", max_tokens=6, temperature=0)
    pieces = list(client.completions.create(model=MODEL, prompt="The sea is", max_tokens=6, temperature=0, stream=True))
    assert "".join(p.choices[0].text for p in pieces if p.choices) == done.choices[0].text
    # Both replicas are in the router and serve.
    workers = httpx.get(f"{cluster.url}/list_workers", timeout=10).json()["urls"]
    assert sorted(workers) == sorted(cluster.replica_urls)


def test_a_restarted_router_is_sent_every_replicas_cache_and_routes_on_it(cluster):
    """kv_aware after the router dies: the cluster restarts it, each replica hears the new
    subscriber and sends its whole prefix cache, so every prompt cached before the crash is
    routed to the replica that holds it (by chance alone, 6 of 6 would be 1 in 64)."""
    c = cluster  # the module's: the fixture stops it and checks its exit
    first = {m[0]["content"]: m for m in reversed(shared_prefix_workload(60, 6, 120, seed=7))}
    prompts = list(first.values())  # one request for each of the 6 system prompts
    assert len(prompts) == 6
    body = {"model": MODEL, "max_tokens": 1, "temperature": 0}
    for messages in prompts:
        httpx.post(f"{c.url}/v1/chat/completions", json={**body, "messages": messages}, timeout=60).raise_for_status()
    assert c.router_pid is not None
    os.kill(c.router_pid, signal.SIGKILL)
    assert c.wait_for(r"router: restarted", 60), c.lines
    time.sleep(1)  # the replicas' snapshots reach the new router
    for messages in prompts:
        again = [messages[0], {"role": "user", "content": "And one more question?"}]
        r = httpx.post(f"{c.url}/v1/chat/completions", json={**body, "messages": again}, timeout=60)
        cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached >= 96, (cached, r.json()["usage"])  # the system prompt's blocks were hit
    for url in c.replica_urls:  # what each replica sent, and that nothing was lost
        text = httpx.get(f"{url}/metrics", timeout=10).text
        assert metric_value(text, "trillium:kv_events_published_total") > 0, text[-2000:]
        assert metric_value(text, "trillium:kv_events_dropped_total") == 0


@pytest.mark.bench
def test_kv_aware_routes_on_the_replicas_published_cache(tmp_path):
    """The router learns what each replica caches only from the replicas' KV events: a request
    lands where its system prompt is cached, and a new prompt on either replica (ties are
    spread), so the two pools together hold all the prompts; round_robin sends every prompt to
    both pools, each too small for all of them. Measured by bench/cluster.py itself (so this also
    shows the benchmark runs: every row whole, every request answered) on one request stream
    that shares 16 long system prompts. (How cache_aware, the router's guess from request
    history, compares is the benchmark's to measure: bench/RESULTS.md.)"""
    result = tmp_path / "cluster.json"
    workload = ["--requests", "96", "--system-prompts", "16", "--system-words", "150", "--seed", "11"]
    load = ["--streams", "1", "--max-tokens", "2", "--threads", "2", *HALF_POOL]
    command = [sys.executable, str(ROOT / "bench" / "cluster.py"), "--setups", "kv_aware,round_robin"]
    command += [*workload, *load, "--result-file", str(result), "--log", str(tmp_path / "clusters.log")]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(result.read_text())["rows"]
    assert [r["policy"] for r in rows] == ["kv_aware", "round_robin"]
    assert all(r["completed"] == 96 and r["failed"] == 0 for r in rows), rows
    kv_aware, round_robin = (r["prefix_hit_rate"] for r in rows)
    assert kv_aware >= 1.5 * round_robin, (kv_aware, round_robin)


def test_a_replica_killed_under_load_fails_its_requests_cleanly_and_rejoins(tmp_path):
    c = ClusterProcess(
        2, "round_robin", ["--kv-cache-gib", "0.1", "--max-running", "8"], log_path=str(tmp_path / "c.log")
    )
    try:
        workload = shared_prefix_workload(144, 4, 40, seed=3)  # load for ~30 s: past the restart
        load: dict = {}

        def run() -> None:
            load["records"], load["wall"] = asyncio.run(
                run_load(c.url, MODEL, workload, streams=4, max_tokens=24, timeout=120)
            )

        thread = threading.Thread(target=run)
        thread.start()
        time.sleep(4)
        killed_at = time.perf_counter()
        os.kill(c.pids[0], signal.SIGKILL)
        assert c.wait_for(r"replica-0: restarted and back", 120), c.lines
        thread.join(timeout=300)
        assert not thread.is_alive(), "the load did not finish: a request hung"
        records = load["records"]
        assert len(records) == len(workload)  # every request got an answer
        failed = [r for r in records if not r["ok"]]
        assert len(failed) <= 8, [r.get("error") for r in failed]  # at most those in flight on it
        assert all(r["start"] <= killed_at + 15 for r in failed), "a request failed long after the kill"
        assert sum(r["ok"] and r["start"] > killed_at for r in records) > 0  # served meanwhile
        # The restarted replica serves again: requests after it rejoined reach both.
        served = {url: _requests_served(url) for url in c.replica_urls}
        for _ in range(8):
            httpx.post(
                f"{c.url}/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2}, timeout=60
            ).raise_for_status()
        assert all(_requests_served(url) > served[url] for url in c.replica_urls)
        for url in c.replica_urls:  # nothing holds KV once the load is over
            stats = httpx.get(f"{url}/stats", timeout=10).json()
            assert stats["num_blocks_in_use"] == 0 and stats["num_requests_running"] == 0, (url, stats)
    finally:
        assert c.stop() == 0


def _running(pid: int) -> bool:
    """Alive and not a zombie (an exited child waiting to be reaped has stopped all the same)."""
    try:
        return "(zombie)" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def _requests_served(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("trillium:request_success_total{")
    )


def test_sigterm_drains_in_flight_streams_then_stops_everything(tmp_path):
    c = ClusterProcess(1, "round_robin", ["--kv-cache-gib", "0.05"], log_path=str(tmp_path / "c.log"))
    # Short: the replica itself drains for at most 10 s, and a busy CI machine can be slow.
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 16, "ignore_eos": True, "stream": True}
    pieces = []
    with httpx.stream("POST", f"{c.url}/v1/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                pieces.append(json.loads(line[6:]))
                if len(pieces) == 1:
                    c.proc.send_signal(signal.SIGTERM)  # mid-stream
    assert pieces[-1]["choices"][0]["finish_reason"] == "length"  # the stream finished whole
    assert sum(1 for p in pieces if p["choices"] and p["choices"][0]["text"]) >= 14
    assert c.proc.wait(60) == 0  # on the one SIGTERM: drained, not killed
    assert c.wait_for(r"trillium cluster: stopped", 5)
    c.stop()
    for pid in c.pids:  # the replica is gone too (and so is the router: its port is free)
        assert not _running(pid)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{c.url}/health", timeout=2)
