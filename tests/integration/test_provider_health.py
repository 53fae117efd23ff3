"""The shared health windows and circuits (``shared.providers.provider_health.HealthStore``) on real
Cassandra: what several processes add lands in one window, windows older than the look-back
are not read, and circuits are kept per deployment."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from services.consumers.provider_rates import ProviderLimiter
from shared.infra.db import Database
from shared.providers.provider_health import (
    WINDOW,
    WINDOWS,
    CircuitState,
    HealthStore,
    window_start,
)
from tests.conftest import unique


async def test_adds_from_several_processes_sum_in_one_window(db: Database) -> None:
    store = HealthStore(db, unique("scope"))
    now = datetime.now(UTC)
    start = window_start(now)

    await store.add("sg", start, 10, 3, 1000)
    await store.add("sg", start, 5, 0, 500)

    (window,) = await store.windows("sg", now)
    assert (window.start, window.calls, window.errors, window.latency_ms) == (start, 15, 3, 1500)
    assert await store.windows("mg", now) == []


async def test_only_the_look_back_is_read(db: Database) -> None:
    store = HealthStore(db, unique("scope"))
    now = datetime.now(UTC)
    old = window_start(now) - timedelta(seconds=WINDOW * (WINDOWS + 2))

    await store.add("sg", old, 10, 10, 0)
    await store.add("sg", window_start(now), 1, 0, 0)

    assert [w.calls for w in await store.windows("sg", now)] == [1]


async def test_a_window_across_midnight_is_read_from_both_days(db: Database) -> None:
    store = HealthStore(db, unique("scope"))
    midnight = datetime(2026, 11, 27, tzinfo=UTC)
    before = window_start(midnight - timedelta(seconds=1))

    await store.add("sg", before, 4, 1, 0)
    await store.add("sg", midnight, 6, 0, 0)

    found = await store.windows("sg", midnight + timedelta(seconds=2))
    assert sorted(w.calls for w in found) == [4, 6]


async def test_circuits_are_kept_per_deployment(db: Database) -> None:
    mine, other = HealthStore(db, unique("scope")), HealthStore(db, unique("scope"))
    since = datetime.now(UTC).replace(microsecond=0)

    await mine.set_circuit("sg", CircuitState("open", since), 0.4)

    assert await mine.circuits() == {"sg": CircuitState("open", since)}
    assert await other.circuits() == {}


async def test_what_the_webhooks_reported_lands_in_the_same_windows(db: Database) -> None:
    store = HealthStore(db, unique("scope"))
    now = datetime.now(UTC)
    start = window_start(now)

    await store.add("sg", start, 10, 0, 1000)
    await store.add_reported("sg", start, 30, 6, 4)
    await store.add_reported("sg", start, 10, 0, 0)

    (window,) = await store.windows("sg", now)
    assert (window.calls, window.events, window.drops, window.deferrals) == (10, 40, 6, 4)


async def test_a_past_days_windows_and_slices_are_dropped(db: Database) -> None:
    scope = unique("scope")
    store, limiter = HealthStore(db, scope), ProviderLimiter(db, scope)
    long_ago = datetime.now(UTC) - timedelta(days=3)
    await store.add("sg", window_start(long_ago), 10, 1, 100)
    limiter.clock = lambda: long_ago
    assert await limiter.acquire("sg", long_ago, 5) is None

    await store.forget("sg", long_ago.date())
    await limiter.forget("sg", long_ago.date())

    assert await store.windows("sg", long_ago) == []
    rows = await db.rows(
        "SELECT slice FROM provider_slices WHERE scope = ? AND provider = ? AND day = ?",
        (scope, "sg", long_ago.date()),
    )
    assert rows == []
