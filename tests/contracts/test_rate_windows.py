"""The request rate limits' store contract, asserted identically of the twin and of the real
store on Cassandra: a window's counter adds every process's slots and reads the total back,
and limiters leasing one key's slots at once never admit more than the burst."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from shared.accounts import ratelimit
from shared.accounts.ratelimit import RateLimiter, RatePolicy, RateWindows
from shared.infra.db import Database
from tests.conftest import unique
from tests.contracts.conftest import IMPLEMENTATIONS
from tests.fakes.accounts import FakeRateWindows
from tests.fakes.cassandra import FakeCassandra


@pytest.fixture(params=IMPLEMENTATIONS)
def windows(request: pytest.FixtureRequest) -> Any:
    if request.param == "fake":
        return FakeRateWindows(FakeCassandra())
    db: Database = request.getfixturevalue("db")
    return RateWindows(db)


async def test_a_window_counts_every_take_and_reads_the_total_back(windows: Any) -> None:
    """Each take adds its slots to its own window and reads that window's total after."""
    key, index = unique("rk"), time.time_ns() // 1_000_000 // 2000
    day = ratelimit.window_day(index, 2000)

    totals = [await windows.take(key, day, index, n) for n in (3, 2)]
    other = await windows.take(key, day, index + 1, 4)

    assert (totals, other) == ([3, 5], 4)


async def test_three_limiters_leasing_at_once_never_pass_the_burst(windows: Any) -> None:
    """Three processes' limiters serving one key with four clients each admit at most the
    burst in a window, short of it by at most two leases per process (the one spent and one
    taken ahead of need)."""
    key, policy = unique("rk"), RatePolicy(per_second=20, burst=40)
    limiters = [RateLimiter(windows, policy) for _ in range(3)]
    now_ms = time.time_ns() // 1_000_000

    async def admitted(limiter: RateLimiter) -> int:
        return sum([(await limiter.hit(key, now_ms=now_ms)).allowed for _ in range(20)])

    total = sum(await asyncio.gather(*(admitted(lim) for lim in limiters for _ in range(4))))
    for limiter in limiters:
        await limiter.close()
    index = ratelimit.window_index(now_ms, policy.window_ms)
    day = ratelimit.window_day(index, policy.window_ms)
    counted = await windows.take(key, day, index, 1) - 1

    assert policy.burst - 3 * 2 * (1 + (policy.burst - 1) // 4) <= total <= policy.burst
    assert counted >= total
