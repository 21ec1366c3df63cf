"""The usage ledger under ``kill -9``: no completed response loses its record.

    python bench/ledger_kill.py                  # 20 rounds, 8 clients
    python bench/ledger_kill.py --rounds 3       # a quick check

Each round starts ``trillium serve --config`` on the same ledger file (the previous round's
server was killed: this is a restart on a ledger left by SIGKILL), drives ``--concurrency``
clients sending streamed requests in a closed loop (chat completions and completions with
``include_usage``, the Responses API; every ``--every-non-streamed``-th one not streamed), and
SIGKILLs the server's process group at a random moment, ``--min-kill-s`` to ``--max-kill-s``
after ``--warm`` responses completed (default: one per client; from then on responses complete
all the time, so the kill lands among them rather than in the first requests' warm-up). Then, with the server dead, it opens the ledger and checks:

- ``PRAGMA integrity_check`` is ``ok``;
- every response the clients read completely (``[DONE]``, the final Responses event, a whole
  JSON body) has its row, found by the response's ``id``, whose prompt, cached and completion
  tokens equal the ``usage`` the response reported;
- no request id has two rows.

After the last round the server is started once more on the ledger, serves one request, and is
stopped with SIGTERM; its row must be there too.

Without help a record written just *after* its response (the order before the group commit)
would be lost only if the kill lands in the millisecond or so it waits for the writer thread,
which few rounds hit. ``--delay-commit-ms D`` holds every ledger write back D ms (fault
injection, ``TRILLIUM_FAULT_INJECTION=1`` and ``POST /debug/faults``), which widens that window
to D ms per response: then the old order loses rows in nearly every round, and the group commit
only delays each response by up to D ms. Prints one JSON line per round and a summary
(``--result-file`` writes it all as JSON, with ``bench/machine.py``'s record). Exits 1 on any
missing row, mismatch, duplicate, failed integrity check or failed restart.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import httpx
import trio

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import describe
from metering_overhead import free_port, write_config  # one tenant "bench", limits never reached
from trillium.metering.tenants import new_key

PROMPTS = ("Count to ten:", "Name three colors.", "The sky is", "Write a haiku about rain.")


class Server:
    """``trillium serve`` in its own process group (SIGKILL reaches every process of it)."""

    def __init__(
        self, args: list[str], log_path: str, timeout_s: float = 300, env: dict[str, str] | None = None
    ) -> None:
        self.base_url = f"http://127.0.0.1:{free_port()}"
        port = self.base_url.rsplit(":", 1)[1]
        self._log = open(log_path, "a")  # noqa: SIM115  # the server's log for its lifetime; closed in stop()
        start = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trillium.cli", "serve", "--port", port, *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        deadline = start + timeout_s
        while True:
            if self.proc.poll() is not None:
                self._log.close()
                raise RuntimeError(f"server exited with {self.proc.returncode} while starting (log: {log_path})")
            try:
                if httpx.get(self.base_url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop(signal.SIGKILL)
                raise RuntimeError(f"server not healthy after {timeout_s:.0f} s (log: {log_path})")
            time.sleep(0.1)
        self.start_s = time.monotonic() - start

    def kill(self) -> None:
        """SIGKILL the process group: no handler, no flush, no atexit."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc.wait()
        self._log.close()
        return self.proc.returncode


@dataclass
class Load:
    completed: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # id -> reported usage
    num_cut: int = 0  # responses in flight when the server died
    errors: list[str] = field(default_factory=list)  # HTTP errors before the kill (should be none)


def _counts(usage: dict) -> tuple[int, int, int]:
    """(prompt, cached, completion) tokens of a chat/completions or a Responses ``usage``."""
    if "input_tokens" in usage:
        return usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"], usage["output_tokens"]
    return usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"], usage["completion_tokens"]


async def one_request(client: httpx.AsyncClient, kind: str, prompt: str, max_tokens: int) -> tuple[str, dict] | None:
    """Send one request and read its response to the end: (its id, its usage), or None if the
    response was not complete (the caller sees the transport error)."""
    common = {"temperature": 0.8, "max_tokens": max_tokens}
    if kind == "json":
        r = await client.post("/v1/completions", json={"prompt": prompt, **common})
        r.raise_for_status()
        body = r.json()
        return body["id"], body["usage"]
    if kind == "responses":
        payload = {"input": prompt, "max_output_tokens": max_tokens, "stream": True}
        final = None
        async with client.stream("POST", "/v1/responses", json=payload) as r:
            r.raise_for_status()
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    event = json.loads(line[6:])
                    if event["type"] in ("response.completed", "response.incomplete"):
                        final = event["response"]
        return (final["id"], final["usage"]) if final is not None else None
    path, body = (
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}]})
        if kind == "chat"
        else ("/v1/completions", {"prompt": prompt})
    )
    payload = {**body, **common, "stream": True, "stream_options": {"include_usage": True}}
    request_id, usage, done = None, None, False
    async with client.stream("POST", path, json=payload) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunk = json.loads(line[6:])
                request_id = chunk.get("id", request_id)
                usage = chunk.get("usage") or usage
    return (request_id, usage) if done and request_id is not None and usage is not None else None


