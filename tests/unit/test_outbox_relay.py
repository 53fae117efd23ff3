"""The outbox relay when finishing an acceptance fails (``shared.delivery.outbox.Relay`` and
``relay_forever``), and the pure bucket arithmetic it reads by, over a stand-in table."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
from cassandra.util import uuid_from_time
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.core.errors import DependencyUnavailable, PublishError
from shared.delivery.outbox import (
    IDLE_EVERY,
    SHARDS,
    Outbox,
    Relay,
    minute_of,
    minutes,
    relay_forever,
    shard_of,
    tell_relays,
)
from tests.fakes.cassandra import FakeCassandra
from tests.fakes.clocks import Ticks
from tests.fakes.delivery import FakeOutbox

T0 = datetime(2026, 6, 30, 23, 59, 41, tzinfo=UTC)


class _Table:
    """Outbox rows by (minute, shard), as ``Outbox.unpublished`` and ``done`` see them."""

    def __init__(self) -> None:
        self.rows: dict[tuple[datetime, int], dict[uuid.UUID, bool]] = {}

    def add(self, when: datetime) -> uuid.UUID:
        batch_id: uuid.UUID = uuid_from_time(when.timestamp())
        self.rows.setdefault(Outbox.bucket(batch_id), {})[batch_id] = False
        return batch_id

    async def unpublished(self, minute: datetime, shard: int) -> list[uuid.UUID]:
        return sorted(
            (b for b, done in self.rows.get((minute, shard), {}).items() if not done),
            key=lambda b: b.time,
        )

    async def done(self, batch_id: uuid.UUID) -> None:
        self.rows[Outbox.bucket(batch_id)][batch_id] = True

    def pending(self) -> set[uuid.UUID]:
        return {b for part in self.rows.values() for b, done in part.items() if not done}


class _Finisher:
    """Finishes stored batches; ``failing`` ones raise as a broker that does not confirm."""

    def __init__(self, table: _Table) -> None:
        self.table = table
        self.failing: set[uuid.UUID] = set()
        self.finished: list[uuid.UUID] = []

    async def __call__(self, batch_id: uuid.UUID) -> object:
        if batch_id in self.failing:
            raise PublishError(f"not confirmed: batch.{batch_id}")
        self.finished.append(batch_id)
        await self.table.done(batch_id)
        return object()


async def test_a_publish_that_fails_mid_pass_is_retried_by_the_next_pass() -> None:
    """The pass stops at the failure; every row it did not finish is still there for the
    next pass, which starts no later than the failed row's minute."""
    table = _Table()
    first, failing, after = (table.add(T0 - timedelta(minutes=m)) for m in (9, 8, 7))
    finish = _Finisher(table)
    finish.failing.add(failing)
    relay = Relay(table, finish, grace=5)  # type: ignore[arg-type]

    with pytest.raises(PublishError):
        await relay.once(T0)

    assert finish.finished == [first]
    assert table.pending() == {failing, after}
    assert relay.since is None or relay.since <= minute_of(T0 - timedelta(minutes=8))

    finish.failing.clear()
    assert await relay.once(T0 + timedelta(seconds=10)) == 2
    assert finish.finished == [first, failing, after]
    assert table.pending() == set()


async def test_a_failing_batch_older_than_the_abandon_limit_still_stops_the_pass() -> None:
    """Abandoning is for batches that were never stored; a stored batch the broker refuses is
    retried however old, never silently marked done."""
    table = _Table()
    old = table.add(T0 - timedelta(hours=3))
    finish = _Finisher(table)
    finish.failing.add(old)
    relay = Relay(table, finish, grace=5)  # type: ignore[arg-type]
    relay.since = minute_of(T0 - timedelta(hours=3))
    with pytest.raises(PublishError):
        await relay.once(T0)
    assert table.pending() == {old}


class _ScriptedRelay(Relay):
    """A Relay whose passes raise or return what the script says (and that always has work)."""

    def __init__(self, *script: int | BaseException) -> None:
        super().__init__(_Table(), _Finisher(_Table()), grace=0)  # type: ignore[arg-type]
        self.script = list(script)
        self.passes = 0
        self.exhausted = asyncio.Event()

    async def once(self, now: datetime | None = None) -> int:
        self.passes += 1
        step = self.script.pop(0) if self.script else 0
        if not self.script:
            self.exhausted.set()
        if isinstance(step, BaseException):
            raise step
        return step


async def test_the_relay_loop_survives_an_outage_and_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    relay = _ScriptedRelay(
        DependencyUnavailable("cassandra", "timeout"), PublishError("not confirmed"), 2, 0
    )
    with caplog.at_level(logging.INFO, "shared.delivery.outbox"):
        task = asyncio.create_task(relay_forever(relay, interval=0.001))
        await asyncio.wait_for(relay.exhausted.wait(), 2)
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    assert relay.passes >= 4
    messages = [r.getMessage() for r in caplog.records]
    assert messages[:3] == [
        "outbox relay: cassandra unavailable: timeout",
        "outbox relay: rabbitmq unavailable: not confirmed",
        "outbox relay finished 2 acceptance(s)",
    ]


async def test_an_unexpected_error_ends_the_relay_loop_loudly() -> None:
    """Only outages are waited out; a bug is raised, not swallowed pass after pass."""
    relay = _ScriptedRelay(1, TypeError("bug"))
    with pytest.raises(TypeError, match="bug"):
        await asyncio.wait_for(
            relay_forever(relay, interval=0.001),
            2,
        )
    assert relay.passes == 2


# -- waking: an idle relay reads nothing until a row is written ------------------------------


