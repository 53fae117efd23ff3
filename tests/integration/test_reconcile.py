"""``safedelivr stats reconcile`` in its whole-keyspace form (no ``--user``), and the index of
a day's active users it starts from, in a keyspace of the module's own: it finds and repairs
every user's rollups that disagree with their outcome rows. The module's tests share that
keyspace, so each asserts on its own users (what a pass finds of the others' is theirs).
Other tests scope it to their own user, since the run's keyspace holds everyone's rows."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from shared.accounts import accounts
from shared.core.batch_ids import accepted_at
from shared.delivery.batchstore import BatchStore, NewBatch
from shared.delivery.recipients import RecipientStore, Report, log_id_for
from shared.delivery.stats import Rollup, StatsStore, batch_day, bucket_of, user_bucket
from shared.infra.db import Database
from shared.ops.reconcile import reconcile_day
from tests.conftest import KeyspacePool, private_keyspace, unique
from tests.fakes.world import new_batch


@pytest.fixture(scope="module")
async def own_db(keyspace_pool: KeyspacePool) -> AsyncIterator[Database]:
    async with private_keyspace(keyspace_pool) as cassandra:
        db = await Database.connect(cassandra, keyspace=cassandra.keyspace)
        try:
            yield db
        finally:
            await db.close()


async def _delivered_batch(db: Database) -> tuple[uuid.UUID, NewBatch]:
    """A user with a one-recipient batch that was delivered (logs and stats agree)."""
    user_id = await accounts.ensure_user(db, unique("rec"))
    batch = new_batch("a@example.org", user_id=user_id)
    batch_id = batch.batch_id
    store = BatchStore(db)
    await store.write(batch)
    await store.index(batch)
    await RecipientStore(db).reported(Report(
        batch_id, user_id, 0, log_id_for(batch_id, "a@example.org"), provider="sg",
        provider_result="delivered", message_id=None, stage_rank=3, rank=3,
        when=accepted_at(batch_id) + timedelta(seconds=5), event="delivered", state="success",
        reason=None, evidence="c.0",
    ))  # fmt: skip
    return user_id, batch


async def corrupt_rollup(
    db: Database, user_id: uuid.UUID, batch_id: uuid.UUID, log_id: uuid.UUID
) -> int:
    """Store a rollup for the recipient's bucket that claims to be current but counts nothing
    (as a lost or wrong rollup write would); return the bucket."""
    stats = StatsStore(db)
    day, bucket = batch_day(batch_id), bucket_of(log_id, stats.buckets)
    await stats.day(user_id, day)  # the rollups exist and are right
    wrong = Rollup({}, datetime.now(UTC) + timedelta(minutes=5))
    await db.execute(
        "UPDATE stat_rows SET rollup = ? WHERE user_id = ? AND day = ? AND bucket = ?",
        (wrong.encode(), user_id, day, bucket),
    )
    return bucket


async def test_reconcile_without_a_user_repairs_every_user_of_the_keyspace(
    own_db: Database,
) -> None:
    (first, batch1), (second, batch2) = [await _delivered_batch(own_db) for _ in range(2)]
    day = batch_day(batch1.batch_id)
    assert batch_day(batch2.batch_id) == day
    await StatsStore(own_db).day(first, day)
    await StatsStore(own_db).day(second, day)
    ours = {first, second}
    assert [d for d in await reconcile_day(own_db, day) if d.user_id in ours] == []
    log1, log2 = (log_id_for(b.batch_id, b.recipients[0].email) for b in (batch1, batch2))
    bucket1 = await corrupt_rollup(own_db, first, batch1.batch_id, log1)
    bucket2 = await corrupt_rollup(own_db, second, batch2.batch_id, log2)

    drift = [d for d in await reconcile_day(own_db, day, fix=True) if d.user_id in ours]

    assert sorted((d.user_id, d.bucket, d.stored, d.counted["success"]) for d in drift) == sorted(
        [(first, bucket1, {}, 1), (second, bucket2, {}, 1)]
    )
    assert [d for d in await reconcile_day(own_db, day) if d.user_id in ours] == []
    stats = StatsStore(own_db)
    for user in (first, second):
        assert (await stats.day(user, day)).get("success") == 1


async def test_a_days_active_users_are_spread_over_buckets_and_all_found(
    own_db: Database,
) -> None:
    stats = StatsStore(own_db)
    users = [uuid.UUID(int=n * 7919 + 3) for n in range(40)]
    batch_id = uuid.uuid1()
    day = batch_day(batch_id)
    for user in users:
        await stats.accepted(user, batch_id, 1, 0)
    active = await stats.active_users(day)
    assert [u for u in active if u in set(users)] == sorted(users, key=str)
    rows = await own_db.all_pages("SELECT bucket, user_id FROM active_user_buckets")
    assert {(r["bucket"], r["user_id"]) for r in rows if r["user_id"] in set(users)} == {
        (user_bucket(u), u) for u in users
    }
    assert len({user_bucket(u) for u in users}) > 1  # not one partition for everyone


async def test_a_day_indexed_before_the_buckets_is_still_found(own_db: Database) -> None:
    legacy, current = uuid.uuid4(), uuid.uuid4()
    batch_id = uuid.uuid1()
    day = batch_day(batch_id)
    await own_db.execute(
        "INSERT INTO active_users (day, user_id) VALUES (?, ?)", (day, legacy)
    )  # what releases before the buckets wrote
    await StatsStore(own_db).accepted(current, batch_id, 1, 0)
    assert {legacy, current} <= set(await StatsStore(own_db).active_users(day))
