"""``shared.infra.background.Background``: fire-and-forget tasks that are kept, drained at shutdown,
and whose failures are reported rather than lost."""

from __future__ import annotations

import asyncio
import gc
import logging
from typing import Any

import pytest

from shared.infra.background import Background


class _LoopErrors:
    """What the running loop's exception handler is told (e.g. "Task exception was never
    retrieved"), for the duration of a test."""

    def __init__(self) -> None:
        self.contexts: list[dict[str, Any]] = []
        self._loop = asyncio.get_running_loop()
        self._previous = self._loop.get_exception_handler()

    def __enter__(self) -> _LoopErrors:
        self._loop.set_exception_handler(lambda _loop, context: self.contexts.append(context))
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.set_exception_handler(self._previous)


async def test_a_spawned_task_runs_to_completion_before_drain_returns() -> None:
    """Drain waits for the work spawned before it."""
    done: list[str] = []

    async def work() -> None:
        await asyncio.sleep(0.02)
        done.append("written")

    background = Background()
    background.spawn(work())
    assert done == []

    await background.drain(timeout=1)

    assert done == ["written"]


async def test_a_failing_task_is_logged_and_its_exception_is_consumed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A failure is reported once as a warning naming the error, and never surfaces again
    as an unretrieved task exception when the task is collected."""

    async def fail() -> None:
        raise ValueError("cassandra said no")

    background = Background()
    with _LoopErrors() as loop_errors, caplog.at_level(logging.WARNING, "shared.infra.background"):
        background.spawn(fail())
        await background.drain(timeout=1)
        await asyncio.sleep(0)  # the done callback runs on the next loop iteration
        gc.collect()

    assert [r.getMessage() for r in caplog.records] == ["background task failed: cassandra said no"]
    assert loop_errors.contexts == []


async def test_a_cancelled_task_is_not_reported_as_a_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Cancellation at shutdown is not an error worth a warning."""

    async def cancelled() -> None:
        await asyncio.sleep(0)
        raise asyncio.CancelledError  # as a task cancelled while it waits ends

    background = Background()
    with _LoopErrors() as loop_errors, caplog.at_level(logging.WARNING, "shared.infra.background"):
        background.spawn(cancelled())
        await background.drain(timeout=1)
        await asyncio.sleep(0)

    assert caplog.records == []
    assert loop_errors.contexts == []  # nor did the done callback itself fail


async def test_one_failing_task_does_not_stop_the_others() -> None:
    """Tasks are independent: a failure of one leaves the rest to finish."""
    done: list[int] = []

    async def work(n: int) -> None:
        await asyncio.sleep(0.01 * n)
        if n == 1:
            raise RuntimeError("boom")
        done.append(n)

    background = Background()
    for n in range(4):
        background.spawn(work(n))
    await background.drain(timeout=1)

    assert sorted(done) == [0, 2, 3]


async def test_drain_with_nothing_spawned_returns_at_once() -> None:
    """Nothing to wait for: drain returns without waiting out its timeout (an hour here, so
    waiting would fail by the suite's per-test timeout)."""
    await Background().drain(timeout=3600)


async def test_drain_gives_up_after_its_timeout_and_leaves_the_task_running() -> None:
    """A stuck task does not hold shutdown beyond the timeout, and is not cancelled by it."""
    release = asyncio.Event()
    done: list[str] = []

    async def stuck() -> None:
        await release.wait()
        done.append("finished")

    background = Background()
    background.spawn(stuck())

    await background.drain(timeout=0.05)

    assert done == []
    release.set()
    await background.drain(timeout=1)  # it was still alive: it finishes now
    assert done == ["finished"]


async def test_cancel_ends_every_task_still_running_before_it_returns() -> None:
    """Cancelled at shutdown, each task still running has ended (cancelled) when cancel
    returns, and none is left held; a task that finished meanwhile is not disturbed."""
    background = Background()
    finished: list[str] = []

    async def forever() -> None:
        await asyncio.sleep(3600)

    async def quick() -> None:
        finished.append("quick")

    background.spawn(forever())
    background.spawn(forever())
    background.spawn(quick())
    await asyncio.sleep(0)
    running = {task for task in background._tasks if not task.done()}

    await background.cancel()

    assert len(running) == 2
    assert all(task.cancelled() for task in running)
    assert (len(background), finished) == (0, ["quick"])
