"""Scheduled batches on real Cassandra: due once their minute has come, handed on again
after a scheduler died before moving its cursor, never twice after it did; one scheduler
per namespace."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from shared.db import Database
from shared.lanes import BUCKET, bucket_of
from shared.schedule_store import ScheduleStore, finished_through


def _store(db: Database) -> ScheduleStore:
    return ScheduleStore(db, f"t-{uuid.uuid4().hex[:8]}")


async def test_a_batch_is_due_once_its_minute_has_come(db: Database) -> None:
    store = _store(db)
    now = datetime.now(UTC)
    soon, later = uuid.uuid1(), uuid.uuid1()
    await store.add(soon, now - timedelta(minutes=2))
    await store.add(later, now + timedelta(minutes=5))

    found, last = await store.due(now)

    assert [d.batch_id for d in found] == [soon]
    assert last == bucket_of(now)


async def test_a_scheduler_that_died_before_its_cursor_moved_hands_the_batch_on_again(
    db: Database,
) -> None:
    store = _store(db)
    now = datetime.now(UTC)
    batch = uuid.uuid1()
    await store.add(batch, now - timedelta(minutes=3))
    first, second = uuid.uuid4(), uuid.uuid4()
    assert await store.take_lease(first, 30)
    assert not await store.take_lease(second, 30)  # one scheduler per namespace

    found, _ = await store.due(now)  # ... and the first dies here
    await store.release_lease(first)  # (its lease lapses)
    assert await store.take_lease(second, 30)
    again, last = await store.due(now)
    assert await store.finish(second, finished_through(last, now) or now)
    after, _ = await store.due(now)

    assert [d.batch_id for d in found] == [d.batch_id for d in again] == [batch]
    assert after == []


def test_the_current_minute_is_never_finished() -> None:
    now = datetime(2026, 11, 26, 10, 0, 30, tzinfo=UTC)

    assert finished_through(bucket_of(now), now) == bucket_of(now) - BUCKET
    assert finished_through(None, now) is None
