"""The provider-health refresh of a consumer (``services.consumers.live``) over the twins:
idle, it reads every provider's windows once per IDLE_REFRESH_EVERY (not every
REFRESH_EVERY); another process's write wakes it at once, and so does this process's own
first call; a write whose wake-up was lost is read within IDLE_REFRESH_EVERY; while health
may move it refreshes every REFRESH_EVERY, as it always did."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime

from services.consumers.live import (
    IDLE_REFRESH_EVERY,
    LINGER,
    ConsumerSettings,
    moving,
    next_refresh,
)
from shared.ops.livesettings import LiveSettings
from shared.providers.provider_health import (
    REFRESH_EVERY,
    CircuitState,
    Window,
    tell_refreshers,
    window_start,
)
from tests.fakes.clocks import Ticks
from tests.fakes.providers import FakeHealth, HealthTables
from tests.fakes.wire import Kind, Loopback, Trip
from tests.fakes.world import World
from tests.unit.consumers.settings_applier import consumer_settings

# FakeHealth stands in for the concrete HealthStore the applier takes (no Protocol for it yet):
# hence the arg-type ignores where one is passed.
NOON = datetime(2026, 3, 4, 12, 0, tzinfo=UTC)


class Logged(Loopback):
    """A loopback wire that keeps the op log: every round trip's name, in order."""

    def __init__(self) -> None:
        self.ops: list[str] = []

    async def trip(self, op: str, kind: Kind) -> Trip:
        self.ops.append(op)
        return await super().trip(op, kind)


async def _applier(w: World, ticks: Ticks) -> ConsumerSettings:
    started = consumer_settings(w, clock=ticks)
    await started(LiveSettings(chain=("sg", "mg")))
    return started


async def _spin() -> None:
    for _ in range(30):
        await asyncio.sleep(0)


async def _failures(store: FakeHealth, at: datetime) -> None:
    """Another process's calls to SendGrid: every one failed."""
    await store.add("sg", window_start(at), 20, 20, 2000)


def test_the_wait_is_short_only_while_health_may_move() -> None:
    """Health that may move or a recent wake-up: REFRESH_EVERY; neither: IDLE_REFRESH_EVERY."""
    assert next_refresh(10.0, 0.0, moving=True) == REFRESH_EVERY
    assert next_refresh(10.0, 11.0, moving=False) == REFRESH_EVERY
    assert next_refresh(10.0, 10.0, moving=False) == IDLE_REFRESH_EVERY


def test_health_may_move_while_calls_reports_or_an_open_circuit_remain() -> None:
    """Calls not shared, a window with calls or reports, or a circuit not closed: moving."""
    empty = Window(NOON, 0, 0, 0)
    assert not moving({"sg": [empty], "mg": []}, {"sg": "closed"}, False)
    assert moving({}, {}, True)
    assert moving({"sg": [Window(NOON, 1, 0, 5)]}, {}, False)
    assert moving({"sg": [Window(NOON, 0, 0, 0, events=3)]}, {}, False)
    assert moving({}, {"sg": "half_open"}, False)


async def test_an_idle_hour_reads_the_windows_once_a_minute_per_provider() -> None:
    """With no mail, the loop's schedule over a simulated hour reads each of the two
    providers' windows 60 times (120 reads; at REFRESH_EVERY it was 3,600), and a write
    whose wake-up was lost is still read within IDLE_REFRESH_EVERY."""
    w, ticks, wire = World(), Ticks(), Logged()
    w.clock.now = NOON
    applier = await _applier(w, ticks)
    store = FakeHealth("ns", HealthTables(wire=wire))
    ticks.now += LINGER  # past the start's linger
    elapsed, waits = 0.0, []
    while elapsed < 3600:
        await applier.refresh_health(store)
        wait = applier.next_refresh_in()
        waits.append(wait)
        elapsed += wait
        ticks.now += wait
        w.clock.advance(wait)
    idle_ops = list(wire.ops)

    untold = FakeHealth("ns", store.tables)  # its writer could not wake anyone
    await _failures(untold, w.clock())
    w.clock.advance(IDLE_REFRESH_EVERY - 1)
    await applier.refresh_health(store)

    assert set(waits) == {IDLE_REFRESH_EVERY}
    assert (idle_ops.count("health.windows"), len(idle_ops)) == (120, 120)
    assert applier.circuits["sg"] == "open"
    assert applier.next_refresh_in() == REFRESH_EVERY  # the failures move health now


async def test_another_processs_write_wakes_an_idle_loop_at_once() -> None:
    """An idle loop hears a writer's wake-up and reads the windows at once: another process's
    failures open SendGrid's circuit here without waiting IDLE_REFRESH_EVERY."""
    w, ticks = World(), Ticks()
    applier = await _applier(w, ticks)
    await w.broker.listen(applier.heard)
    tables = HealthTables(wire=Logged())
    loop = asyncio.create_task(applier.keep_health(FakeHealth("ns", tables)))
    await _spin()
    ticks.now += LINGER
    applier.linger.alarm.nudge()  # end the start's short wait: from here on it is idle
    await _spin()
    idle = applier.next_refresh_in()

    other = tell_refreshers(FakeHealth("ns", tables), w.broker)
    await _failures(other, w.clock())
    await _spin()
    loop.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await loop

    assert idle == IDLE_REFRESH_EVERY
    assert applier.circuits["sg"] == "open" and applier.running().chain[0] == "mg"
    assert tables.circuits[("ns", "sg")].state == "open"


async def test_this_processs_first_call_wakes_its_idle_loop() -> None:
    """A call counted while the loop is idle is shared at once, and the refreshes come every
    REFRESH_EVERY from then on."""
    w, ticks = World(), Ticks()
    applier = await _applier(w, ticks)
    tables = HealthTables()
    loop = asyncio.create_task(applier.keep_health(FakeHealth("ns", tables)))
    await _spin()
    ticks.now += LINGER
    applier.linger.alarm.nudge()
    await _spin()
    idle = applier.next_refresh_in()

    w.dispatcher.tally.count("sg", w.clock(), error=False, seconds=0.2)
    await _spin()
    loop.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await loop

    assert idle == IDLE_REFRESH_EVERY
    assert [c[0] for c in tables.windows.values()] == [1]
    assert applier.next_refresh_in() == REFRESH_EVERY


async def test_a_circuit_left_open_keeps_the_refreshes_coming() -> None:
    """A circuit found open at start (its cool-down is timed) is refreshed every
    REFRESH_EVERY until it closes, then the loop idles."""
    w, ticks = World(), Ticks()
    applier = await _applier(w, ticks)
    store = FakeHealth("ns")
    store.tables.circuits[("ns", "sg")] = CircuitState("open", w.clock())
    applier._circuit_states.update(await store.circuits())
    ticks.now += LINGER
    await applier.refresh_health(store)
    while_open = applier.next_refresh_in()
    w.clock.advance(31)
    await applier.refresh_health(store)  # cooled down: half open
    await applier.refresh_health(store)  # healthy: closed

    assert (while_open, applier.circuits["sg"]) == (REFRESH_EVERY, "closed")
    assert applier.next_refresh_in() == IDLE_REFRESH_EVERY
