"""MeteringActor and UsageSink: batched writes, queries after earlier records, slot accounting,
and no record lost on stop or cancellation (the supervisor stops sinks last)."""

from __future__ import annotations

import json
import logging

import pytest
import trio

from trillium.metering.actor import MeteringActor
from trillium.metering.ledger import Ledger
from trillium.metering.request_log import format_record
from trillium.protocol.usage import UsageQuery, UsageRecord
from trillium.runtime import Actor, Supervisor


def record(i: int, tenant: str = "acme", completion: int = 3) -> UsageRecord:
    return UsageRecord(
        request_id=f"cmpl-{i}",
        tenant=tenant,
        model="m",
        endpoint="chat",
        created=1000.0 + i,
        prompt_tokens=10,
        completion_tokens=completion,
        e2e=0.25,
        finish_reason="stop",
    )


def ledger_totals(path: str) -> dict:
    ledger = Ledger(path)
    try:
        return {t.tenant: t for t in ledger.totals()}
    finally:
        ledger.close()


async def test_records_are_written_and_queries_see_every_earlier_record(tmp_path):
    path = str(tmp_path / "usage.sqlite")
    actor = MeteringActor(path)
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        sink = actor.sink
        for _ in range(50):
            sink.admit()
        for i in range(50):  # all at once, without yielding: one batch or a few
            sink.send(record(i, "acme" if i % 2 else "globex"))
        totals = {t.tenant: t for t in await sink.query(UsageQuery())}
        assert totals["acme"].requests == totals["globex"].requests == 25
        assert totals["acme"].completion_tokens == 75
        (only,) = await sink.query(UsageQuery(tenant="acme", since=1010.0, until=1020.0))
        assert only.requests == 5
        assert actor.num_written == 50 and actor.num_batches < 50
        assert sink.num_in_flight == 0
        actor.stop()
    assert ledger_totals(path)["acme"].requests == 25


@pytest.mark.parametrize("how", ["stop", "cancel"])
async def test_what_is_queued_is_written_on_the_way_out(tmp_path, how):
    """``stop()`` (the supervisor's normal shutdown) and a cancellation both flush the queue."""
    path = str(tmp_path / "usage.sqlite")
    actor = MeteringActor(path)
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        for i in range(20):
            actor.sink.admit()
            actor.sink.send(record(i))
        if how == "stop":
            actor.stop()  # before the actor ran again: the queue is flushed on the way out
        else:
            nursery.cancel_scope.cancel()
    assert ledger_totals(path)["acme"].requests == 20
    assert actor.stats() == {"num_usage_records_written": 20, "num_usage_batches": actor.num_batches}


def test_sink_reserves_a_slot_per_request_in_flight():
    actor = MeteringActor(None, bound=3)  # not running: nothing leaves the inbox
    sink = actor.sink
    for _ in range(3):
        assert sink.has_room()
        sink.admit()
    assert not sink.has_room()  # every slot belongs to a request in flight
    sink.send(record(0))
    assert sink.num_in_flight == 2 and not sink.has_room()  # its record now holds the slot
    sink.send(record(1))
    sink.send(record(2))  # never blocks or fails: the slots were reserved
    assert actor._drain() and sink.has_room()


async def test_query_without_a_ledger_fails_with_a_message():
    actor = MeteringActor(None, request_log=lambda records: None)
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        with pytest.raises(RuntimeError, match="no usage ledger"):
            await actor.sink.query(UsageQuery())
        actor.stop()


async def test_query_is_refused_while_every_slot_is_reserved():
    actor = MeteringActor(None, bound=1)
    actor.sink.admit()
    with pytest.raises(RuntimeError, match="busy"):
        await actor.sink.query(UsageQuery())


async def test_request_log_gets_every_record():
    logged = []
    actor = MeteringActor(None, request_log=logged.extend)
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        for i in range(5):
            actor.sink.admit()
            actor.sink.send(record(i))
        actor.stop()
    assert [r.request_id for r in logged] == [f"cmpl-{i}" for i in range(5)]


def test_request_log_line():
    line = json.loads(format_record(record(7)))
    assert line["event"] == "request" and line["time"] == "1970-01-01T00:16:47.000+00:00"
    assert line["request_id"] == "cmpl-7" and line["completion_tokens"] == 3 and line["tpot"] is None


async def test_write_failure_is_logged_not_raised(caplog):
    def broken(records):
        raise OSError("disk full")

    actor = MeteringActor(None, request_log=broken)
    with caplog.at_level(logging.ERROR, logger="trillium.metering"):
        async with trio.open_nursery() as nursery:
            await nursery.start(actor.run)
            actor.sink.admit()
            actor.sink.send(record(0))
            actor.stop()
    assert actor.num_written == 0 and "could not write 1 usage records" in caplog.text


class _LateSender(Actor):
    """Sends a record when it is cancelled, as the frontend does for requests cut off by shutdown."""

    name = "late-sender"

    def __init__(self, sink) -> None:
        super().__init__()
        self.sink = sink

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self.sink.admit()
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            self.sink.send(record(99))


async def test_supervisor_stops_sinks_after_the_actors_that_feed_them(tmp_path):
    path = str(tmp_path / "usage.sqlite")
    metering = MeteringActor(path)
    supervisor = Supervisor([_LateSender(metering.sink)], sinks=[metering], drain_timeout=0.01)
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: supervisor.run(handle_signals=False, task_status=task_status))
        supervisor.request_shutdown()
    assert ledger_totals(path)["acme"].requests == 1
    assert metering.num_written == 1
