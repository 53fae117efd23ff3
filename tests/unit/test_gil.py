"""A service process hands the GIL to a waiting thread (its event loop) within a fraction of
a millisecond, not CPython's 5 ms, and runs its long pure-Python work on one thread, in
order, off the loop (``shared.infra.gil``)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import sys
import threading
from collections.abc import Iterator

import pytest

from shared.infra.gil import SWITCH_INTERVAL, CpuLane, shorten_switch_interval
from tests.unit.loop_turns import MANY, turns_during

WHO: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")


@pytest.fixture
def interval_restored() -> Iterator[None]:
    saved = sys.getswitchinterval()
    yield
    sys.setswitchinterval(saved)


@pytest.mark.usefixtures("interval_restored")
def test_a_service_process_switches_threads_at_least_ten_times_as_often() -> None:
    """After the entry point's call, the interval is at most a tenth of CPython's default."""
    shorten_switch_interval()

    assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL)
    assert sys.getswitchinterval() <= 0.005 / 10


async def test_work_given_to_the_lane_runs_one_at_a_time_in_the_order_given() -> None:
    """The second piece of work starts only once the first has finished."""
    cpu = CpuLane()
    first_started, first_may_end = threading.Event(), threading.Event()
    seen: list[str] = []

    def work(name: str) -> str:
        seen.append(f"{name} starts")
        if name == "first":
            first_started.set()
            first_may_end.wait(timeout=30)
        seen.append(f"{name} ends")
        return name

    first = asyncio.ensure_future(cpu.run(work, "first"))
    second = asyncio.ensure_future(cpu.run(work, "second"))
    await asyncio.to_thread(first_started.wait, 30)
    await asyncio.sleep(0.05)  # room for a second thread, were there one, to start "second"
    first_may_end.set()

    assert list(await asyncio.gather(first, second)) == ["first", "second"]
    assert seen == ["first starts", "first ends", "second starts", "second ends"]
    await cpu.aclose()


@pytest.mark.offloop
async def test_the_loop_keeps_turning_while_the_lane_works() -> None:
    """CPU work on the lane leaves the event loop free to run other tasks."""
    cpu = CpuLane()

    total, turns = await turns_during(cpu.run(_count_to, 1_000_000))

    assert total == 1_000_000
    assert turns >= MANY
    await cpu.aclose()


def _count_to(n: int) -> int:
    """Pure Python (a C call such as ``sum`` keeps the GIL to its end)."""
    count = 0
    for _ in range(n):
        count += 1
    return count


async def test_work_on_the_lane_sees_its_callers_context() -> None:
    """Context variables (the log fields bound for a request) reach the work."""
    cpu = CpuLane()
    WHO.set("the caller")

    assert await cpu.run(WHO.get) == "the caller"
    await cpu.aclose()


async def test_work_cancelled_before_its_turn_never_runs() -> None:
    """A request gone while its work waited behind another's gives the lane nothing to do."""
    cpu = CpuLane()
    release = threading.Event()
    ran: list[str] = []
    busy = asyncio.ensure_future(cpu.run(release.wait, 30))
    waiting = asyncio.ensure_future(cpu.run(ran.append, "cancelled work"))
    await asyncio.sleep(0)

    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting
    release.set()
    await busy
    await cpu.run(ran.append, "later work")

    assert ran == ["later work"]
    await cpu.aclose()
