"""What it costs to commit a usage record before the response's last byte, in process (no server):
the metering actor's group commit against one transaction per record, and against
``synchronous=FULL``.

    python bench/ledger_commit.py                  # 4,000 records per setting
    python bench/ledger_commit.py --quick

For each ``synchronous`` mode (NORMAL: what the server uses, durable against a process kill;
FULL: an fsync per commit, durable against power loss too) and each number of concurrent
waiters (1: every record its own transaction, as a per-request commit would be; 8, 64: requests
finishing together, whose records share transactions), ``--num-records`` records are committed
through :meth:`UsageSink.commit` on a temporary ledger, each waiter committing one record after
another. Prints one JSON line per setting: records/s, µs per record (wall time of the run /
records: event loop and writer thread together), the mean transaction size, and the median and
p99 time a waiter waits for its commit. ``send`` rows are the order before the group commit, for
comparison: the same tasks hand their records over with :meth:`UsageSink.send` and go on without
waiting (the response's last bytes would not wait for the disk, nor survive a kill before it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import trio
import trio.lowlevel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import describe
from trillium.metering.actor import MeteringActor
from trillium.protocol.usage import UsageRecord


def _record(i: int) -> UsageRecord:
    return UsageRecord(
        request_id=f"cmpl-{i}",
        tenant="bench",
        model="m",
        endpoint="completions",
        created=time.time(),
        prompt_tokens=12,
        completion_tokens=16,
        e2e=0.2,
        finish_reason="length",
    )


async def run(path: str, synchronous: str, num_waiters: int, num_records: int, mode: str) -> dict:
    actor = MeteringActor(path, synchronous=synchronous)
    waits: list[float] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        sink = actor.sink
        per_waiter = num_records // num_waiters

        async def waiter(w: int) -> None:
            for k in range(per_waiter):
                sink.admit()
                if mode == "send":
                    sink.send(_record(w * per_waiter + k))
                    await trio.lowlevel.checkpoint()  # the next request's work
                    continue
                asked = time.perf_counter()
                ok = await sink.commit(_record(w * per_waiter + k))
                waits.append(time.perf_counter() - asked)
                assert ok

        start = time.perf_counter()
        async with trio.open_nursery() as waiters:
            for w in range(num_waiters):
                waiters.start_soon(waiter, w)
        actor.stop()  # returns once all is written (send: the writer catches up)
    wall = time.perf_counter() - start
    n = per_waiter * num_waiters
    assert actor.num_written == n
    waits.sort()
    return {
        "mode": mode,
        "synchronous": synchronous,
        "waiters": num_waiters,
        "records": n,
        "records_per_s": round(n / wall),
        "us_per_record": round(1e6 * wall / n, 1),
        "records_per_transaction": round(actor.num_written / actor.num_batches, 1),
        "wait_p50_us": round(1e6 * statistics.median(waits), 1) if waits else None,
        "wait_p99_us": round(1e6 * waits[min(n - 1, int(0.99 * n))], 1) if waits else None,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-records", type=int, default=4000)
    p.add_argument("--waiters", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--synchronous", nargs="+", default=["NORMAL", "FULL"])
    p.add_argument("--modes", nargs="+", default=["commit", "send"], choices=["commit", "send"])
    p.add_argument("--quick", action="store_true", help="smoke mode: 256 records")
    args = p.parse_args()
    if args.quick:
        args.num_records = 256
    print(json.dumps({"machine": describe()}), flush=True)
    for mode in args.modes:
        for synchronous in args.synchronous:
            for num_waiters in args.waiters:
                with tempfile.TemporaryDirectory(prefix="trillium-ledger-commit-") as tmp:
                    path = os.path.join(tmp, "usage.sqlite")
                    row = trio.run(run, path, synchronous, num_waiters, args.num_records, mode)
                print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
