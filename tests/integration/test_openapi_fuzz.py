"""Schemathesis, driven by the live server's own ``/openapi.json``.

``schemathesis run`` (a subprocess: its CLI is its stable interface, and prints each failure
with a curl line that reproduces it) sends every operation generated requests, valid and
invalid, bounded by ``tests/integration/schemathesis.toml``. Every response must be: no 5xx
(a 503 only with ``Retry-After``: overload is not a crash), a status the document lists, a body
and headers that match the document (so that it stays honest), an OpenAI error object for every
error, and the server still live after each case (``openapi_fuzz_hooks.py``, which also caps
the tokens a case asks for). The seed is the test's random seed: ``TRILLIUM_TEST_SEED=<seed>``
replays a failure (tests/conftest.py).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).parent
ROOT = HERE.parents[1]


def test_schemathesis_finds_nothing(server, random_seed):
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "tests.integration.openapi_fuzz_hooks",
        "TRILLIUM_FUZZ_URL": server.base_url,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    command = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "--no-color",
        "--config-file",
        str(HERE / "schemathesis.toml"),
        "run",
        f"{server.base_url}/openapi.json",
        "--seed",
        str(random_seed),
        "--request-timeout",
        "60",
    ]
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"{run.stdout[-20000:]}\n{run.stderr[-5000:]}\nserver log:\n{server.log()}"
    assert server.proc.poll() is None


def test_server_is_idle_and_serving_after_fuzzing(http):
    """Runs after the fuzz test (file order): nothing it sent left a request running or the server broken."""
    deadline = time.monotonic() + 30
    while http.get("/stats").json()["num_requests_running"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert http.get("/stats").json()["num_requests_running"] == 0
    assert http.get("/health").status_code == 200
    r = http.post("/v1/completions", json={"prompt": "The sky is", "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200, r.text
