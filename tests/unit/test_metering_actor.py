"""MeteringActor and UsageSink: batched writes, queries after earlier records, slot accounting,
no record lost on stop or cancellation (the supervisor stops sinks last), and the group commit
that a completed response waits for (woken only after the commit, never hung by a failing or
stuck one)."""

from __future__ import annotations

import json
import logging
import sqlite3
import threading

import pytest
import trio
import trio.testing

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
    assert actor.stats() == {
        "num_usage_records_written": 20,
        "num_usage_batches": actor.num_batches,
        "num_usage_records_lost": 0,
    }


async def test_a_failed_transaction_is_tried_again_and_a_failing_request_log_loses_nothing(tmp_path, monkeypatch):
    """A database busy for two tries: the batch is written on the third and its waiter told so;
    the request log raising after the commit changes nothing of that."""
    from trillium.metering.ledger import Ledger

    real_write, failures = Ledger.write, [2]

    def flaky_write(self, records):
        if failures[0]:
            failures[0] -= 1
            raise sqlite3.OperationalError("database is locked")
        real_write(self, records)

    def broken_log(records):
        raise OSError("stderr closed")

    monkeypatch.setattr(Ledger, "write", flaky_write)
    path = str(tmp_path / "usage.sqlite")
    actor = MeteringActor(path, request_log=broken_log)
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        actor.sink.admit()
        with trio.fail_after(10):
            assert await actor.sink.commit(record(0))
        actor.stop()
    assert failures == [0] and actor.num_written == 1 and actor.num_lost == 0
    assert ledger_totals(path)["acme"].requests == 1


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


class _SlowWriter:
    """The writer thread's work (the request log's place in it): each call blocks until released,
    so that a test can see who waits on a commit that has not happened yet."""

    def __init__(self, fail: bool = False) -> None:
        self.entered = threading.Event()  # a write is in progress
        self.release = threading.Event()
        self.fail = fail
        self.batches: list[list[str]] = []

    def __call__(self, records: list[UsageRecord]) -> None:
        self.entered.set()
        assert self.release.wait(30), "never released"
        if self.fail:
            raise OSError("disk full")
        self.batches.append([r.request_id for r in records])


async def test_commit_waiters_wake_only_after_their_commit_and_share_one_transaction():
    writer = _SlowWriter()
    actor = MeteringActor(None, request_log=writer)
    woken: dict[int, bool] = {}

    async def commit(i: int) -> None:
        woken[i] = await actor.sink.commit(record(i))

    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        for _ in range(5):
            actor.sink.admit()
        nursery.start_soon(commit, 0)
        await trio.to_thread.run_sync(writer.entered.wait)  # record 0's transaction is under way
        for i in range(1, 5):  # they finish while it commits: queued for the next one
            nursery.start_soon(commit, i)
        await trio.testing.wait_all_tasks_blocked()
        assert woken == {} and writer.batches == []
        writer.release.set()
        while len(woken) < 5:
            await trio.sleep(0.01)
        actor.stop()
    assert woken == dict.fromkeys(range(5), True)
    first, second = writer.batches  # group commit: the four queued meanwhile in one transaction
    assert first == ["cmpl-0"] and sorted(second) == ["cmpl-1", "cmpl-2", "cmpl-3", "cmpl-4"]
    assert actor.sink.num_in_flight == 0


async def test_a_woken_waiter_finds_its_row_committed(tmp_path):
    """When ``commit`` returns True another connection (``trillium usage``, or the next process
    after a kill) already reads the row: the transaction is committed, not merely begun."""
    path = str(tmp_path / "usage.sqlite")
    actor = MeteringActor(path)
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        actor.sink.admit()
        assert await actor.sink.commit(record(1, completion=9))
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            rows = db.execute("SELECT request_id, completion_tokens FROM usage").fetchall()
        finally:
            db.close()
        assert rows == [("cmpl-1", 9)]
        actor.stop()


async def test_a_failing_commit_wakes_its_waiter_with_false(caplog):
    writer = _SlowWriter(fail=True)
    writer.release.set()
    actor = MeteringActor(None, request_log=writer)
    with caplog.at_level(logging.ERROR, logger="trillium.metering"):
        async with trio.open_nursery() as nursery:
            await nursery.start(actor.run)
            actor.sink.admit()
            with trio.fail_after(10):
                assert not await actor.sink.commit(record(0))
            actor.stop()
    assert "could not write 1 usage records" in caplog.text
    assert "cmpl-0 could not be committed" in caplog.text


async def test_a_stuck_commit_times_out_and_the_record_is_written_later(caplog, autojump_clock):
    writer = _SlowWriter()
    actor = MeteringActor(None, request_log=writer, commit_timeout=2.0)
    with caplog.at_level(logging.ERROR, logger="trillium.metering"):
        async with trio.open_nursery() as nursery:
            await nursery.start(actor.run)
            actor.sink.admit()
            start = trio.current_time()
            assert not await actor.sink.commit(record(0))  # the writer never returned
            assert trio.current_time() - start == pytest.approx(2.0)
            writer.release.set()
            actor.stop()
    assert "cmpl-0 not committed within 2s" in caplog.text
    assert writer.batches == [["cmpl-0"]] and actor.num_written == 1


async def test_a_cancelled_waiter_is_cancelled_and_its_record_still_written():
    """The client leaves (or a forced shutdown) while its response waits on the commit."""
    writer = _SlowWriter()
    actor = MeteringActor(None, request_log=writer)
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        actor.sink.admit()

        async def cancel_during_the_write() -> None:
            await trio.to_thread.run_sync(writer.entered.wait)
            scope.cancel()

        with trio.CancelScope() as scope:
            nursery.start_soon(cancel_during_the_write)
            await actor.sink.commit(record(0))
            pytest.fail("the wait swallowed the cancellation")
        assert scope.cancelled_caught
        writer.release.set()
        actor.stop()
    assert writer.batches == [["cmpl-0"]] and actor.sink.num_in_flight == 0
