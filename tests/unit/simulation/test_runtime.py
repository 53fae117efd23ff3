"""The simulated runtime: virtual time, seeded randomness, inline threads, deadlocks."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime

import pytest

from simulation.runtime import EPOCH, Deadlock, VirtualClock, simulate


def test_an_hour_of_sleeping_takes_no_time_and_wall_time_follows_it() -> None:
    """``asyncio.sleep(3600)`` returns at once, and ``datetime.now()`` moved an hour."""

    async def main(clock: VirtualClock) -> tuple[float, datetime]:
        await asyncio.sleep(3600)
        return clock.elapsed, datetime.now(UTC)

    started = time.monotonic()
    elapsed, now = simulate(main, seed=1)

    assert time.monotonic() - started < 5
    assert elapsed == 3600
    assert (now - EPOCH).total_seconds() == 3600


def test_the_same_seed_draws_the_same_randomness_and_another_seed_other() -> None:
    async def main(clock: VirtualClock) -> tuple[uuid.UUID, float]:
        return uuid.uuid4(), time.time()

    assert simulate(main, seed=7) == simulate(main, seed=7)
    assert simulate(main, seed=7)[0] != simulate(main, seed=8)[0]


def test_work_sent_to_a_thread_runs_inline() -> None:
    async def main(clock: VirtualClock) -> int:
        return await asyncio.to_thread(sum, [1, 2, 3])

    assert simulate(main, seed=1) == 6


def test_a_run_where_everything_waits_for_ever_is_a_deadlock() -> None:
    async def main(clock: VirtualClock) -> None:
        await asyncio.Event().wait()

    with pytest.raises(Deadlock):
        simulate(main, seed=1)


def test_a_skewed_caller_reads_its_own_wall_time() -> None:
    """The skew function is read at each call: a process's clock can run ahead."""
    ahead = [0.0]

    async def main(clock: VirtualClock) -> float:
        before = time.time()
        ahead[0] = 30.0
        return time.time() - before

    assert simulate(main, seed=1, skew=lambda: ahead[0]) == 30.0
