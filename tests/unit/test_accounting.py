"""RequestAccount: every way out of a route handler leaves exactly one usage record, with the
status a user of the ledger expects (a crash in a request is ``failed`` with HTTP 500, an
engine error in a choice is ``failed``, a cancelled handler is ``aborted`` with 499)."""

from __future__ import annotations

import types

import pytest
import trio

from trillium.metering.metrics import Metrics
from trillium.protocol import FinishReason
from trillium.protocol.usage import ABORTED, COMPLETED, FAILED, REJECTED
from trillium.server.accounting import Accounting
from trillium.server.errors import APIError


class Sink:
    """The metering actor's inbox, as the frontend sees it: records are kept here."""

    def __init__(self) -> None:
        self.records = []
        self.committed = []  # records whose sender waited for the commit
        self.num_in_flight = 0

    def has_room(self) -> bool:
        return True

    def admit(self) -> None:
        self.num_in_flight += 1

    def send(self, record) -> None:
        self.num_in_flight -= 1
        self.records.append(record)

    async def commit(self, record) -> bool:
        self.send(record)
        self.committed.append(record)
        return True


class Stream:
    def __init__(self, reason: FinishReason | None, completion: int) -> None:
        self.finish_reason = reason
        self.num_prompt_tokens = 7
        self.num_completion_tokens = completion
        self.num_cached_tokens = 0
        self.queue_time = 0.01
        self.first_token_time = None
        self.last_token_time = None
        self.inter_token_seconds = []
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True


class Fanout:
    def __init__(self, *streams: Stream) -> None:
        self.streams = list(streams)
        self.n = len(streams)

    def abort(self) -> None:
        for s in self.streams:
            s.abort()

    def usage(self) -> dict:
        c = sum(s.num_completion_tokens for s in self.streams)
        return {
            "prompt_tokens": 7,
            "completion_tokens": c,
            "total_tokens": 7 + c,
            "prompt_tokens_details": {"cached_tokens": 0},
        }


@pytest.fixture
def accounting():
    return Accounting("m", Metrics("m", dict), None, Sink())


REQUEST = types.SimpleNamespace(headers={})


def test_completed_request(accounting):
    with accounting.admit(REQUEST, chat=True) as account:
        account.fanout = Fanout(Stream(FinishReason.STOP, 5), Stream(FinishReason.LENGTH, 3))
    (record,) = accounting.sink.records
    assert (record.status, record.http_status, record.completion_tokens, record.num_choices) == (COMPLETED, 200, 8, 2)


def test_crash_in_the_handler_is_a_failed_record_and_frees_the_choices(accounting):
    stream = Stream(None, 2)
    with pytest.raises(RuntimeError), accounting.admit(REQUEST, chat=False) as account:
        account.fanout = Fanout(stream)
        raise RuntimeError("bug")
    (record,) = accounting.sink.records
    assert (record.status, record.http_status, record.completion_tokens) == (FAILED, 500, 2)
    assert stream.aborted  # its KV blocks go back at once


def test_engine_error_in_one_choice_fails_the_request(accounting):
    with accounting.admit(REQUEST, chat=True) as account:
        account.fanout = Fanout(Stream(FinishReason.STOP, 4), Stream(FinishReason.ERROR, 1))
    (record,) = accounting.sink.records
    assert (record.status, record.finish_reason) == (FAILED, "error")


def test_bad_input_after_admission_is_rejected(accounting):
    with pytest.raises(APIError), accounting.admit(REQUEST, chat=True):
        raise APIError("bad", param="messages")
    (record,) = accounting.sink.records
    assert (record.status, record.http_status, record.prompt_tokens) == (REJECTED, 400, 0)


def test_cancelled_handler_is_aborted(accounting):
    async def handler():
        with trio.CancelScope() as scope, accounting.admit(REQUEST, chat=True) as account:
            account.fanout = Fanout(Stream(None, 3))
            scope.cancel()
            await trio.sleep(1)

    trio.run(handler)
    (record,) = accounting.sink.records
    assert (record.status, record.http_status, record.completion_tokens) == (ABORTED, 499, 3)


def test_finish_twice_sends_one_record(accounting):
    with accounting.admit(REQUEST, chat=True) as account:
        account.fanout = Fanout(Stream(FinishReason.STOP, 1))
        account.finish()
    assert len(accounting.sink.records) == 1 and accounting.sink.num_in_flight == 0


async def test_a_committed_record_is_not_sent_again(accounting):
    """A completed response commits its record before its last bytes; leaving the handler (or the
    stream's ``finally``) afterwards sends nothing more."""
    with accounting.admit(REQUEST, chat=True) as account:
        account.fanout = Fanout(Stream(FinishReason.STOP, 4))
        await account.finish_committed()
        account.finish()
    (record,) = accounting.sink.committed
    assert accounting.sink.records == [record] and accounting.sink.num_in_flight == 0
    assert (record.status, record.completion_tokens) == (COMPLETED, 4)


async def test_the_committed_record_counts_the_usage_the_response_reported(accounting):
    """Echo with ``max_tokens: 0`` generates a token the response leaves out of its usage."""
    with accounting.admit(REQUEST, chat=False) as account:
        account.fanout = Fanout(Stream(FinishReason.LENGTH, 1))
        await account.finish_committed(
            {
                "prompt_tokens": 7,
                "completion_tokens": 0,
                "total_tokens": 7,
                "prompt_tokens_details": {"cached_tokens": 0},
            }
        )
    (record,) = accounting.sink.committed
    assert (record.prompt_tokens, record.completion_tokens) == (7, 0)


async def test_finish_committed_without_a_sink_finishes():
    accounting = Accounting("m", Metrics("m", dict))
    with accounting.admit(REQUEST, chat=True) as account:
        account.fanout = Fanout(Stream(FinishReason.STOP, 2))
        await account.finish_committed()
        assert account.finished
