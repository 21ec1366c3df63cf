"""CPU cost of metering per request, in process and without a model: what
``bench/metering_overhead.py`` measures end to end, isolated from the noise of a real server.

    python bench/metering_micro.py            # 20,000 requests
    python bench/metering_micro.py --quick    # smoke mode

Two numbers:

- event loop: ``Accounting.admit`` (key hash, concurrency / requests-per-minute checks, a slot in
  the metering inbox) + ``limit_tokens`` (tokens-per-request check, tokens-per-minute reservation)
  + ``finish`` (usage record, Prometheus updates, refund, hand-over to the metering actor) for a
  completed one-choice request of 8 tokens, against the open server's path (``admit`` and
  ``finish`` with metrics only). This is the part that competes with the server's other work.
- ledger: ``Ledger.write`` per record in batches of ``--batch`` (the metering actor's worker
  thread; SQLite WAL, synchronous=NORMAL) on a temporary file.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from starlette.requests import Request

from trillium.metering import Ledger, MeteringActor, Metrics
from trillium.metering.tenants import AccessConfig, TenantLimits, hash_key
from trillium.protocol import FinishReason, SamplingParams
from trillium.protocol.usage import UsageRecord
from trillium.server.accounting import Accounting
from trillium.server.openai_shapes import ChoiceFanout

UNLIMITED = 10**9
KEY = "sk-bench-key"


class _DoneStream:
    """What a RequestStream holds once its request completed with 8 tokens."""

    def __init__(self) -> None:
        now = time.monotonic()
        self.num_prompt_tokens, self.num_cached_tokens, self.num_completion_tokens = 5, 0, 8
        self.finish_reason = FinishReason.LENGTH
        self.queue_time, self.first_token_time, self.last_token_time = 0.001, now - 0.07, now
        self.inter_token_seconds = [0.01] * 7

    def abort(self) -> None:
        pass


def per_request_us(accounting: Accounting, request: Request, n: int) -> float:
    sampling = SamplingParams(max_tokens=8)
    start = time.perf_counter()
    for _ in range(n):
        account = accounting.admit(request, chat=False)
        account.limit_tokens(sampling, 5, 1, 2000)
        account.fanout = ChoiceFanout(lambda i: _DoneStream(), 1)
        account.finish()
    return 1e6 * (time.perf_counter() - start) / n


def event_loop_costs(n: int) -> dict:
    stats = dict  # the scheduler's stats are read at scrape time only
    open_accounting = Accounting("m", Metrics("m", stats))
    access = AccessConfig(
        limits={
            "bench": TenantLimits(
                requests_per_minute=UNLIMITED,
                tokens_per_minute=UNLIMITED,
                max_concurrent_requests=UNLIMITED,
                max_tokens_per_request=UNLIMITED,
            )
        },
        key_hashes={hash_key(KEY).removeprefix("sha256:"): "bench"},
        admin_key_hashes=frozenset(),
        ledger_path="unused",
    )
    metering = MeteringActor(None, bound=n + 1)  # not running: records stay in its inbox
    metered_accounting = Accounting("m", Metrics("m", stats), access, metering.sink)
    request = Request({"type": "http", "headers": [(b"authorization", f"Bearer {KEY}".encode())]})
    per_request_us(open_accounting, request, min(n, 1000))  # warm-up
    open_us = per_request_us(open_accounting, request, n)
    metered_us = per_request_us(metered_accounting, request, n)
    return {
        "open_us_per_request": round(open_us, 2),
        "metered_us_per_request": round(metered_us, 2),
        "added_us_per_request": round(metered_us - open_us, 2),
    }


def ledger_cost(n: int, batch: int) -> dict:
    records = [
        UsageRecord(
            request_id=f"cmpl-{i:032x}",
            tenant="bench",
            model="m",
            endpoint="completions",
            created=time.time(),
            prompt_tokens=5,
            completion_tokens=8,
            queue_time=0.001,
            ttft=0.05,
            tpot=0.01,
            e2e=0.12,
            finish_reason="length",
        )
        for i in range(n)
    ]
    with tempfile.TemporaryDirectory() as tmp:
        ledger = Ledger(os.path.join(tmp, "usage.sqlite"))
        start = time.perf_counter()
        for i in range(0, n, batch):
            ledger.write(records[i : i + batch])
        elapsed = time.perf_counter() - start
        ledger.close()
    return {"ledger_batch": batch, "ledger_us_per_record": round(1e6 * elapsed / n, 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-requests", type=int, default=20000)
    p.add_argument("--batch", type=int, default=16, help="records per ledger transaction")
    p.add_argument("--quick", action="store_true", help="smoke mode: 500 requests")
    args = p.parse_args()
    if args.quick:
        args.num_requests = 500
    print(
        json.dumps(
            {
                "requests": args.num_requests,
                **event_loop_costs(args.num_requests),
                **ledger_cost(args.num_requests, args.batch),
            }
        )
    )


if __name__ == "__main__":
    main()