class _Announcer:
    """The settings fanout: every relay hears what is announced (``lost``: nothing is)."""

    def __init__(self, *relays: Relay, lost: bool = False) -> None:
        self.relays, self.lost = relays, lost
        self.sent = 0

    async def announce(self, body: bytes) -> None:
        if self.lost:
            raise DependencyUnavailable("rabbitmq", "unreachable")
        self.sent += 1
        for relay in self.relays:
            relay.heard(body)


def _idle_relay(table: _Table, ticks: Ticks, *, grace: float = 30) -> Relay:
    relay = Relay(table, _Finisher(table), grace=grace, every=5, clock=ticks)  # type: ignore[arg-type]
    relay.found = False
    return relay


async def _spin() -> None:
    for _ in range(30):
        await asyncio.sleep(0)


async def test_a_relay_with_nothing_written_waits_idle_and_a_writer_elsewhere_wakes_it() -> None:
    """No row left and none written for a grace period: IDLE_EVERY; a row written by another
    process (its wake-up heard over the fanout) brings passes every interval again."""
    table, ticks = _Table(), Ticks()
    relay = _idle_relay(table, ticks)
    idle = relay.next_in()
    writer = FakeOutbox(FakeCassandra())
    tell_relays(writer, _Announcer(relay), 5)

    await writer.statement(uuid_from_time(T0.timestamp()), uuid.uuid4())
    await _spin()

    assert (idle, relay.next_in()) == (IDLE_EVERY, 5)


async def test_a_row_written_is_relayed_at_its_grace_by_passes_every_interval() -> None:
    """After a row is written the relay passes every interval until the row is due and then
    finishes it, its grace after it was written at the latest plus an interval, as before;
    then it goes idle."""
    table, ticks = _Table(), Ticks()
    relay = _idle_relay(table, ticks)
    writer = FakeOutbox(FakeCassandra())
    tell_relays(writer, _Announcer(lost=True), 5, own=relay)
    row = table.add(T0)
    await writer.statement(row, uuid.uuid4())

    waits: list[float] = []
    seconds, finished_at = 0.0, None
    while not waits or waits[-1] != IDLE_EVERY:
        await relay.once(T0 + timedelta(seconds=seconds))
        if finished_at is None and not table.pending():
            finished_at = seconds
        waits.append(relay.next_in())
        ticks.now += waits[-1]
        seconds += waits[-1]
        assert seconds < 120

    assert finished_at is not None and 30 <= finished_at <= 30 + 5
    assert set(waits[:-1]) == {5}


async def test_the_relay_loop_waits_idle_and_passes_at_once_when_woken() -> None:
    """relay_forever does nothing while idle and passes as soon as a wake-up is heard."""
    table, ticks = _Table(), Ticks()
    relay = _idle_relay(table, ticks)
    passes: list[int] = []
    once = relay.once

    async def counted(now: datetime | None = None) -> int:
        passes.append(1)
        return await once(now)

    relay.once = counted  # type: ignore[method-assign]
    loop = asyncio.create_task(relay_forever(relay, interval=5))
    await _spin()
    ticks.now += 3600  # the start's own linger is over: the next wait is idle
    relay.linger.alarm.nudge()
    await _spin()
    asleep = len(passes)
    await _Announcer(relay).announce(b'{"wake":"outbox"}')
    await _spin()
    loop.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await loop

    assert (asleep, len(passes)) == (2, 3)


async def test_a_writer_wakes_the_relays_once_per_interval_and_other_wake_ups_do_not() -> None:
    """Many rows within an interval send one wake-up; a scheduler's wake-up or a settings
    change keeps an idle relay idle."""
    table, ticks = _Table(), Ticks()
    relay = _idle_relay(table, ticks)
    fanout = _Announcer(relay)
    writer = FakeOutbox(FakeCassandra())
    tell_relays(writer, fanout, 5)
    relay.heard(b'{"wake":"scheduler"}')
    relay.heard(b'{"changed": ["providers.chain"]}')
    before = relay.next_in()

    for _ in range(5):
        await writer.statement(uuid_from_time(T0.timestamp()), uuid.uuid4())
    await _spin()

    assert (before, fanout.sent) == (IDLE_EVERY, 1)


# -- buckets ----------------------------------------------------------------------------------

_instants = st.datetimes(  # hypothesis bounds are naive; ``timezones`` makes them aware
    min_value=datetime(2020, 1, 1),  # noqa: DTZ001
    max_value=datetime(2040, 1, 1),  # noqa: DTZ001
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30)), timezone.min]),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(start=_instants, span=st.integers(min_value=0, max_value=3 * 3600))
def test_minutes_are_every_utc_minute_between_both_ends(start: datetime, span: int) -> None:
    end = start + timedelta(seconds=span)
    out = minutes(start, end)
    assert out[0] == minute_of(start) and out[-1] == minute_of(end)
    assert all(b - a == timedelta(minutes=1) for a, b in itertools.pairwise(out))
    assert all(m.tzinfo == UTC and m.second == m.microsecond == 0 for m in out)


def test_a_minute_of_another_offset_is_its_utc_minute() -> None:
    local = datetime(2026, 7, 1, 5, 29, 59, tzinfo=timezone(timedelta(hours=5, minutes=30)))
    assert minute_of(local) == datetime(2026, 6, 30, 23, 59, tzinfo=UTC)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(when=_instants, node=st.integers(min_value=0, max_value=2**48 - 1))
def test_a_batch_lives_in_the_bucket_of_its_own_acceptance(when: datetime, node: int) -> None:
    batch_id = uuid_from_time(when.timestamp(), node=node)
    minute, shard = Outbox.bucket(batch_id)
    assert minute == minute_of(when)
    assert 0 <= shard < SHARDS and shard == shard_of(batch_id)
