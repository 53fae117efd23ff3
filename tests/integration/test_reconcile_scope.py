"""``shared.ops.reconcile`` on real Cassandra, scoped to each test's own users: which batches a
user-day holds at its edges, which users a reconcile looks at, what it leaves alone without
``fix``, and a rollup that is merely stale (changed since its count) rather than wrong."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, timedelta

import pytest
from cassandra.util import uuid_from_time

from shared.core.batch_ids import accepted_at
from shared.delivery.batchstore import BatchStore, NewBatch
from shared.delivery.recipients import RecipientStore, Report, log_id_for
from shared.delivery.stats import Rollup, StatsStore, batch_day, bucket_of
from shared.infra.db import Database
from shared.ops.reconcile import day_batches, reconcile_day
from tests.fakes.world import new_batch

A = "ann@example.org"
#: 100-nanosecond ticks between the UUID epoch (1582-10-15) and the Unix epoch.
_UUID_EPOCH = 0x01B21DD213814000


def _uuid_at_tick(when: datetime, ticks_before: int = 0) -> uuid.UUID:
    """A time-based id exactly ``ticks_before`` 100-ns ticks before ``when``."""
    ticks = int(when.timestamp()) * 10_000_000 + _UUID_EPOCH - ticks_before
    node, clock_seq = uuid.uuid4().int & (2**48 - 1), uuid.uuid4().int & 0x3FFF
    return uuid.UUID(
        fields=(
            ticks & 0xFFFFFFFF,
            (ticks >> 32) & 0xFFFF,
            ((ticks >> 48) & 0x0FFF) | 0x1000,
            0x80 | (clock_seq >> 8),
            clock_seq & 0xFF,
            node,
        )
    )


async def _listed(db: Database, user_id: uuid.UUID, *batch_ids: uuid.UUID) -> None:
    store = BatchStore(db)
    for batch_id in batch_ids:
        await store.index(new_batch(A, batch_id=batch_id, user_id=user_id))


async def test_a_day_holds_the_batches_from_its_first_to_its_last_microsecond(
    db: Database,
) -> None:
    """UTC days, across a month's edge (the list is partitioned by month)."""
    user = uuid.uuid4()
    day = date(2026, 2, 1)
    midnight = datetime(2026, 2, 1, tzinfo=UTC)
    tomorrow = midnight + timedelta(days=1)
    inside = [
        uuid_from_time(midnight),
        uuid_from_time(midnight + timedelta(hours=12)),
        uuid_from_time(tomorrow - timedelta(microseconds=1)),
    ]
    outside = [
        uuid_from_time(midnight - timedelta(microseconds=1)),  # January's partition
        uuid_from_time(tomorrow),
    ]
    await _listed(db, user, *inside, *outside)

    assert sorted(await day_batches(db, user, day), key=str) == sorted(inside, key=str)
    assert await day_batches(db, user, date(2026, 1, 31)) == [outside[0]]
    assert await day_batches(db, uuid.uuid4(), day) == []


@pytest.mark.parametrize("ticks_before", [3, 7])
async def test_a_batch_in_the_last_ticks_of_a_day_is_listed_on_its_own_day(
    db: Database, ticks_before: int
) -> None:
    user = uuid.uuid4()
    late = _uuid_at_tick(datetime(2026, 2, 2, tzinfo=UTC), ticks_before=ticks_before)
    await _listed(db, user, late)

    assert await day_batches(db, user, batch_day(late)) == [late]


async def _delivered(db: Database) -> tuple[NewBatch, int]:
    """A user of its own with a one-recipient batch that was delivered, its rollups counted;
    returns the batch and the recipient's stats bucket."""
    batch = new_batch(A, user_id=uuid.uuid4())
    store = BatchStore(db)
    await store.write(batch)
    await store.index(batch)
    log_id = log_id_for(batch.batch_id, A)
    await RecipientStore(db).reported(Report(
        batch.batch_id, batch.user_id, 0, log_id, provider="sg",
        provider_result="delivered", message_id=None, stage_rank=3, rank=3,
        when=accepted_at(batch.batch_id) + timedelta(seconds=5), event="delivered",
        state="success", reason=None, evidence="c.0",
    ))  # fmt: skip
    stats = StatsStore(db)
    day = batch_day(batch.batch_id)
    assert (await stats.day(batch.user_id, day)).get("success") == 1
    return batch, bucket_of(log_id, stats.buckets)


async def _store_rollup(db: Database, batch: NewBatch, bucket: int, rollup: Rollup) -> None:
    await db.execute(
        "UPDATE stat_rows SET rollup = ? WHERE user_id = ? AND day = ? AND bucket = ?",
        (rollup.encode(), batch.user_id, batch_day(batch.batch_id), bucket),
    )


#: A rollup that claims to be current (counted after every change) but counts nothing.
_WRONG = Rollup({}, datetime.now(UTC) + timedelta(days=1))


async def test_a_reconcile_reports_only_the_users_it_is_given(db: Database) -> None:
    (first, bucket1), (second, bucket2) = [await _delivered(db) for _ in range(2)]
    day = batch_day(first.batch_id)
    await _store_rollup(db, first, bucket1, _WRONG)
    await _store_rollup(db, second, bucket2, _WRONG)

    assert await reconcile_day(db, day, fix=True, users=[]) == []
    fixed = await reconcile_day(db, day, fix=True, users=[first.user_id])

    assert [(d.user_id, d.bucket) for d in fixed] == [(first.user_id, bucket1)]
    assert await reconcile_day(db, day, users=[first.user_id]) == []
    (left,) = await reconcile_day(db, day, users=[second.user_id])
    assert (left.user_id, left.bucket, left.stored) == (second.user_id, bucket2, {})


async def test_without_fix_drift_is_only_reported(db: Database) -> None:
    """A dry run changes nothing: the same drift again, and reads still serve the wrong
    rollup."""
    batch, bucket = await _delivered(db)
    day = batch_day(batch.batch_id)
    await _store_rollup(db, batch, bucket, _WRONG)

    once = await reconcile_day(db, day, users=[batch.user_id])
    again = await reconcile_day(db, day, users=[batch.user_id])

    assert once == again
    assert [(d.bucket, d.stored, d.counted.get("success")) for d in once] == [(bucket, {}, 1)]
    assert (await StatsStore(db).day(batch.user_id, day)).get("success") is None


async def test_a_stale_rollup_is_not_drift_but_a_fix_recounts_it(db: Database) -> None:
    """A bucket changed after its count is recounted by the next read anyway: reconcile does
    not report it, and with ``fix`` counts it now."""
    batch, bucket = await _delivered(db)
    day = batch_day(batch.batch_id)
    stats = StatsStore(db)
    _, dirty_at = await stats.rollup(batch.user_id, day, bucket)
    assert dirty_at is not None
    stale = Rollup({}, dirty_at.replace(tzinfo=UTC) - timedelta(hours=1))
    await _store_rollup(db, batch, bucket, stale)

    assert await reconcile_day(db, day, users=[batch.user_id]) == []
    assert (await stats.rollup(batch.user_id, day, bucket))[0] == stale

    assert await reconcile_day(db, day, fix=True, users=[batch.user_id]) == []

    recounted, _ = await stats.rollup(batch.user_id, day, bucket)
    assert recounted is not None and recounted.counts.get("success") == 1