async def drive(
    server: Server, tenant_key: str, args: argparse.Namespace, kill_after: float, rng: random.Random
) -> Load:
    """The clients' closed loop, and the SIGKILL ``kill_after`` seconds after its first
    ``args.warm`` completed responses."""
    load = Load()
    warm = trio.Event()
    kinds = ["chat", "completions", "responses"]
    headers = {"Authorization": f"Bearer {tenant_key}"}
    limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=args.concurrency)
    counter = itertools.count()
    async with httpx.AsyncClient(base_url=server.base_url, headers=headers, limits=limits, timeout=120) as client:

        async def client_loop() -> None:
            while True:
                i = next(counter)
                kind = "json" if args.every_non_streamed and i % args.every_non_streamed == 0 else kinds[i % 3]
                try:
                    result = await one_request(
                        client, kind, rng.choice(PROMPTS), rng.randint(args.max_tokens // 4, args.max_tokens)
                    )
                except httpx.HTTPStatusError as exc:
                    load.errors.append(f"{kind}: HTTP {exc.response.status_code}")
                    continue
                except (httpx.TransportError, json.JSONDecodeError):
                    load.num_cut += 1  # the server died under it
                    return
                if result is None:
                    load.num_cut += 1
                    return
                request_id, usage = result
                load.completed[request_id] = _counts(usage)
                if len(load.completed) >= args.warm:
                    warm.set()

        async def killer() -> None:
            await warm.wait()
            await trio.sleep(kill_after)
            server.kill()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(killer)
            for _ in range(args.concurrency):
                nursery.start_soon(client_loop)
    return load


def delay_commits(server: Server, admin_key: str, seconds: float) -> None:
    """Every ledger write of this server waits ``seconds`` first (the operator's fault point)."""
    fault = {"point": "metering.write", "action": "hang", "times": 10**9, "hang_s": seconds}
    r = httpx.post(
        server.base_url + "/debug/faults", json=fault, headers={"Authorization": f"Bearer {admin_key}"}, timeout=30
    )
    r.raise_for_status()


def check_ledger(path: str, completed: dict[str, tuple[int, int, int]]) -> dict:
    """Open the ledger after the kill (read-write: WAL recovery, as a restarted server does)."""
    db = sqlite3.connect(path)
    try:
        integrity = [r[0] for r in db.execute("PRAGMA integrity_check")]
        rows = {
            r[0]: (r[1], r[2], r[3])
            for r in db.execute("SELECT request_id, prompt_tokens, cached_tokens, completion_tokens FROM usage")
        }
        duplicates = db.execute("SELECT COUNT(*) FROM (SELECT 1 FROM usage GROUP BY request_id HAVING COUNT(*) > 1)")
        num_duplicates = duplicates.fetchone()[0]
        num_rows = db.execute("SELECT COUNT(*) FROM usage").fetchone()[0]
    finally:
        db.close()
    missing = [i for i in completed if i not in rows]
    mismatched = [i for i in completed if i in rows and rows[i] != completed[i]]
    return {
        "integrity": integrity,
        "rows_total": num_rows,
        "missing": missing,
        "mismatched": mismatched,
        "duplicates": num_duplicates,
    }


def final_restart(server_args: list[str], log_path: str, tenant_key: str, ledger: str) -> dict:
    """Start on the killed ledger once more, serve a request, stop cleanly: its row is there."""
    server = Server(server_args, log_path)
    try:
        r = httpx.post(
            server.base_url + "/v1/completions",
            json={"prompt": "Hello", "max_tokens": 4},
            headers={"Authorization": f"Bearer {tenant_key}"},
            timeout=120,
        )
        r.raise_for_status()
        request_id = r.json()["id"]
    finally:
        code = server.stop()
    db = sqlite3.connect(ledger)
    try:
        found = db.execute("SELECT COUNT(*) FROM usage WHERE request_id = ?", (request_id,)).fetchone()[0]
    finally:
        db.close()
    return {"served": True, "exit_code": code, "row_found": found == 1}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--concurrency", type=int, default=8, help="clients in the closed loop")
    p.add_argument("--max-tokens", type=int, default=12, help="each request asks for max/4 to max tokens")
    p.add_argument("--every-non-streamed", type=int, default=4, help="every k-th request not streamed (0: never)")
    p.add_argument("--warm", type=int, default=None, help="completed responses before the kill timer starts")
    p.add_argument("--min-kill-s", type=float, default=0.0, help="earliest SIGKILL after the warm-up")
    p.add_argument("--max-kill-s", type=float, default=3.0, help="latest SIGKILL after the warm-up")
    p.add_argument("--delay-commit-ms", type=float, default=0.0, help="hold every ledger write back (see above)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--result-file", default=None)
    p.add_argument(
        "--server-args",
        nargs=argparse.REMAINDER,
        default=None,
        help="arguments for `trillium serve` (last; default: --kv-cache-gib 0.25 --log-level warning "
        "--speculative-config off: speculation's start-up calibration would double each round's start)",
    )
    args = p.parse_args()
    if args.server_args is None:
        args.server_args = ["--kv-cache-gib", "0.25", "--log-level", "warning", "--speculative-config", "off"]
    if args.warm is None:
        args.warm = args.concurrency
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    rng = random.Random(seed)
    tenant_key, admin_key = new_key(), new_key()
    rounds: list[dict] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="trillium-ledger-kill-") as tmp:
        config = write_config(tmp, tenant_key, admin_key)
        ledger = os.path.join(tmp, "usage.sqlite")
        server_args = [*args.server_args, "--config", config]
        log_path = os.path.join(tmp, "server.log")
        env = {"TRILLIUM_FAULT_INJECTION": "1"} if args.delay_commit_ms else None
        for i in range(args.rounds):
            server = Server(server_args, log_path, env=env)
            if args.delay_commit_ms:
                delay_commits(server, admin_key, args.delay_commit_ms / 1000)
            kill_after = rng.uniform(args.min_kill_s, args.max_kill_s)
            try:
                load = trio.run(drive, server, tenant_key, args, kill_after, rng)
            finally:
                server.kill()
                server.proc.wait()
                server.stop()
            row = {
                "round": i,
                "start_s": round(server.start_s, 2),
                "kill_after_s": round(kill_after, 3),
                "exit_signal": -server.proc.returncode if server.proc.returncode < 0 else None,
                "completed_responses": len(load.completed),
                "cut_responses": load.num_cut,
                "http_errors": len(load.errors),
                **check_ledger(ledger, load.completed),
            }
            # Rows of responses cut by the kill: committed just before their last bytes went out.
            added = row["rows_total"] - (rounds[-1]["rows_total"] if rounds else 0)
            row["rows_of_cut_responses"] = added - len(load.completed) + len(row["missing"])
            print(
                json.dumps(
                    {k: v for k, v in row.items() if k not in ("missing", "mismatched")}
                    | {"missing": len(row["missing"]), "mismatched": len(row["mismatched"])}
                ),
                flush=True,
            )
            rounds.append(row)
        restart = final_restart(server_args, log_path, tenant_key, ledger)
        summary = {
            "rounds": args.rounds,
            "seed": seed,
            "concurrency": args.concurrency,
            "delay_commit_ms": args.delay_commit_ms,
            "completed_responses_checked": sum(r["completed_responses"] for r in rounds),
            "missing_rows": sum(len(r["missing"]) for r in rounds),
            "mismatched_rows": sum(len(r["mismatched"]) for r in rounds),
            "duplicate_ids": max((r["duplicates"] for r in rounds), default=0),
            "integrity_ok_rounds": sum(r["integrity"] == ["ok"] for r in rounds),
            "killed_by_sigkill_rounds": sum(r["exit_signal"] == signal.SIGKILL for r in rounds),
            "http_errors": sum(r["http_errors"] for r in rounds),
            "rows_total": rounds[-1]["rows_total"] if rounds else 0,
            "final_restart": restart,
            "wall_s": round(time.monotonic() - started, 1),
        }
    print(json.dumps(summary), flush=True)
    ok = (
        summary["missing_rows"] == 0
        and summary["mismatched_rows"] == 0
        and summary["duplicate_ids"] == 0
        and summary["integrity_ok_rounds"] == args.rounds
        and summary["http_errors"] == 0
        and restart["row_found"]
        and restart["exit_code"] == 0
    )
    print(
        f"{'PASS' if ok else 'FAIL'}: {summary['completed_responses_checked']} completed responses over "
        f"{args.rounds} SIGKILLs, {summary['missing_rows']} rows missing, {summary['mismatched_rows']} mismatched"
    )
    if args.result_file:
        with open(args.result_file, "w") as f:
            json.dump(
                {"command": " ".join(sys.argv), "machine": describe(), "summary": summary, "rounds": rounds},
                f,
                indent=2,
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
