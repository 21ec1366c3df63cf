"""MeteringActor: writes every :class:`UsageRecord` to the ledger (and the request log) in batches.

Two ways in. A request whose response completed hands its record over with
:meth:`UsageSink.commit` and waits until it is committed, *before* the response's last bytes
go out (``[DONE]``, the final Responses event, a JSON body): a client that read a whole
response has its request in the ledger even if the server is killed with SIGKILL the next
moment (WAL with ``synchronous=NORMAL`` survives a process kill once COMMIT returns; see
``ledger.py``). Every other record (aborted, failed, rejected: no completed response) goes with
:meth:`UsageSink.send`, synchronous and non-blocking, written soon after.

Group commit: the actor writes whatever has piled up since its last write, waited-for records
and others alike, in one transaction, in its own worker thread (the event loop never waits on
the disk), then wakes every waiter of that batch. Under load the batches simply grow: the
requests that finish while one transaction commits share the next one.

No record is lost: the inbox holds :data:`~trillium.runtime.METERING_INBOX_BOUND` records and
the frontend admits a request only while a slot is free for its record
(:meth:`UsageSink.has_room`), counting the requests in flight, so neither ``send`` nor
``commit`` ever finds the inbox full; a waiter holds no slot beyond its record's. A commit that
fails (logged by the actor) or takes longer than :data:`COMMIT_TIMEOUT` wakes its waiter with
``False``, and the response completes anyway: a ledger in trouble delays responses by at most
that long and never hangs them. The supervisor stops this actor after the actors that feed it
(a *sink*): :meth:`MeteringActor.stop` makes it write what is queued and return. If the actor
fails, the records it had taken but not written stay in :attr:`MeteringActor.pending` and are
written first (their waiters woken then) when the supervisor restarts it; the inbox itself
survives the restart.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeAlias

import trio

from trillium.metering.ledger import Ledger
from trillium.protocol.usage import TenantUsage, UsageQuery, UsageRecord
from trillium.runtime import METERING_INBOX_BOUND, Sink, faults, open_inbox

log = logging.getLogger("trillium.metering")

# How long a final flush (shutdown) may take before records are given up with an error log.
FLUSH_TIMEOUT = 10.0
# How long a response waits for its record's commit before it completes anyway (error log): a
# commit takes well under a millisecond; this bounds what a wedged ledger costs each response.
COMMIT_TIMEOUT = 5.0
# Pauses before a failed ledger transaction is tried again (then its records are given up):
# about what a busy or briefly locked database needs, within COMMIT_TIMEOUT.
WRITE_RETRY_S = (0.05, 0.25, 1.0)


class Committed:
    """A record whose sender waits for its commit (:meth:`UsageSink.commit`). ``done`` is set
    once the transaction holding it committed (``ok``) or failed (``ok`` stays False)."""

    __slots__ = ("done", "ok", "record")

    def __init__(self, record: UsageRecord) -> None:
        self.record = record
        self.done = trio.Event()
        self.ok = False


# What the inbox carries; a query is answered with the totals or an error string.
_Item: TypeAlias = UsageRecord | Committed | UsageQuery
_Answer: TypeAlias = list[TenantUsage] | str


class UsageSink:
    """The frontend's end of the metering actor's inbox. Runs on the event loop only."""

    def __init__(self, send: trio.MemorySendChannel[_Item], bound: int, commit_timeout: float = COMMIT_TIMEOUT) -> None:
        self._send = send
        self._bound = bound
        self._commit_timeout = commit_timeout
        self.num_in_flight = 0  # admitted requests whose record has not been sent yet

    def has_room(self) -> bool:
        """Whether one more request may be admitted: its record will have a slot in the inbox."""
        return self.num_in_flight + self._send.statistics().current_buffer_used < self._bound

    def admit(self) -> None:
        self.num_in_flight += 1

    def send(self, record: UsageRecord) -> None:
        """Hand over the record of a request that :meth:`admit` counted. Never blocks or fails
        while the actor runs (its slot was reserved); after shutdown the record is logged."""
        self.num_in_flight -= 1
        try:
            self._send.send_nowait(record)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            log.error("usage record lost (metering stopped): %s", record)

    async def commit(self, record: UsageRecord) -> bool:
        """Hand over the record of a request that :meth:`admit` counted and wait until the
        transaction holding it has committed: True then. False, with an error log, when the write
        failed (the record is given up, as :meth:`send`'s would be) or did not finish within the
        commit timeout (the record stays queued and is written when the ledger can). The wait is
        not shielded: a cancellation of the caller (its client left, a forced shutdown)
        propagates, and the record, already queued, is written all the same."""
        self.num_in_flight -= 1
        waiter = Committed(record)
        try:
            self._send.send_nowait(waiter)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            log.error("usage record lost (metering stopped): %s", record)
            return False
        with trio.move_on_after(self._commit_timeout):
            await waiter.done.wait()
        if not waiter.done.is_set():
            log.error(
                "usage record %s not committed within %.0fs; the response completes without waiting for it",
                record.request_id,
                self._commit_timeout,
            )
        elif not waiter.ok:
            log.error("usage record %s could not be committed; the response completes all the same", record.request_id)
        return waiter.ok

    async def query(self, query: UsageQuery) -> list[TenantUsage]:
        """Per-tenant totals, after every record sent before this call has been written."""
        if not self.has_room():  # the free slots belong to the records of requests in flight
            raise RuntimeError("the usage ledger is busy; retry")
        send, recv = trio.open_memory_channel[_Answer](1)
        query.reply = send
        self._send.send_nowait(query)
        async with recv:
            result = await recv.receive()
        if isinstance(result, str):
            raise RuntimeError(result)
        return result


class MeteringActor(Sink):
    """Owns the ledger (optional) and the request log (optional); the only writer of both."""

    name = "metering"

    def __init__(
        self,
        ledger_path: str | None,
        request_log: Callable[[list[UsageRecord]], None] | None = None,
        bound: int = METERING_INBOX_BOUND,
        commit_timeout: float = COMMIT_TIMEOUT,
        synchronous: str = "NORMAL",
    ) -> None:
        send, inbox = open_inbox(bound)
        super().__init__(inbox)
        self._inbox = inbox
        self.ledger_path = ledger_path
        self.synchronous = synchronous  # the ledger's SQLite setting (see Ledger)
        self.request_log = request_log
        self.pending: list[_Item] = []  # taken from the inbox, not yet written (kept across a failure)
        self.sink = UsageSink(send, bound, commit_timeout)
        self._ledger: Ledger | None = None
        self._writer = trio.CapacityLimiter(1)  # one ledger call at a time (sqlite connection)
        self._wait_scope: trio.CancelScope | None = None
        self._stopping = False
        self.num_written = 0
        self.num_batches = 0
        self.num_lost = 0  # records given up after every try failed

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if self.ledger_path is not None and self._ledger is None:
            self._ledger = await trio.to_thread.run_sync(
                Ledger, self.ledger_path, self.synchronous, limiter=self._writer
            )
            log.info("usage ledger: %s", self.ledger_path)
        task_status.started()
        try:
            while not self._stopping:
                if not self.pending:
                    with trio.CancelScope() as self._wait_scope:  # stop() cancels only this wait
                        self.pending.append(await self._inbox.receive())
                    self.took_message()
                self.pending.extend(self._drain())
                # Shielded: what has left the inbox must reach the disk even when a cancellation
                # arrives meanwhile; the next receive() is where cancellation takes effect.
                with trio.CancelScope(shield=True):
                    await self._handle(self.pending)
                self.pending = []
        except Exception:
            # A failure: ``pending`` is written when the supervisor restarts us (ledger kept open).
            raise
        except BaseException:
            await self._final_flush()
            raise
        await self._final_flush()

    async def _final_flush(self) -> None:
        """Whatever is taken or queued now goes to disk, even if we are being cancelled."""
        with trio.CancelScope(shield=True), trio.move_on_after(FLUSH_TIMEOUT) as scope:
            await self._handle(self.pending + self._drain())
            self.pending = []
            if self._ledger is not None:
                await trio.to_thread.run_sync(self._ledger.close, limiter=self._writer)
        if scope.cancelled_caught:
            log.error("metering: final flush did not finish in %.0fs", FLUSH_TIMEOUT)

    def stop(self) -> None:
        """Write what is queued and return from :meth:`run` (the feeding actors are done)."""
        self._stopping = True
        if self._wait_scope is not None:
            self._wait_scope.cancel()

    def stats(self) -> dict[str, int]:
        return {
            "num_usage_records_written": self.num_written,
            "num_usage_batches": self.num_batches,
            "num_usage_records_lost": self.num_lost,
        }

    def _drain(self) -> list[_Item]:
        items: list[_Item] = []
        while True:
            try:
                items.append(self._inbox.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                return items

    async def _handle(self, items: list[_Item]) -> None:
        """Write the records in ``items``, answering each query after the records before it."""
        await faults.ahit("metering.write")
        batch: list[UsageRecord | Committed] = []
        for item in items:
            if isinstance(item, UsageQuery):
                await self._write(batch)
                batch = []
                await self._answer(item)
            else:
                batch.append(item)
        await self._write(batch)

    async def _write(self, batch: list[UsageRecord | Committed]) -> None:
        """One transaction for ``batch``, then wake its waiters. A failed transaction (a busy
        database, a full disk) is tried again after :data:`WRITE_RETRY_S` pauses, meanwhile the
        inbox fills and new requests get 503; after the last try the records are given up, logged
        and counted (``num_lost``), and their waiters told so (each has let its response go
        after ``COMMIT_TIMEOUT`` anyway). With a ledger, the request log is written after the
        transaction (given up or not), and its failure is only logged: it never makes a committed
        record look lost."""
        if not batch:
            return
        records = [item.record if isinstance(item, Committed) else item for item in batch]
        ok = False
        for attempt, pause in enumerate((*WRITE_RETRY_S, None)):
            try:
                await trio.to_thread.run_sync(self._commit, records, limiter=self._writer)
            except Exception:
                if pause is None:
                    log.exception("metering: could not write %d usage records (%d tries)", len(records), attempt + 1)
                    self.num_lost += len(records)
                    break
                log.warning("metering: writing %d usage records failed (try %d); again in %gs",
                            len(records), attempt + 1, pause, exc_info=True)  # fmt: skip
                await trio.sleep(pause)
            else:
                ok = True
                self.num_written += len(records)
                self.num_batches += 1
                break
        for item in batch:
            if isinstance(item, Committed):
                item.ok = ok
                item.done.set()
        if self._ledger is not None and self.request_log is not None:  # logged, committed or not
            try:
                await trio.to_thread.run_sync(self.request_log, records, limiter=self._writer)
            except Exception:
                log.exception("metering: could not log %d finished requests", len(records))

    def _commit(self, records: list[UsageRecord]) -> None:
        """The durable write: the ledger's transaction, or without a ledger the request log (the
        only record there is)."""
        if self._ledger is not None:
            self._ledger.write(records)
        elif self.request_log is not None:
            self.request_log(records)

    async def _answer(self, query: UsageQuery) -> None:
        result: _Answer
        if self._ledger is None:
            result = "no usage ledger is configured"
        else:
            try:
                result = await trio.to_thread.run_sync(
                    self._ledger.totals, query.since, query.until, query.tenant, limiter=self._writer
                )
            except Exception as exc:
                log.exception("metering: usage query failed")
                result = f"usage query failed: {exc}"
        try:
            query.reply.send_nowait(result)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the asker went away
