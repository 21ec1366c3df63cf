"""Supervision: restarts within a budget, exit code past it, answers for whoever waited on a
failed actor, the watchdog's liveness verdicts, and no usage record lost across a restart.

Faults are injected with ``trillium.runtime.faults`` at the points the actors declare."""

from __future__ import annotations

import os
import signal

import pytest
import trio
import trio.lowlevel

from trillium.engine_client import ActorFailed, ask
from trillium.metering.actor import MeteringActor
from trillium.metering.ledger import Ledger
from trillium.protocol import TokenizeRequest, TokenizeResult
from trillium.protocol.usage import UsageRecord
from trillium.runtime import Actor, RestartPolicy, Supervisor, faults, open_inbox
from trillium.tokenizer.actor import TokenizerActor


@pytest.fixture(autouse=True)
def _disarm():
    yield
    faults.clear()


class Flaky(Actor):
    """Fails ``fail_times`` times after starting, then serves until cancelled."""

    name = "flaky"
    restart_policy = RestartPolicy(max_restarts=3, window_s=60, backoff_s=0.001)

    def __init__(self, fail_times: int) -> None:
        super().__init__()
        self.fail_times = fail_times
        self.runs = 0
        self.serving = trio.Event()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self.runs += 1
        task_status.started()
        if self.runs <= self.fail_times:
            raise RuntimeError(f"failure {self.runs}")
        self.serving.set()
        await trio.sleep_forever()


async def start(supervisor: Supervisor, nursery: trio.Nursery) -> None:
    await nursery.start(lambda task_status: supervisor.run(handle_signals=False, task_status=task_status))


async def test_a_failed_actor_restarts_while_the_others_keep_running():
    flaky, steady = Flaky(fail_times=2), Flaky(fail_times=0)
    steady.name = "steady"
    supervisor = Supervisor([steady, flaky])
    async with trio.open_nursery() as nursery:
        await start(supervisor, nursery)
        await flaky.serving.wait()
        assert (flaky.runs, steady.runs, supervisor.num_restarts) == (3, 1, 2)
        assert supervisor.health.latest.live
        supervisor.request_shutdown()
    assert supervisor.exit_code == 0 and flaky.done.is_set()


async def test_past_the_restart_budget_the_server_stops_with_exit_code_1():
    flaky, steady = Flaky(fail_times=100), Flaky(fail_times=0)
    steady.name = "steady"
    supervisor = Supervisor([steady, flaky])
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await start(supervisor, nursery)
    # max_restarts=3: the fourth failure inside the window is one too many.
    assert flaky.runs == 4 and supervisor.exit_code == 1
    assert "flaky failed 4 times" in supervisor.fatal
    health = supervisor.health.latest
    assert not health.live and not health.ready and supervisor.fatal in health.reasons
    assert steady.done.is_set()  # everything else was stopped


async def test_an_actor_that_fails_while_starting_is_not_restarted():
    class Broken(Actor):
        name = "broken"

        async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
            raise RuntimeError("cannot start")

    supervisor = Supervisor([Broken()])
    with pytest.RaisesGroup(pytest.RaisesExc(RuntimeError, match="cannot start"), flatten_subgroups=True):
        async with trio.open_nursery() as nursery:
            await start(supervisor, nursery)


class Stuck(Actor):
    """Takes nothing from its inbox: the watchdog must notice."""

    name = "stuck"
    stall_after_s = 0.2

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await trio.sleep_forever()


async def test_watchdog_reports_an_actor_that_stops_taking_messages():
    send, recv = open_inbox(4)
    stuck = Stuck(recv)
    supervisor = Supervisor([stuck], watch_interval=0.05)
    async with trio.open_nursery() as nursery:
        await start(supervisor, nursery)
        await trio.sleep(0.3)
        assert supervisor.health.latest.live and supervisor.health.latest.ready  # an empty inbox is fine
        send.send_nowait("hello")
        with trio.fail_after(5):
            while supervisor.health.latest.live:
                await trio.sleep(0.05)
        assert "stuck has not taken a message" in supervisor.health.latest.reasons[0]
        supervisor.request_shutdown()


