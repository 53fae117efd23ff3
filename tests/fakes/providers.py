"""Twin of the store of :mod:`shared.providers`: the providers' health windows.

In-memory twin of :class:`shared.providers.provider_health.HealthStore`: the shared health
windows (counters by provider, day and 5-second window) and the circuits, for one scope.

It keeps what the health refresh depends on: one round trip per day partition a read of the
windows covers (two around midnight), the last two minutes only, counters that add up
across writers, ``written`` called before each add (the wake-up of the refresh loops), and
circuits read back as they were last set. ``tests/contracts/test_health_store.py`` runs one
suite over this twin and the real store.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta

from shared.providers.provider_health import (
    WINDOW,
    WINDOWS,
    CircuitState,
    HealthWindows,
    Window,
    window_start,
)
from tests.fakes.wire import LOOPBACK, Wire, round_trip


def _nothing() -> None:
    return None


@dataclass
class HealthTables:
    """``provider_windows`` and ``provider_circuits``, shared by the twins of one keyspace."""

    windows: dict[tuple[str, str, date, datetime], list[int]] = field(default_factory=dict)
    """(scope, provider, day, window) -> calls, errors, latency_ms, events, drops, deferrals."""
    circuits: dict[tuple[str, str], CircuitState] = field(default_factory=dict)
    wire: Wire = LOOPBACK
    """How each round trip travels (``tests.fakes.wire``)."""


class FakeHealth(HealthWindows):
    """Twin of :class:`shared.providers.provider_health.HealthStore`."""

    def __init__(self, scope: str, tables: HealthTables | None = None) -> None:
        self.scope = scope
        self.tables = tables or HealthTables()
        self.written: Callable[[], None] = _nothing

    @property
    def wire(self) -> Wire:
        return self.tables.wire

    def _add(self, provider: str, start: datetime, at: int, values: tuple[int, ...]) -> None:
        key = (self.scope, provider, start.date(), start)
        counters = self.tables.windows.setdefault(key, [0] * 6)
        for i, value in enumerate(values):
            counters[at + i] += value

    async def add(self, provider: str, start: datetime, calls: int, errors: int, ms: int) -> None:
        self.written()
        await self._added(provider, start, 0, (calls, errors, ms))

    async def add_reported(
        self, provider: str, start: datetime, events: int, drops: int, deferrals: int
    ) -> None:
        self.written()
        await self._added(provider, start, 3, (events, drops, deferrals))

    @round_trip("health.add", "write")
    async def _added(
        self, provider: str, start: datetime, at: int, values: tuple[int, ...]
    ) -> None:
        self._add(provider, start, at, values)

    async def windows(self, provider: str, now: datetime) -> list[Window]:
        since = window_start(now) - timedelta(seconds=WINDOW * WINDOWS)
        found: list[Window] = []
        for day in sorted({since.date(), now.date()}):
            found += await self._day(provider, day, since)
        return found

    @round_trip("health.windows", "read")
    async def _day(self, provider: str, day: date, since: datetime) -> list[Window]:
        return [
            Window(start, *counters)
            for (scope, p, d, start), counters in sorted(self.tables.windows.items())
            if (scope, p, d) == (self.scope, provider, day) and start > since
        ]

    @round_trip("health.forget", "write")
    async def forget(self, provider: str, day: date) -> None:
        for key in [k for k in self.tables.windows if k[:3] == (self.scope, provider, day)]:
            del self.tables.windows[key]

    @round_trip("health.set_circuit", "write")
    async def set_circuit(self, provider: str, state: CircuitState, health: float) -> None:
        self.tables.circuits[(self.scope, provider)] = state

    @round_trip("health.circuits", "read")
    async def circuits(self) -> dict[str, CircuitState]:
        return {p: s for (scope, p), s in self.tables.circuits.items() if scope == self.scope}
