"""How a loop woken by its writers waits (``shared.infra.leases.Linger``, the outbox relay's, the
stats roll-up's and the health refresh's): busy passes while it has work or a wake-up is
recent, idle waits otherwise; a wake-up ends an idle wait at once and never a busy one."""

from __future__ import annotations

import asyncio

from shared.infra.leases import Linger, next_period
from tests.fakes.clocks import Ticks


async def _woken_while_waiting(linger: Linger, *, busy: bool) -> bool:
    """Start a wait, hear a wake-up as it waits: whether the wake-up ended it."""
    waiting = asyncio.create_task(linger.wait(busy=busy))
    await asyncio.sleep(0)  # the wait has begun
    linger.stay_awake(30)
    done, _ = await asyncio.wait({waiting}, timeout=5.0)
    waiting.cancel()
    return bool(done) and waiting.result()


def test_the_period_is_busy_while_there_is_work_or_a_wake_up_is_recent() -> None:
    """Work or a deadline not yet passed: the busy period; neither: the idle one (pure)."""
    periods = {"busy_every": 2.0, "idle_every": 60.0}

    assert next_period(10.0, 0.0, busy=True, **periods) == 2.0
    assert next_period(10.0, 11.0, busy=False, **periods) == 2.0
    assert next_period(10.0, 10.0, busy=False, **periods) == 60.0


def test_an_idle_period_is_never_shorter_than_the_busy_one() -> None:
    """With an idle period below the busy one (a slow relay interval), idle waits the busy
    period (pure)."""
    assert next_period(10.0, 0.0, busy=False, busy_every=45.0, idle_every=30.0) == 45.0


async def test_a_wake_up_during_an_idle_wait_ends_it() -> None:
    """A loop waiting idle (60 s) passes at once when a wake-up is heard."""
    linger = Linger(busy_every=0.05, idle_every=60.0, clock=Ticks())

    assert await _woken_while_waiting(linger, busy=False)


async def test_a_wake_up_during_a_busy_wait_does_not_cut_it_short() -> None:
    """A loop waiting its busy period hears a wake-up and still waits the period out."""
    linger = Linger(busy_every=0.05, idle_every=60.0, clock=Ticks())

    assert not await _woken_while_waiting(linger, busy=True)


async def test_a_wake_up_between_waits_leaves_the_next_idle_wait_alone() -> None:
    """A wake-up heard while the loop is not waiting idle rings nothing: the loop's next wait
    is busy (the wake-up made it so) and runs its full period."""
    ticks = Ticks()
    linger = Linger(busy_every=0.01, idle_every=60.0, clock=ticks)
    linger.stay_awake(30)

    assert (linger.next_in(busy=False), await linger.wait(busy=False)) == (0.01, False)


def test_a_wake_up_only_moves_the_deadline_forward() -> None:
    """A short linger heard after a long one leaves the long one's deadline standing."""
    ticks = Ticks()
    linger = Linger(busy_every=2.0, idle_every=60.0, clock=ticks)

    linger.stay_awake(40)
    ticks.now += 5
    linger.stay_awake(10)

    assert linger.awake_until == 1040.0
