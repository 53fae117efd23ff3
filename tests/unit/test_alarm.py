"""A loop waiting on its alarm (``shared.infra.leases.Alarm``) ends when cancelled, whenever its
nudge comes: a cancellation arriving as a nudge ends the wait used to be swallowed, and the
process's shutdown then waited on that loop forever."""

from __future__ import annotations

import asyncio

import pytest

from shared.infra.config import ProviderSettings
from shared.infra.leases import Alarm
from shared.ops.livesettings import LiveSettings, Watcher


async def _ends_when_cancelled(task: asyncio.Task[None], nudge: object, turns: int) -> bool:
    """Nudge (``nudge()``), let ``turns`` turns of the loop pass, cancel: whether it ended."""
    await asyncio.sleep(0)
    nudge()  # type: ignore[operator]
    for _ in range(turns):
        await asyncio.sleep(0)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=1.0)
    task.cancel()
    return bool(done) and task.cancelled()


@pytest.mark.parametrize("turns", [0, 1, 2, 3])
async def test_a_loop_waiting_on_its_alarm_ends_when_cancelled_as_it_is_nudged(
    turns: int,
) -> None:
    """Cancelled in any turn of the loop around its nudge, the waiting loop ends."""
    alarm = Alarm()

    async def loop() -> None:
        while True:
            await alarm.wait(60)

    assert await _ends_when_cancelled(asyncio.create_task(loop()), alarm.nudge, turns)


async def test_a_nudge_ends_the_wait_and_is_consumed() -> None:
    """The wait returns True at once on a nudge, and the next wait times out (False)."""
    alarm = Alarm()
    alarm.nudge()

    assert (await alarm.wait(60), await alarm.wait(0.01)) == (True, False)


class _Stored:
    async def stored(self) -> dict[str, object]:
        return {}


@pytest.mark.parametrize("turns", [0, 1, 2, 3])
async def test_the_settings_watcher_ends_when_cancelled_as_a_change_is_announced(
    turns: int,
) -> None:
    """The live-settings watcher, told of a change as its process stops, still stops."""

    async def apply(live: LiveSettings) -> None:
        return None

    watcher = Watcher(_Stored(), ProviderSettings(), apply)  # type: ignore[arg-type]

    assert await _ends_when_cancelled(asyncio.create_task(watcher.run()), watcher.nudge, turns)
