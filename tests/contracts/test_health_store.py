"""The provider-health store's contract, asserted identically of the in-memory twin
(``tests/fakes/providers.py``) and of the real store on Cassandra: the windows add up
across writers and read back for the last two minutes only, every add is announced before it
is made, and circuits read back as they were last set."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest

from shared.infra.db import Database
from shared.providers.provider_health import (
    WINDOW,
    WINDOWS,
    CircuitState,
    HealthStore,
    Window,
    window_start,
)
from tests.contracts.conftest import IMPLEMENTATIONS
from tests.fakes.cassandra import ms
from tests.fakes.providers import FakeHealth


@dataclass
class Side:
    store: Any


@pytest.fixture(params=IMPLEMENTATIONS)
def side(request: pytest.FixtureRequest) -> Side:
    scope = f"t-{uuid.uuid4().hex[:8]}"
    if request.param == "fake":
        return Side(FakeHealth(scope))
    db: Database = request.getfixturevalue("db")
    return Side(HealthStore(db, scope))


NOW = datetime(2026, 3, 4, 12, 0, 7, tzinfo=UTC)


async def test_windows_add_up_across_writes(side: Side) -> None:
    """Calls and reports added to one window by several writes read back as their sums."""
    start = window_start(NOW)
    await side.store.add("sg", start, 3, 1, 900)
    await side.store.add("sg", start, 2, 0, 100)
    await side.store.add_reported("sg", start, 10, 2, 1)

    assert await side.store.windows("sg", NOW) == [Window(start, 5, 1, 1000, 10, 2, 1)]
    assert await side.store.windows("mg", NOW) == []


async def test_only_the_last_two_minutes_are_read_across_midnight(side: Side) -> None:
    """A read just after midnight finds the windows of both days' last two minutes, and none
    older."""
    now = datetime(2026, 3, 5, 0, 0, 30, tzinfo=UTC)
    since = window_start(now) - timedelta(seconds=WINDOW * WINDOWS)
    inside = [since + timedelta(seconds=WINDOW), window_start(now)]
    for start in [since, *inside]:
        await side.store.add("sg", start, 1, 0, 10)

    found = await side.store.windows("sg", now)

    assert [w.start for w in found] == inside
    assert {w.start.date() for w in found} == {date(2026, 3, 4), date(2026, 3, 5)}


async def test_every_add_is_announced(side: Side) -> None:
    """``written`` is called once per add, as the add is made (not once it has landed)."""
    seen: list[str] = []
    start = window_start(NOW)
    side.store.written = lambda: seen.append("written")

    adding = side.store.add("sg", start, 1, 0, 10)
    reporting = side.store.add_reported("sg", start, 1, 0, 0)
    await adding
    await reporting

    assert seen == ["written", "written"]


async def test_circuits_read_back_as_last_set(side: Side) -> None:
    """The last state set for each provider is what a process reads at start."""
    since = ms(NOW)
    await side.store.set_circuit("sg", CircuitState("open", since), 0.3)
    await side.store.set_circuit("sg", CircuitState("half_open", since), 0.6)
    await side.store.set_circuit("mg", CircuitState("closed", since), 1.0)

    assert await side.store.circuits() == {
        "sg": CircuitState("half_open", since),
        "mg": CircuitState("closed", since),
    }


async def test_a_forgotten_day_reads_empty(side: Side) -> None:
    """``forget`` drops a provider's windows of that day only."""
    start = window_start(NOW)
    await side.store.add("sg", start, 1, 0, 10)
    await side.store.add("mg", start, 1, 0, 10)

    await side.store.forget("sg", NOW.date())

    assert await side.store.windows("sg", NOW) == []
    assert len(await side.store.windows("mg", NOW)) == 1
