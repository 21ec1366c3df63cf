"""Usage records, ``GET /v1/usage``, ``trillium usage`` and ``/metrics`` through a real server:
exactly one ledger record per admitted request, whatever its end, with the token counts of the
``usage`` the client got; Prometheus counters that move by exactly those amounts."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from tests.integration.metered import MODEL, auth, sample, scrape, sse_lines, tenant_auth
from trillium import cli

EOS = 2  # SmolLM2's <|im_end|>: a large logit bias on it ends a chat at once with "stop"


@pytest.fixture
def http(metered_server):
    with httpx.Client(base_url=metered_server.base_url, timeout=120) as client:
        yield client


def chat(content: str, **extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "temperature": 0, **extra}


def completion(prompt, **extra) -> dict:
    return {"model": MODEL, "prompt": prompt, "temperature": 0, **extra}


def post(http, path: str, payload: dict, tenant: str) -> dict:
    r = http.post(path, json=payload, headers=tenant_auth(tenant))
    assert r.status_code == 200, r.text
    return r.json()


def stream(http, path: str, payload: dict, tenant: str) -> tuple[str, dict | None]:
    """A streamed request read to the end: (its id, the usage chunk's usage or None)."""
    request_id, usage = None, None
    with http.stream("POST", path, json={**payload, "stream": True}, headers=tenant_auth(tenant)) as r:
        assert r.status_code == 200
        for data in sse_lines(r):
            chunk = json.loads(data)
            request_id = chunk["id"]
            usage = chunk.get("usage") or usage
    return request_id, usage


def hang_up_mid_stream(http, path: str, payload: dict, tenant: str) -> str:
    """Read the first chunk of a long stream, then close the connection: the id."""
    with http.stream("POST", path, json={**payload, "stream": True}, headers=tenant_auth(tenant)) as r:
        assert r.status_code == 200
        return json.loads(next(sse_lines(r)))["id"]


def test_one_record_per_request_with_the_clients_token_counts(http, metered_server):
    tenant = "ledger"
    said: dict[str, dict] = {}  # request id -> the usage the client got
    body = post(http, "/v1/completions", completion("The sky is", max_tokens=4, ignore_eos=True), tenant)
    said[body["id"]] = body["usage"]
    body = post(http, "/v1/chat/completions", chat("Name a color.", max_tokens=4, n=2, ignore_eos=True), tenant)
    said[body["id"]] = body["usage"]
    for path, payload in [
        ("/v1/chat/completions", chat("Name a fruit.", max_tokens=5, n=2)),
        ("/v1/completions", completion("1, 2, 3,", max_tokens=3, ignore_eos=True)),
        ("/v1/chat/completions", chat("Name a color.", max_tokens=4)),  # a prefix-cache hit
    ]:
        request_id, usage = stream(http, path, {**payload, "stream_options": {"include_usage": True}}, tenant)
        said[request_id] = usage
    # Streamed without include_usage: the client does not see usage; the ledger still has it.
    unreported, _ = stream(http, "/v1/completions", completion([1, 2, 3], max_tokens=2, ignore_eos=True), tenant)
    aborted = hang_up_mid_stream(http, "/v1/completions", completion("Count:", max_tokens=500, ignore_eos=True), tenant)
    # Admitted, then refused: a bad field, an unknown model, a context too long.
    headers = tenant_auth(tenant)
    assert http.post("/v1/completions", json=completion("x", max_tokens=-1), headers=headers).status_code == 400
    assert http.post("/v1/chat/completions", json={**chat("x"), "model": "nope"}, headers=headers).status_code == 404
    assert http.post("/v1/completions", json=completion([1] * 2048), headers=headers).status_code == 400
    assert http.post("/v1/completions", content=b"{not json", headers=headers).status_code == 400

    totals = metered_server.wait_for_requests(http, tenant, len(said) + 6)
    rows = metered_server.ledger_rows(tenant)
    by_id = {row["request_id"]: row for row in rows}
    assert len(by_id) == len(rows) == len(said) + 6  # one record per request, no duplicates
    for request_id, usage in said.items():
        row = by_id[request_id]
        assert (row["prompt_tokens"], row["completion_tokens"], row["cached_tokens"]) == (
            usage["prompt_tokens"],
            usage["completion_tokens"],
            usage["prompt_tokens_details"]["cached_tokens"],
        )
        assert row["status"] == "completed" and row["http_status"] == 200 and row["model"] == MODEL
        assert row["ttft"] is not None and row["e2e"] >= row["ttft"] > 0
    assert by_id[next(iter(said))]["finish_reason"] == "length"
    assert [by_id[i]["num_choices"] for i in said] == [1, 2, 2, 1, 1]
    assert [by_id[i]["endpoint"] for i in said] == ["completions", "chat", "chat", "completions", "chat"]
    assert any(by_id[i]["cached_tokens"] > 0 for i in said)  # the cache hit is metered as such
    assert (by_id[unreported]["status"], by_id[unreported]["completion_tokens"]) == ("completed", 2)
    cut = by_id[aborted]
    assert cut["status"] == "aborted" and cut["finish_reason"] == "abort" and 0 < cut["completion_tokens"] < 500
    refused = [row for row in rows if row["request_id"] not in said and row["request_id"] not in (unreported, aborted)]
    assert sorted(row["http_status"] for row in refused) == [400, 400, 400, 404]
    assert all(row["status"] == "rejected" and row["prompt_tokens"] == row["completion_tokens"] == 0 for row in refused)
    assert {"chatcmpl" if row["endpoint"] == "chat" else "cmpl" for row in rows} == {
        row["request_id"].split("-")[0] for row in rows
    }
    # The totals served by /v1/usage are the ledger's.
    assert totals == {
        "tenant": tenant,
        "requests": len(rows),
        "completed": len(said) + 1,
        "aborted": 1,
        "failed": 0,
        "rejected": 4,
        "prompt_tokens": sum(r["prompt_tokens"] for r in rows),
        "cached_tokens": sum(r["cached_tokens"] for r in rows),
        "completion_tokens": sum(r["completion_tokens"] for r in rows),
        "total_tokens": sum(r["prompt_tokens"] + r["completion_tokens"] for r in rows),
    }


def test_metrics_counters_move_by_the_usage(http, metered_server):
    tenant = "metrics"
    before = scrape(http, metered_server.base_url, metered_server.admin_key)
    usages = [
        post(http, "/v1/completions", completion("Once upon", max_tokens=4, ignore_eos=True), tenant)["usage"],
        post(http, "/v1/chat/completions", chat("Hi!", max_tokens=4, logit_bias={str(EOS): 100}), tenant)["usage"],
        stream(
            http,
            "/v1/chat/completions",
            chat("Count to three.", max_tokens=3, n=2, ignore_eos=True, stream_options={"include_usage": True}),
            tenant,
        )[1],
    ]
    refused = http.post("/v1/completions", json=completion("x", max_tokens=0), headers=tenant_auth(tenant))
    assert refused.status_code == 400
    after = scrape(http, metered_server.base_url, metered_server.admin_key)

    def delta(name: str, **labels) -> float:
        return sample(after, name, **labels) - sample(before, name, **labels)

    prompt = sum(u["prompt_tokens"] for u in usages)
    generated = sum(u["completion_tokens"] for u in usages)
    assert usages[1]["completion_tokens"] == 1 and generated == 4 + 1 + 6
    assert delta("trillium:prompt_tokens_total") == prompt
    assert delta("trillium:generation_tokens_total") == generated
    assert delta("trillium:request_success_total", finished_reason="length") == 2
    assert delta("trillium:request_success_total", finished_reason="stop") == 1
    assert delta("trillium:request_success_total", finished_reason="abort") == 0
    assert delta("trillium:request_failure_total") == 0
    assert delta("trillium:tenant_requests_total", tenant=tenant, status="completed") == 3
    assert delta("trillium:tenant_requests_total", tenant=tenant, status="rejected") == 1
    assert delta("trillium:tenant_prompt_tokens_total", tenant=tenant) == prompt
    assert delta("trillium:tenant_generation_tokens_total", tenant=tenant) == generated
    # Every choice looks its prompt up in the prefix cache (the n=2 request twice).
    assert delta("trillium:prefix_cache_queries_total") == prompt + usages[2]["prompt_tokens"]
    for histogram in ("e2e_request_latency_seconds", "time_to_first_token_seconds", "request_queue_time_seconds"):
        assert delta(f"trillium:{histogram}_count") == 3, histogram
    # Inter-token intervals: every token after the first delta of each choice (a slow reader may
    # get its first tokens coalesced into one delta).
    assert 0 < delta("trillium:inter_token_latency_seconds_count") <= (4 - 1) + 0 + 2 * (3 - 1)
    assert sample(after, "trillium:num_requests_running") == 0
    assert 0 <= sample(after, "trillium:kv_cache_usage_perc") <= 1


def test_usage_endpoint_needs_the_admin_key(http, metered_server):
    def error(headers) -> tuple[int, str]:
        r = http.get("/v1/usage", headers=headers)
        return r.status_code, r.json()["error"]["code"]

    assert error({}) == (401, "missing_api_key")
    assert error(auth("sk-test-nobody")) == (401, "invalid_api_key")
    assert error(tenant_auth("open")) == (403, "permission_denied")
    admin = auth(metered_server.admin_key)
    r = http.get("/v1/usage", params={"since": "yesterday"}, headers=admin)
    assert r.status_code == 400 and r.json()["error"]["param"] == "since"
    r = http.get("/v1/usage", params={"since": "1h", "tenant": "open"}, headers=admin)
    assert r.status_code == 200 and r.json()["object"] == "list"
    assert {row["tenant"] for row in r.json()["data"]} <= {"open"}


def test_usage_command_reads_the_same_totals(http, metered_server, capsys):
    post(http, "/v1/completions", completion("Hello", max_tokens=2), "open")
    served = metered_server.usage(http)  # answered once every earlier record is on disk
    # The installed command once, in its own process (another reader of the live WAL ledger) ...
    proc = subprocess.run(
        [sys.executable, "-m", "trillium.cli", "usage", "--ledger", str(metered_server.ledger_path), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["data"] == served

    def command(*args: str) -> str:  # ... then its other options in this process (no interpreter start-up)
        capsys.readouterr()
        assert cli.main(["usage", *args]) == 0
        return capsys.readouterr().out

    by_config = json.loads(command("--config", str(metered_server.config_path), "--tenant", "open", "--json"))
    assert by_config["data"] == [row for row in served if row["tenant"] == "open"]
    table = command("--ledger", str(metered_server.ledger_path), "--since", "1h")
    assert table.splitlines()[0].split()[:2] == ["tenant", "requests"]
    assert {line.split()[0] for line in table.splitlines()[1:]} == {row["tenant"] for row in served}


def test_open_server_has_metrics_and_no_usage_endpoint(server):
    """Without --config: no keys, tenant 'anonymous', /metrics served, /v1/usage absent."""
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        before = scrape(client, server.base_url)
        r = client.post("/v1/completions", json=completion("Hello", max_tokens=2, ignore_eos=True))
        assert r.status_code == 200
        after = scrape(client, server.base_url)
        assert client.get("/v1/usage").status_code == 404
    completed = ("trillium:tenant_requests_total", {"tenant": "anonymous", "status": "completed"})
    assert sample(after, completed[0], **completed[1]) >= sample(before, completed[0], **completed[1]) + 1
    assert sample(after, "trillium:prompt_tokens_total") >= sample(before, "trillium:prompt_tokens_total") + 1
