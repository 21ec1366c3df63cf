"""A real server with an access config (``trillium serve --config``) for the metering tests.

One tenant per limit, so that the tests of different limits never share a bucket, and one
tenant per test without limits (``open``, ``ledger``, ``metrics``), so that each counts only
its own requests. The admin key comes from the ``trillium hash-key`` command itself, so the
server accepting it checks the command's hash.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import SERVER_ARGS, ServerProcess

MODEL = "SmolLM2-135M-Instruct"
KEYS = {
    tenant: f"sk-test-{tenant}"
    for tenant in ("open", "ledger", "metrics", "rpm", "tpm", "conc", "big", "acme", "globex", "share1", "share2")
}
# Prefix-cache namespaces shared on purpose, and a system prompt cached once for every tenant
# (tests/integration/test_tenant_isolation_e2e.py).
GROUPS = {"partners": ["share1", "share2"]}
PUBLIC_PREFIX = " ".join(f"Public rule {i}: be accurate, brief and kind." for i in range(30))
# These tests send wrong keys on purpose, many from one address: a throttle that never bites
# (tests/integration/test_auth_e2e.py has its own server for it).
AUTH = {"failures_per_minute": 100_000}
LIMITS = {
    "rpm": {"requests_per_minute": 3},  # refills one request per 20 s: a burst gets 3, at most 4
    "tpm": {"tokens_per_minute": 40},  # 1-token prompt + 8 tokens: 4 such requests per minute
    "conc": {"max_concurrent_requests": 2},
    "big": {"max_tokens_per_request": 48},
}


def sha256(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def new_admin_key() -> tuple[str, str]:
    """A key and its hash from ``trillium hash-key`` (the CLI, in a subprocess)."""
    out = subprocess.run(
        [sys.executable, "-m", "trillium.cli", "hash-key"], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    return re.search(r"^key:\s+(\S+)$", out, re.M).group(1), re.search(r"^hash:\s+(\S+)$", out, re.M).group(1)


def write_config(
    directory: Path, admin_hash: str, tenants: dict[str, dict] | None = None, auth: dict | None = None
) -> Path:
    tenants = tenants if tenants is not None else {t: LIMITS.get(t, {}) for t in KEYS}
    lines = ["[ledger]", 'path = "ledger/usage.sqlite"', "[admin]", f'keys = ["{admin_hash}"]']
    lines += ["[auth]", *(f"{name} = {json.dumps(value)}" for name, value in (auth or AUTH).items())]
    for tenant, limits in tenants.items():
        lines += [f"[tenants.{tenant}]", f'keys = ["{sha256(KEYS[tenant])}"]']
        lines += [f"{name} = {value}" for name, value in limits.items()]
    lines += ["[prefix_cache]", f"public_prefixes = {json.dumps([PUBLIC_PREFIX])}"]
    groups = {name: members for name, members in GROUPS.items() if set(members) <= set(tenants)}
    if groups:
        lines.append("[prefix_cache.groups]")
        lines += [f"{name} = {json.dumps(members)}" for name, members in groups.items()]
    path = directory / "trillium.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


class MeteredServer:
    """A ServerProcess with ``--config``, its admin key and its ledger."""

    def __init__(
        self,
        directory: Path,
        *extra_args: str,
        tenants: dict[str, dict] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.admin_key, admin_hash = new_admin_key()
        self.config_path = write_config(directory, admin_hash, tenants)
        self.ledger_path = directory / "ledger" / "usage.sqlite"
        self.process = ServerProcess(*SERVER_ARGS, "--config", str(self.config_path), *extra_args, env=env)
        self.base_url = self.process.base_url

    def stop(self, *args, **kwargs) -> int:
        return self.process.stop(*args, **kwargs)

    def usage(self, client: httpx.Client, **params) -> list[dict]:
        """``GET /v1/usage`` with the admin key: every record finished before the call counts."""
        r = client.get(self.base_url + "/v1/usage", params=params, headers=auth(self.admin_key))
        assert r.status_code == 200, r.text
        return r.json()["data"]

    def wait_for_requests(self, client: httpx.Client, tenant: str, count: int, timeout: float = 10.0) -> dict:
        """The tenant's totals once ``count`` of its requests have a record. A client that hangs up
        mid-stream returns before the server has noticed; this waits for the server."""
        deadline = time.monotonic() + timeout
        while True:
            rows = self.usage(client, tenant=tenant)
            if (rows and rows[0]["requests"] >= count) or time.monotonic() > deadline:
                assert rows and rows[0]["requests"] == count, rows
                return rows[0]
            time.sleep(0.02)

    def ledger_rows(self, tenant: str) -> list[dict]:
        """The tenant's ledger rows, read from the file (as ``trillium usage`` does)."""
        db = sqlite3.connect(f"file:{self.ledger_path}?mode=ro", uri=True)
        db.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in db.execute("SELECT * FROM usage WHERE tenant = ? ORDER BY id", (tenant,))]
        finally:
            db.close()


def auth(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def tenant_auth(tenant: str) -> dict:
    return auth(KEYS[tenant])


def scrape(client: httpx.Client, base_url: str, key: str | None = None) -> dict[tuple[str, frozenset], float]:
    """``GET /metrics`` through prometheus_client's parser: {(sample name, labels): value}. With
    ``--config`` the per-tenant series need the admin ``key``."""
    r = client.get(base_url + "/metrics", headers=auth(key) if key else None)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def sample(samples: dict, name: str, **labels) -> float:
    """One sample's value, 0 if the series does not exist yet."""
    if "model_name" not in labels and not name.startswith("trillium:tenant"):
        labels["model_name"] = MODEL
    return samples.get((name, frozenset(labels.items())), 0.0)


def sse_lines(response: httpx.Response):
    for line in response.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield line[len("data: ") :]
