"""StepThread: every call on one thread, in order; results and exceptions come back; trio callers
are not cancelled out of a running call."""

from __future__ import annotations

import threading
import time

import pytest
import trio

from trillium.engine.step_thread import StepThread


@pytest.fixture
def step_thread():
    thread = StepThread("test-step")
    yield thread
    thread.close()


def test_calls_run_in_order_on_one_thread(step_thread):
    seen: list[tuple[int, int]] = []
    for i in range(5):
        step_thread.call(lambda i=i: seen.append((i, threading.get_ident())))
    assert [i for i, _ in seen] == list(range(5))
    assert {ident for _, ident in seen} == {step_thread.ident}
    assert step_thread.ident != threading.get_ident()


def test_call_returns_the_result_and_raises_the_exception(step_thread):
    assert step_thread.call(lambda a, b: a + b, 2, 3) == 5
    with pytest.raises(ZeroDivisionError):
        step_thread.call(lambda: 1 / 0)
    assert step_thread.call(lambda: "still running") == "still running"


def test_nested_call_runs_inline(step_thread):
    assert step_thread.call(lambda: step_thread.call(threading.get_ident)) == step_thread.ident


def test_trio_run_is_not_abandoned_on_cancel(step_thread):
    finished = threading.Event()

    def slow() -> str:
        time.sleep(0.2)
        finished.set()
        return "done"

    async def main() -> tuple[str | None, bool]:
        result = None
        with trio.move_on_after(0.01):
            result = await step_thread.run(slow)
        # The shielded wait returned only once the call was over: its result is delivered.
        return result, finished.is_set()

    assert trio.run(main) == ("done", True)


def test_trio_run_reraises(step_thread):
    async def main() -> None:
        await step_thread.run(lambda: [][1])

    with pytest.raises(IndexError):
        trio.run(main)


def test_close_finishes_queued_work_then_refuses_more():
    thread = StepThread()
    out: list[int] = []
    thread.call(out.append, 1)
    thread.close()
    assert out == [1]
    with pytest.raises(RuntimeError, match="closed"):
        thread.call(out.append, 2)