class FakeTokenizer:
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [len(w) for w in text.split()]

    def decode(self, ids: list[int]) -> str:
        return " ".join(map(str, ids))

    def apply_chat_template(self, messages, add_generation_prompt=True) -> str:
        return " ".join(m["content"] for m in messages)


async def tokenize(send, text: str) -> list[int]:
    result: TokenizeResult = await ask(send, "tokenizer", lambda reply: TokenizeRequest(prompt=text, reply=reply))
    return result.token_ids


async def test_requests_waiting_on_a_failed_tokenizer_get_an_error_and_the_restarted_actor_serves():
    send, recv = open_inbox(16)
    actor = TokenizerActor(FakeTokenizer(), recv)
    supervisor = Supervisor([actor])
    async with trio.open_nursery() as nursery:
        await start(supervisor, nursery)
        faults.arm("tokenizer.message", "hang")
        outcomes: list[object] = []

        async def one(text: str) -> None:
            try:
                outcomes.append(await tokenize(send, text))
            except ActorFailed as exc:
                outcomes.append(exc)

        async with trio.open_nursery() as clients:
            clients.start_soon(one, "held by the hung worker")
            await trio.sleep(0.05)
            faults.arm("tokenizer.message", "raise")  # the other worker fails on its next message
            clients.start_soon(one, "fails the actor")
        # Both were in the actor when it failed: both got an answer (an error), none hangs.
        assert len(outcomes) == 2 and all(isinstance(o, ActorFailed) for o in outcomes)
        faults.clear()
        with trio.fail_after(5):
            assert await tokenize(send, "ab cde") == [2, 3]
        assert supervisor.num_restarts == 1
        supervisor.request_shutdown()


def record(i: int) -> UsageRecord:
    return UsageRecord(request_id=f"r{i}", tenant="t", model="m", endpoint="chat", created=1.0 + i)


async def test_no_usage_record_is_lost_when_the_metering_actor_fails(tmp_path):
    path = str(tmp_path / "usage.sqlite")
    metering = MeteringActor(path)
    supervisor = Supervisor([], sinks=[metering])
    async with trio.open_nursery() as nursery:
        await start(supervisor, nursery)
        faults.arm("metering.write", "raise", times=2)
        for i in range(20):
            metering.sink.admit()
            metering.sink.send(record(i))
            await trio.lowlevel.checkpoint()
        with trio.fail_after(10):
            while metering.num_written < 20:
                await trio.sleep(0.01)
        assert supervisor.num_restarts == 2
        supervisor.request_shutdown()
    ledger = Ledger(path)
    try:
        assert ledger.totals()[0].requests == 20
    finally:
        ledger.close()


async def test_ready_only_after_start_and_not_while_draining():
    flaky = Flaky(fail_times=0)
    supervisor = Supervisor([flaky])
    assert not supervisor.health.latest.ready  # nothing started yet
    async with trio.open_nursery() as nursery:
        await start(supervisor, nursery)
        await trio.sleep(0.01)
        assert supervisor.health.latest.ready
        supervisor.request_shutdown()
        supervisor._publish_health()
        assert not supervisor.health.latest.ready and supervisor.health.latest.live


async def test_sighup_runs_the_hangup_callback_and_a_failing_one_keeps_the_server_up():
    calls = []

    async def on_hangup() -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            raise RuntimeError("a bad reload")

    flaky = Flaky(fail_times=0)
    supervisor = Supervisor([flaky], on_hangup=on_hangup)
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: supervisor.run(handle_signals=True, task_status=task_status))
        for expected in (1, 2):
            os.kill(os.getpid(), signal.SIGHUP)
            with trio.fail_after(5):
                while len(calls) < expected:
                    await trio.sleep(0.01)
        assert not supervisor.draining.is_set() and supervisor.exit_code == 0
        supervisor.request_shutdown()
    assert calls == [0, 1]
