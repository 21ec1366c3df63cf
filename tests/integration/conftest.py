"""A real server (the ``trillium serve`` CLI in a subprocess) on an ephemeral port."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time

import httpx
import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``verify``: the server speaks HTTPS (``--ssl-*`` among the arguments) and this context trusts it."""

    def __init__(
        self, *extra_args: str, env: dict[str, str] | None = None, verify: ssl.SSLContext | None = None
    ) -> None:
        self.port = free_port()
        self.verify = verify
        self.base_url = f"{'https' if verify else 'http'}://127.0.0.1:{self.port}"
        self.log_path = os.path.join(tempfile.gettempdir(), f"trillium-test-server-{self.port}.log")
        self._log = open(self.log_path, "wb")  # noqa: SIM115  # the server's log for its lifetime; closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trillium.cli", "serve", "--port", str(self.port), *extra_args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log()}")
            try:
                if httpx.get(self.base_url + "/health", timeout=1, verify=verify or True).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"server did not come up:\n{self.log()}")

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")[-5000:]

    def stop(self, sig=signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


class ServerPool:
    """One running server per distinct set of flags (and environment), started on its first use
    and stopped when the session ends (the ``server_with`` fixture, tests/conftest.py).

    For tests that only send requests to their server: a test that kills, drains, reloads or
    breaks its server starts its own ``ServerProcess``. A pooled server found dead (a bug, not a
    test's doing) is started again for the next user, its log kept under the old port's name."""

    def __init__(self) -> None:
        self._servers: dict[tuple, ServerProcess] = {}

    def __call__(self, *flags: str, env: dict[str, str] | None = None) -> ServerProcess:
        key = (flags, tuple(sorted((env or {}).items())))
        srv = self._servers.get(key)
        if srv is None or srv.proc.poll() is not None:
            srv = self._servers[key] = ServerProcess(*flags, env=env)
        return srv

    def stop_all(self) -> None:
        for srv in self._servers.values():
            srv.stop()
        self._servers.clear()


# fp32 so that greedy outputs do not depend on batch composition (bf16 rounding can flip
# near-tied argmaxes between a batch of 1 and a batch of 16).
SERVER_ARGS = ("--dtype", "fp32", "--max-model-len", "2048", "--kv-cache-gib", "0.25", "--max-running", "32")

# A waiting queue of 8 behind 4 running: the overload test and the overload benchmark's smoke run
# flood the same server (each leaves it idle).
MAX_WAITING = 8
SMALL_QUEUE_ARGS = (*SERVER_ARGS[:-2], "--max-running", "4", "--max-waiting", str(MAX_WAITING))


@pytest.fixture(scope="session")
def server(server_with):
    return server_with(*SERVER_ARGS)


@pytest.fixture(scope="session")
def exact_server(server_with):
    """``--precision exact``: fp32 everywhere, for the tests that compare with Hugging Face's fp32
    logits within an fp32 bound, whatever arithmetic the default mode takes (a bf16 KV cache, for
    one, moves them past it)."""
    return server_with(*SERVER_ARGS, "--precision", "exact")


@pytest.fixture(scope="session")
def small_queue_server(server_with):
    return server_with(*SMALL_QUEUE_ARGS)


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        yield client


@pytest.fixture
def openai_client(server):
    import openai

    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", timeout=120)


@pytest.fixture(scope="session")
def metered_server(tmp_path_factory):
    """A server with ``--config``: API keys, one tenant per limit, a usage ledger (tests/integration/metered.py)."""
    from tests.integration.metered import MeteredServer

    srv = MeteredServer(tmp_path_factory.mktemp("metered"))
    yield srv
    srv.stop()
