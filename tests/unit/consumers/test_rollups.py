"""The stats roll-up loop (``services.consumers.rollups``) over the World's twins: idle, it
reads nothing until a writer's wake-up; a writer wakes it once per ROLL_EVERY however much it
writes; woken, it rolls the changed buckets up and keeps passing while marks remain or a
wake-up is recent; a lost wake-up costs IDLE_EVERY, never the work."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import date

from services.consumers.rollups import IDLE_EVERY, LINGER, PASS_EVERY, RollUp, next_wait
from shared.delivery.stats import Mark, tell_rollups
from shared.infra.leases import SCHEDULER_WAKE, wake
from tests.fakes.clocks import Ticks
from tests.fakes.world import World


def _roll_up(world: World, ticks: Ticks) -> RollUp:
    return RollUp(world.stats, clock=ticks, now=world.clock)


def _reads(world: World) -> Callable[[], int]:
    """How many times the twin was asked for marks so far."""
    asked = [0]
    marks = world.stats.marks

    async def counted(marked_on: date, shard: int) -> list[Mark]:
        asked[0] += 1
        return await marks(marked_on, shard)

    # The twin's own method, counted: a method replaced on one instance, on purpose.
    world.stats.marks = counted  # type: ignore[method-assign]
    return lambda: asked[0]


async def _spin() -> None:
    for _ in range(30):
        await asyncio.sleep(0)


def test_the_wait_is_short_only_while_there_is_work() -> None:
    """Marks found or a recent wake-up: PASS_EVERY; neither: IDLE_EVERY (pure)."""
    assert next_wait(10.0, 0.0, 3) == PASS_EVERY
    assert next_wait(10.0, 11.0, 0) == PASS_EVERY
    assert next_wait(10.0, 10.0, 0) == IDLE_EVERY


async def test_an_idle_roll_up_reads_nothing_until_a_writer_wakes_it() -> None:
    """With nothing marked and no wake-up for LINGER, the loop waits IDLE_EVERY; a batch
    stored by a told writer wakes it at once, and that pass rolls its bucket up."""
    world, ticks = World(), Ticks()
    roll_up = _roll_up(world, ticks)
    await world.broker.listen(roll_up.heard)
    tell_rollups(world.stats, world.broker)
    reads = _reads(world)
    ticks.now += LINGER
    loop = asyncio.create_task(roll_up.run())
    await _spin()
    idle_reads = reads()

    await world.accept("a@example.org")
    await _spin()
    loop.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await loop

    assert idle_reads > 0 and roll_up.next_in() == PASS_EVERY
    assert reads() == 2 * idle_reads  # one pass more, the woken one
    assert world.stats.marks_seen == 1


async def test_a_writer_wakes_the_roll_ups_once_per_pass_period() -> None:
    """A writer's many marks within ROLL_EVERY send one wake-up, not one per write."""
    world = World()
    heard: list[bytes] = []
    await world.broker.listen(heard.append)
    tell_rollups(world.stats, world.broker)

    for n in range(5):
        await world.accept(f"r{n}@example.org")
    await _spin()

    assert heard == [b'{"wake":"stats"}']


async def test_a_woken_roll_up_keeps_passing_while_marks_remain_then_idles() -> None:
    """After a wake-up the passes stay PASS_EVERY apart for LINGER, and for as long as a pass
    finds marks; once neither holds the wait is IDLE_EVERY again."""
    world, ticks = World(), Ticks()
    roll_up = _roll_up(world, ticks)
    ticks.now += LINGER
    await roll_up.pass_once()
    idle = roll_up.next_in()

    roll_up.heard(b'{"wake":"stats"}')
    woken = roll_up.next_in()
    await world.accept("a@example.org")
    ticks.now += LINGER
    await roll_up.pass_once()
    marked = roll_up.next_in()
    world.stats.db.stat_dirty.clear()  # every bucket current: the marks dropped
    await roll_up.pass_once()

    assert (idle, woken, marked, roll_up.next_in()) == (
        IDLE_EVERY,
        PASS_EVERY,
        PASS_EVERY,
        IDLE_EVERY,
    )


async def test_a_wake_up_during_a_busy_wait_does_not_add_a_pass() -> None:
    """While passes come PASS_EVERY apart a wake-up only extends them; another loop's wake-up
    or a settings change leaves the roll-up alone."""
    world, ticks = World(), Ticks()
    roll_up = _roll_up(world, ticks)

    roll_up.heard(b'{"wake":"stats"}')
    busy = await roll_up.linger.alarm.wait(0)
    roll_up.linger.idle = True
    await wake(world.broker, SCHEDULER_WAKE)
    roll_up.heard(b'{"wake":"scheduler"}')
    roll_up.heard(b'{"changed": ["providers.chain"]}')
    other = await roll_up.linger.alarm.wait(0)
    roll_up.heard(b'{"wake":"stats"}')
    idle = await roll_up.linger.alarm.wait(0)

    assert (busy, other, idle) == (False, False, True)
