"""SIGTERM with requests in flight: every request still gets exactly one ledger record (and one
``--log-requests`` line), whether the drain let it finish or a second signal cut it off."""

from __future__ import annotations

import contextlib
import json
import signal

import httpx
import pytest

from tests.integration.metered import MODEL, MeteredServer, sse_lines, tenant_auth


def test_records_survive_shutdown_with_requests_in_flight(tmp_path):
    srv = MeteredServer(tmp_path, "--log-requests", tenants={"open": {"max_concurrent_requests": 8}})
    try:
        with httpx.Client(base_url=srv.base_url, timeout=60) as client, contextlib.ExitStack() as stack:
            streams = []  # (request id, the rest of its SSE lines)
            for max_tokens in (48, 48, 48, 1500):
                payload = {
                    "model": MODEL,
                    "prompt": "Count:",
                    "max_tokens": max_tokens,
                    "temperature": 0,
                    "ignore_eos": True,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                r = stack.enter_context(
                    client.stream("POST", "/v1/completions", json=payload, headers=tenant_auth("open"))
                )
                assert r.status_code == 200
                lines = sse_lines(r)
                streams.append((json.loads(next(lines))["id"], lines))
            srv.process.proc.send_signal(signal.SIGTERM)
            # The drain lets the short ones finish, usage chunk included.
            said = {}
            for request_id, lines in streams[:3]:
                chunks = [json.loads(line) for line in lines]
                said[request_id] = chunks[-1]["usage"]
                assert said[request_id]["completion_tokens"] == 48
            # The long one would outlast the drain: a second signal stops the server now.
            srv.process.proc.send_signal(signal.SIGTERM)
            long_id, lines = streams[3]
            with pytest.raises(httpx.HTTPError):
                for _ in lines:
                    pass
        assert srv.process.proc.wait(timeout=30) == 0
    finally:
        srv.stop()
    rows = {row["request_id"]: row for row in srv.ledger_rows("open")}
    assert len(rows) == len(srv.ledger_rows("open")) == 4
    for request_id, usage in said.items():
        row = rows[request_id]
        assert row["status"] == "completed"
        assert (row["prompt_tokens"], row["completion_tokens"]) == (usage["prompt_tokens"], 48)
    cut = rows[long_id]
    assert cut["status"] == "aborted" and 0 < cut["completion_tokens"] < 1500
    with open(srv.process.log_path) as f:
        log = f.read().splitlines()
    at = [i for i, line in enumerate(log) if line.startswith('{"event":"request"')]
    logged = [json.loads(log[i]) for i in at]
    # Every request was still in flight when the first signal arrived.
    assert min(at) > next(i for i, line in enumerate(log) if "received SIGTERM" in line)
    assert sorted(line["request_id"] for line in logged) == sorted(rows)
    assert {line["request_id"]: line["completion_tokens"] for line in logged} == {
        i: row["completion_tokens"] for i, row in rows.items()
    }
