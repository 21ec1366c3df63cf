"""SIGKILL right after responses completed: the ledger has a row for each, with the usage the
response reported, and opens cleanly (``PRAGMA integrity_check``).

Every ledger write is held back half a second (fault injection: a hang at ``metering.write``), so
a record committed after its response's last byte -- the order before the group commit -- would
be missing after the kill. One server of its own: it is killed. Chat streamed, completions with
``n = 2`` over two prompts (the fanout), the Responses API streamed and not."""

from __future__ import annotations

import json
import sqlite3

import httpx

from tests.integration.metered import MODEL, MeteredServer, auth, sse_lines, tenant_auth
from trillium.metering.ledger import Ledger

TENANT = "ledger"


def _counts(usage: dict) -> tuple[int, int, int]:
    """(prompt, cached, completion) of a chat/completions ``usage`` or a Responses ``usage``."""
    if "input_tokens" in usage:
        return usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"], usage["output_tokens"]
    return usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"], usage["completion_tokens"]


def test_completed_responses_survive_kill_9(tmp_path):
    srv = MeteredServer(tmp_path, env={"TRILLIUM_FAULT_INJECTION": "1"})
    said: dict[str, tuple[int, int, int]] = {}  # request id -> the usage its response reported
    try:
        with httpx.Client(base_url=srv.base_url, timeout=60, headers=tenant_auth(TENANT)) as http:
            fault = {"point": "metering.write", "action": "hang", "times": 1000, "hang_s": 0.5}
            armed = http.post("/debug/faults", json=fault, headers=auth(srv.admin_key))  # the operator's key
            assert armed.status_code == 200, armed.text

            payload = {"model": MODEL, "prompt": ["The sky is", "1, 2, 3,"], "n": 2, "max_tokens": 4}
            r = http.post("/v1/completions", json={**payload, "temperature": 0, "ignore_eos": True})
            assert r.status_code == 200, r.text
            said[r.json()["id"]] = _counts(r.json()["usage"])

            chat = {
                "model": MODEL,
                "messages": [{"role": "user", "content": "Name a color."}],
                "max_tokens": 5,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            with http.stream("POST", "/v1/chat/completions", json=chat) as r:
                assert r.status_code == 200
                chunks = [json.loads(line) for line in sse_lines(r)]
            said[chunks[-1]["id"]] = _counts(chunks[-1]["usage"])

            responses = {"model": MODEL, "input": "Say hi.", "max_output_tokens": 4}
            r = http.post("/v1/responses", json=responses)
            assert r.status_code == 200, r.text
            said[r.json()["id"]] = _counts(r.json()["usage"])
            with http.stream("POST", "/v1/responses", json={**responses, "stream": True}) as r:
                assert r.status_code == 200
                events = [json.loads(line) for line in sse_lines(r)]
            final = events[-1]["response"]
            assert events[-1]["type"] in ("response.completed", "response.incomplete")
            said[final["id"]] = _counts(final["usage"])
        srv.process.proc.kill()  # SIGKILL, the moment the last response was read
        srv.process.proc.wait(30)
    finally:
        srv.stop()

    db = sqlite3.connect(srv.ledger_path)  # read-write: recovers the WAL as the next server would
    try:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        db.close()
    rows = srv.ledger_rows(TENANT)
    assert sorted(r["request_id"] for r in rows) == sorted(said)  # each once, nothing else
    for row in rows:
        assert row["status"] == "completed", row
        assert (row["prompt_tokens"], row["cached_tokens"], row["completion_tokens"]) == said[row["request_id"]]
    ledger = Ledger(str(srv.ledger_path))  # opens cleanly, as the restarted server's would
    try:
        (totals,) = ledger.totals(tenant=TENANT)
        assert totals.requests == len(said)
    finally:
        ledger.close()
