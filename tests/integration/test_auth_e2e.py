"""API keys, TLS and operator routes hardened, through one real server started with ``--config``
and ``--ssl-certfile/--ssl-keyfile`` (a certificate made here by ``trustme``):

- the official client streams over HTTPS (HTTP/2 by ALPN for a client that offers it); plain
  HTTP to the TLS port is closed and the server serves on;
- ``/flush_cache``, ``/stats``, ``/debug/*`` and the per-tenant ``/metrics`` series want the
  admin key (401 without a key, 403 with a tenant's);
- 1,000 wrong keys from one address are throttled (429 with ``Retry-After``), a valid key from
  another address is not; ``X-Forwarded-For`` counts only from a trusted proxy;
- keys rotated by SIGHUP while 16 streams run: the streams finish, the removed key gets 401 and
  the new one 200, the new certificate is served; a broken config is refused (422 from
  ``POST /v1/admin/reload``, logged for SIGHUP) and the old one stays.

The rotation tests run last (file order): they rewrite the config and the certificate.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import ssl
import time
from pathlib import Path

import httpx
import openai
import pytest
import trio
import trustme

from tests.integration.conftest import SERVER_ARGS, ServerProcess
from tests.integration.metered import MODEL, auth, new_admin_key, sample, scrape, sha256

ACME = "sk-test-acme"  # stays through the rotation
OLD = "sk-test-old"  # removed by it
NEW = "sk-test-new"  # added by it
FAILURES_PER_MINUTE = 30
ATTACKER = "127.0.0.2"  # loopback too on Linux: another client address without a proxy


@dataclasses.dataclass
class KeyedTLSServer:
    process: ServerProcess
    admin_key: str
    admin_hash: str
    directory: Path
    ca: trustme.CA
    verify: ssl.SSLContext

    @property
    def base_url(self) -> str:
        return self.process.base_url

    @property
    def config_path(self) -> Path:
        return self.directory / "trillium.toml"

    def write_config(self, tenants: dict[str, str]) -> None:
        """tenants: name -> key (a value not starting with sk- goes in as written: a broken file)."""
        lines = ["[admin]", f'keys = ["{self.admin_hash}"]', "[auth]"]
        lines += [f"failures_per_minute = {FAILURES_PER_MINUTE}", 'trusted_proxies = ["127.0.0.1"]']
        for name, key in tenants.items():
            lines += [f"[tenants.{name}]", f'keys = ["{sha256(key) if key.startswith("sk-test-") else key}"]']
        self.config_path.write_text("\n".join(lines) + "\n")

    def issue_certificate(self) -> bytes:
        """A new certificate for 127.0.0.1 in the files the server reads; its DER bytes."""
        cert = self.ca.issue_cert("127.0.0.1", "localhost")
        (self.directory / "cert.pem").write_bytes(b"".join(pem.bytes() for pem in cert.cert_chain_pems))
        cert.private_key_pem.write_to_path(str(self.directory / "key.pem"))
        return ssl.PEM_cert_to_DER_cert(cert.cert_chain_pems[0].bytes().decode())

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, verify=self.verify, timeout=60, **kwargs)


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    directory = tmp_path_factory.mktemp("auth")
    admin_key, admin_hash = new_admin_key()
    ca = trustme.CA()
    verify = ssl.create_default_context()
    ca.configure_trust(verify)
    server = KeyedTLSServer(None, admin_key, admin_hash, directory, ca, verify)  # type: ignore[arg-type]
    server.write_config({"acme": ACME, "old": OLD})
    server.issue_certificate()
    server.process = ServerProcess(
        *SERVER_ARGS,
        "--config",
        str(server.config_path),
        "--ssl-certfile",
        str(directory / "cert.pem"),
        "--ssl-keyfile",
        str(directory / "key.pem"),
        env={"TRILLIUM_FAULT_INJECTION": "1"},  # /debug/faults is served (and admin-only)
        verify=verify,
    )
    yield server
    server.process.stop()


def chat(max_tokens: int = 4, **extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": max_tokens, **extra}


# ---- TLS ----------------------------------------------------------------------------------------


def test_official_client_streams_over_https_and_http2_is_offered(keyed):
    with keyed.client() as http:
        client = openai.OpenAI(base_url=keyed.base_url + "/v1", api_key=ACME, http_client=http, max_retries=0)
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Name a colour."}],
            max_tokens=8,
            temperature=0,
            stream=True,
        )
        chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    with keyed.client(http2=True) as h2, keyed.client() as h1:
        assert h2.get("/health").http_version == "HTTP/2"
        assert h1.get("/health").http_version == "HTTP/1.1"
        r = h2.post("/v1/chat/completions", json=chat(), headers=auth(ACME))
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1


def test_plain_http_to_the_tls_port_is_closed_and_the_server_serves_on(keyed):
    with socket.create_connection(("127.0.0.1", keyed.process.port), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        try:
            data = sock.recv(4096)
            while data and not data.startswith(b"HTTP/"):
                more = sock.recv(4096)  # a TLS alert, at most; then the close
                if not more:
                    break
                data += more
        except ConnectionResetError:
            data = b""
    assert not data.startswith(b"HTTP/"), data  # never answered in plain HTTP: closed
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{keyed.process.port}/health", timeout=10)
    with keyed.client() as http:
        assert http.get("/health").status_code == 200
        assert http.post("/v1/chat/completions", json=chat(), headers=auth(ACME)).status_code == 200
    assert keyed.process.proc.poll() is None


# ---- operator routes ----------------------------------------------------------------------------


def test_operator_routes_want_the_admin_key(keyed):
    admin, tenant = auth(keyed.admin_key), auth(ACME)
    with keyed.client() as http:
        assert http.post("/v1/chat/completions", json=chat(), headers=tenant).status_code == 200
        for method, path in (("POST", "/flush_cache"), ("GET", "/stats"), ("DELETE", "/debug/faults")):
            missing = http.request(method, path)
            assert missing.status_code == 401 and missing.json()["error"]["code"] == "missing_api_key", path
            assert missing.headers["www-authenticate"] == "Bearer"
            assert http.request(method, path, headers=tenant).status_code == 403, path
            assert http.request(method, path, headers=admin).status_code == 200, path
        assert "num_requests_running" in http.get("/stats", headers=admin).json()
        public = http.get("/metrics")
        assert public.status_code == 200
        # The load gauges alone: nothing of any tenant's activity or prompt lengths, summed or not.
        assert "vllm:num_requests_running" in public.text and "trillium:kv_cache_usage_perc" in public.text
        for private in ("trillium:tenant_", "trillium:prompt_tokens_total", "time_to_first_token", "prefix_cache"):
            assert private not in public.text, private
        assert http.get("/metrics", headers=tenant).status_code == 403
        assert sample(scrape(http, keyed.base_url, keyed.admin_key), "trillium:tenant_requests_total",
                      tenant="acme", status="completed") >= 1  # fmt: skip
        for path in ("/health", "/health/ready", "/get_load", "/get_server_info"):  # the router's, open
            assert http.get(path).status_code == 200, path
        assert http.post("/v1/admin/reload", headers=tenant).status_code == 403


# ---- failed-authentication throttle ---------------------------------------------------------------


def test_wrong_keys_from_one_address_are_throttled_and_other_addresses_are_not(keyed):
    transport = httpx.HTTPTransport(verify=keyed.verify, local_address=ATTACKER)
    statuses, retry_afters = [], []
    started = time.monotonic()
    with keyed.client(transport=transport) as attacker:
        for i in range(1000):
            # A forged X-Forwarded-For from a peer that is no trusted proxy changes nothing.
            headers = {**auth(f"sk-guess-{i}"), "X-Forwarded-For": f"203.0.113.{i % 250}"}
            r = attacker.get("/v1/models", headers=headers)
            statuses.append(r.status_code)
            if r.status_code == 429:
                assert r.json()["error"]["code"] == "rate_limit_exceeded"
                retry_afters.append(int(r.headers["retry-after"]))
        elapsed = time.monotonic() - started
        assert set(statuses) == {401, 429}
        assert statuses[:FAILURES_PER_MINUTE] == [401] * FAILURES_PER_MINUTE
        # Past the first 30, one more try per 60 s / 30 of the run.
        assert statuses.count(401) <= FAILURES_PER_MINUTE + elapsed / 2 + 1, (statuses.count(401), elapsed)
        assert retry_afters and all(1 <= s <= 2 for s in retry_afters)
        assert attacker.get("/v1/models", headers=auth(ACME)).status_code == 429  # the address, whatever key
    with keyed.client() as http:
        assert http.get("/v1/models", headers=auth(ACME)).status_code == 200  # another address
        # Behind the trusted proxy (127.0.0.1), the forwarded address is the one counted.
        for i in range(FAILURES_PER_MINUTE):
            r = http.get("/v1/models", headers={**auth(f"sk-guess-{i}"), "X-Forwarded-For": "198.51.100.66"})
            assert r.status_code == 401
        r = http.get("/v1/models", headers={**auth(ACME), "X-Forwarded-For": "1.2.3.4, 198.51.100.66"})
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert http.get("/v1/models", headers={**auth(ACME), "X-Forwarded-For": "198.51.100.7"}).status_code == 200
        assert http.get("/v1/models", headers=auth(ACME)).status_code == 200  # the proxy itself
        samples = scrape(http, keyed.base_url, keyed.admin_key)
    assert sample(samples, "trillium:auth_failures_total", reason="invalid") >= 2 * FAILURES_PER_MINUTE
    assert sample(samples, "trillium:auth_throttled_requests_total") >= statuses.count(429) + 2


# ---- rotation (last: these rewrite the config and the certificate) --------------------------------


async def test_keys_rotate_on_sighup_while_streams_run(keyed):
    num_streams, max_tokens = 16, 16
    payload = {
        "model": MODEL,
        "prompt": "Count slowly:",
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started, reloaded, finished = trio.Semaphore(0), trio.Event(), []

    async def stream(client: httpx.AsyncClient) -> None:
        """A stream of the key about to be removed. It reads on only once the reload is in force,
        so that on any machine its response is still going when the keys change."""
        usage = None
        async with client.stream("POST", "/v1/completions", json=payload, headers=auth(OLD)) as r:
            assert r.status_code == 200
            first = True
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    if first:
                        started.release()
                        await reloaded.wait()
                        first = False
                    usage = json.loads(line[len("data: ") :]).get("usage") or usage
        finished.append(usage)

    limits = httpx.Limits(max_connections=num_streams + 4)
    async with (
        httpx.AsyncClient(base_url=keyed.base_url, verify=keyed.verify, timeout=120, limits=limits) as client,
        trio.open_nursery() as nursery,
    ):
        for _ in range(num_streams):
            nursery.start_soon(stream, client)
        for _ in range(num_streams):
            await started.acquire()
        keyed.write_config({"acme": ACME, "new": NEW})  # old removed, new added
        new_cert = keyed.issue_certificate()
        num_reloads = keyed.process.log().count("reloaded ")
        os.kill(keyed.process.proc.pid, signal.SIGHUP)
        with trio.fail_after(30):  # (not by polling with the new key: each 401 counts as a failure)
            while keyed.process.log().count("reloaded ") == num_reloads:
                await trio.sleep(0.05)
        assert (await client.get("/v1/models", headers=auth(NEW))).status_code == 200
        gone = await client.get("/v1/models", headers=auth(OLD))
        assert gone.status_code == 401 and gone.json()["error"]["code"] == "invalid_api_key"
        reloaded.set()
    assert len(finished) == num_streams, "a running stream did not finish"
    assert all(usage["completion_tokens"] == max_tokens for usage in finished), finished
    assert _served_certificate(keyed.process.port) == new_cert  # a new connection, the new certificate


def test_a_broken_config_is_refused_and_the_one_in_force_stays(keyed):
    admin = auth(keyed.admin_key)
    with keyed.client() as http:
        keyed.write_config({"acme": ACME, "new": NEW})
        done = http.post("/v1/admin/reload", headers=admin)
        assert done.status_code == 200, done.text
        assert done.json() == {"status": "reloaded", "tenants": 2, "tls": True, "warnings": []}
        keyed.write_config({"acme": ACME, "new": NEW, "oops": "sk-plain-key-not-a-hash"})
        refused = http.post("/v1/admin/reload", headers=admin)
        assert refused.status_code == 422, refused.text
        assert "tenants.oops.keys[0]" in refused.json()["error"]["message"]
        os.kill(keyed.process.proc.pid, signal.SIGHUP)
        deadline = time.monotonic() + 10
        while keyed.process.log().count("reload refused") < 2:  # the route's, then the signal's
            assert time.monotonic() < deadline, keyed.process.log()
            time.sleep(0.1)
        assert keyed.process.proc.poll() is None
        assert http.get("/v1/models", headers=auth(NEW)).status_code == 200  # the config in force stays
        assert http.post("/v1/chat/completions", json=chat(), headers=auth(ACME)).status_code == 200


def _served_certificate(port: int) -> bytes:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # only reading which certificate it sends
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as sock,
        context.wrap_socket(sock) as tls,
    ):
        return tls.getpeercert(binary_form=True)
