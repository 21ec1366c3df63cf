"""Faults injected into a real server (``TRILLIUM_FAULT_INJECTION=1``, ``POST /debug/faults``):
whichever actor fails, the requests it held get a clear error (500 in OpenAI's shape with the
request id, or an SSE error event), the server serves again within seconds with no KV block
held, the ledger has one record per request (``failed`` for the failed ones), a hung step turns
``/health`` to 503, and failing past the restart budget ends the process with exit code 1.

The tests share one server and run in file order; the last one ends it."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from tests.integration.metered import MODEL, MeteredServer, auth, sse_lines, tenant_auth

TENANT = "open"
# /debug/faults and /stats want the admin key under --config: the module's server's, set by `faulty`.
ADMIN: dict[str, str] = {}


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    srv = MeteredServer(tmp_path_factory.mktemp("faults"), "--step-timeout", "1", env={"TRILLIUM_FAULT_INJECTION": "1"})
    ADMIN.update(auth(srv.admin_key))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def sent() -> list[str]:
    """Every generation request the tests sent (for the one-record-per-request check)."""
    return []


@pytest.fixture
def http(faulty):
    with httpx.Client(base_url=faulty.base_url, timeout=60, headers=tenant_auth(TENANT)) as client:
        client.delete("/debug/faults", headers=ADMIN)
        yield client
        if faulty.process.proc.poll() is None:  # the last test ends the server
            client.delete("/debug/faults", headers=ADMIN)


def arm(http: httpx.Client, point: str, action: str = "raise", times: int = 1) -> None:
    armed = http.post("/debug/faults", json={"point": point, "action": action, "times": times}, headers=ADMIN)
    assert armed.status_code == 200, armed.text


def chat(http: httpx.Client, sent: list[str], content: str = "Say hi.", **extra) -> httpx.Response:
    sent.append(content)
    payload = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 8, **extra}
    return http.post("/v1/chat/completions", json=payload)


def assert_internal_error(r: httpx.Response) -> None:
    assert r.status_code == 500, r.text
    error = r.json()["error"]
    assert error["type"] == "internal_error" and r.headers["x-request-id"] in error["message"]


def assert_serving_and_clean(http: httpx.Client, sent: list[str]) -> None:
    """Serves again within a few seconds, and afterwards no request holds a KV block."""
    deadline = time.monotonic() + 10
    while (r := chat(http, sent, "Count to three.")).status_code != 200:
        assert time.monotonic() < deadline, r.text
        time.sleep(0.2)
    stats = http.get("/stats", headers=ADMIN).json()
    assert stats["num_requests_running"] == 0 and stats["num_requests_waiting"] == 0
    assert stats["num_blocks_in_use"] == 0, stats
    # Ready again too: a restarted actor is back once its restart back-off has passed, and the
    # supervisor publishes health once a second, so readiness may trail the first good answer.
    while (ready := http.get("/health/ready")).status_code != 200:  # not live is not ready either
        assert time.monotonic() < deadline, ready.text
        time.sleep(0.2)
    assert http.get("/health").status_code == 200


def test_a_runner_failure_fails_the_requests_in_flight_and_the_engine_serves_again(http, sent):
    payload = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write a long story."}],
        "max_tokens": 400,
        "ignore_eos": True,
        "stream": True,
    }
    sent.append("stream")
    events = []
    with http.stream("POST", "/v1/chat/completions", json=payload) as r:
        assert r.status_code == 200
        lines = sse_lines(r)
        events.append(json.loads(next(lines)))
        arm(http, "runner.execute")
        events += [json.loads(line) for line in lines if line != "[DONE]"]
    error = events[-1]["error"]
    assert error["type"] == "internal_error" and "InjectedFault" in error["message"]
    assert events[0]["id"] in error["message"]
    assert_serving_and_clean(http, sent)


def test_a_tokenizer_failure_is_a_500_for_its_request_and_the_next_one_is_served(http, sent):
    arm(http, "tokenizer.message")
    assert_internal_error(chat(http, sent))
    assert_serving_and_clean(http, sent)


def test_a_grammar_failure_is_a_500_for_its_request_and_the_next_one_is_served(http, sent):
    arm(http, "grammar.message")
    assert_internal_error(chat(http, sent, response_format={"type": "json_object"}))
    assert chat(http, sent, response_format={"type": "json_object"}).status_code == 200
    assert_serving_and_clean(http, sent)


def test_a_metering_failure_loses_no_record(http, sent):
    arm(http, "metering.write", times=2)
    for _ in range(3):
        assert chat(http, sent).status_code == 200
    assert_serving_and_clean(http, sent)


def test_a_hung_step_turns_health_to_503_until_it_ends(http, sent):
    arm(http, "runner.execute", action="hang")
    results: list[httpx.Response] = []
    worker = threading.Thread(target=lambda: results.append(chat(http, sent)))
    worker.start()
    deadline = time.monotonic() + 30  # the limit: max(--step-timeout 1 s, 10x the p99 step)
    while (health := http.get("/health")).status_code == 200:
        assert time.monotonic() < deadline, "the watchdog never noticed the hung step"
        time.sleep(0.2)
    assert health.status_code == 503 and "model step running for" in health.json()["reasons"][0]
    http.delete("/debug/faults", headers=ADMIN)  # the step goes on
    worker.join(30)
    assert results and results[0].status_code == 200
    deadline = time.monotonic() + 5  # the watchdog looks once a second
    while http.get("/health").status_code != 200:
        assert time.monotonic() < deadline, "still unhealthy after the step ended"
        time.sleep(0.2)


def test_the_ledger_has_one_record_per_request_and_says_failed_for_the_failed(faulty, http, sent):
    deadline = time.monotonic() + 10
    while len(rows := faulty.ledger_rows(TENANT)) < len(sent):
        assert time.monotonic() < deadline, (len(rows), len(sent))
        time.sleep(0.1)
    assert len(rows) == len(sent)
    # The stream, the tokenizer's and the grammar's victims (in-flight requests of other tests
    # may have failed with the stream too).
    assert sum(r["status"] == "failed" for r in rows) >= 3


def test_failing_past_the_restart_budget_ends_the_process_with_exit_code_1(faulty, http, sent):
    arm(http, "scheduler.step", times=1000)
    deadline = time.monotonic() + 60
    while faulty.process.proc.poll() is None:
        assert time.monotonic() < deadline, "the server never gave up"
        try:
            r = chat(http, sent)
            assert r.status_code in (500, 503), r.text
        except httpx.TransportError:
            pass  # it is going away
    assert faulty.process.proc.wait() == 1
    assert "giving up: scheduler failed" in faulty.process.log()
