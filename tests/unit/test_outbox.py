"""The outbox's time buckets and what the relay does with each row, over a stand-in table."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from cassandra.util import uuid_from_time

from shared.delivery.outbox import ABANDON_AFTER, SHARDS, Relay, minute_of, minutes, shard_of

T0 = datetime(2026, 11, 25, 9, 30, 17, 500_000, tzinfo=UTC)


def test_a_minute_bucket_is_the_utc_minute() -> None:
    assert minute_of(T0) == datetime(2026, 11, 25, 9, 30, tzinfo=UTC)


def test_minutes_cover_both_ends_inclusive() -> None:
    assert minutes(T0, T0 + timedelta(seconds=80)) == [
        datetime(2026, 11, 25, 9, m, tzinfo=UTC) for m in (30, 31)
    ]
    assert minutes(T0, T0) == [minute_of(T0)]


class _Rows:
    """The outbox rows by (minute, shard), as ``Outbox.unpublished`` reads them."""

    def __init__(self) -> None:
        self.stored: dict[tuple[datetime, int], dict[uuid.UUID, bool]] = {}
        self.reads = 0

    def add(self, when: datetime) -> uuid.UUID:
        batch_id: uuid.UUID = uuid_from_time(when.timestamp())
        key = (minute_of(when), shard_of(batch_id))
        self.stored.setdefault(key, {})[batch_id] = False
        return batch_id

    async def unpublished(self, minute: datetime, shard: int) -> list[uuid.UUID]:
        self.reads += 1
        return [b for b, published in self.stored.get((minute, shard), {}).items() if not published]

    async def done(self, batch_id: uuid.UUID) -> None:
        for rows in self.stored.values():
            if batch_id in rows:
                rows[batch_id] = True


def _relay(table: _Rows, stored: set[uuid.UUID], grace: float = 30) -> tuple[Relay, list[Any]]:
    finished: list[uuid.UUID] = []

    async def finish(batch_id: uuid.UUID) -> object | None:
        if batch_id not in stored:
            return None
        finished.append(batch_id)
        await table.done(batch_id)
        return object()

    return Relay(table, finish, grace=grace), finished  # type: ignore[arg-type]


async def test_the_relay_finishes_stored_batches_past_the_grace_period_only() -> None:
    table = _Rows()
    old, young = table.add(T0 - timedelta(minutes=5)), table.add(T0 - timedelta(seconds=5))
    relay, finished = _relay(table, {old, young})
    assert await relay.once(T0) == 1
    assert finished == [old]
    assert await relay.once(T0 + timedelta(minutes=1)) == 1
    assert finished == [old, young]


async def test_a_batch_not_yet_stored_waits_until_it_is_abandoned() -> None:
    table = _Rows()
    pending = table.add(T0 - timedelta(minutes=5))
    relay, finished = _relay(table, set())
    assert await relay.once(T0) == 0
    assert relay.since == minute_of(T0 - timedelta(minutes=5))  # it keeps looking there
    assert await relay.once(T0 - timedelta(minutes=5) + ABANDON_AFTER + timedelta(seconds=1)) == 0
    assert finished == [] and table.stored[next(iter(table.stored))][pending] is True


async def test_once_caught_up_a_pass_reads_only_the_last_minutes() -> None:
    table = _Rows()
    table.add(T0 - timedelta(minutes=50))
    relay, _ = _relay(table, set(table.stored[next(iter(table.stored))]))
    await relay.once(T0)
    first = table.reads
    table.reads = 0
    await relay.once(T0 + timedelta(seconds=5))
    assert first >= 55 * SHARDS  # the first pass looks back an hour
    assert table.reads <= 3 * SHARDS
