"""``safedelivr stats reconcile`` in its whole-keyspace form (no ``--user``), and the index of
a day's active users it starts from, in a keyspace of its own: it finds and repairs the drift
of every user there. Other tests scope it to their own user, since a shared keyspace holds
everyone's rows."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from shared import accounts
from shared.batchstore import BatchStore, NewBatch
from shared.db import Database
from shared.precedence import accepted_at
from shared.recipients import RecipientStore
from shared.reconcile import reconcile_day
from shared.stats import StatsStore, batch_day, user_bucket
from tests.conftest import private_keyspace, unique
from tests.fakes.world import new_batch


@pytest.fixture
async def own_db(services_up: None) -> AsyncIterator[Database]:
    async with private_keyspace("r") as cassandra:
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
    await RecipientStore(db).reported(
        batch_id, user_id, 0, batch.recipients[0].log_id, provider="sg",
        provider_result="delivered", message_id=None, stage_rank=3, rank=3,
        when=accepted_at(batch_id) + timedelta(seconds=5), event="delivered", state="success",
        reason=None, evidence="c.0",
    )  # fmt: skip
    return user_id, batch


async def _lose_success_mark(db: Database, batch: NewBatch) -> None:
    """Delete the recipient's success mark at the timestamp it was written with."""
    log_id = batch.recipients[0].log_id
    row = await db.one(
        "SELECT WRITETIME(state) AS stamp FROM batches WHERE batch_id = ? AND chunk = 0 "
        "AND log_id = ?",
        (batch.batch_id, log_id),
    )
    assert row is not None
    await db.execute(
        "DELETE FROM stat_marks USING TIMESTAMP ? "
        "WHERE user_id = ? AND day = ? AND metric = 'success' AND key = ?",
        (row["stamp"], batch.user_id, batch_day(batch.batch_id), str(log_id)),
    )


async def test_reconcile_without_a_user_repairs_every_user_of_the_keyspace(
    own_db: Database,
) -> None:
    (first, batch1), (second, batch2) = [await _delivered_batch(own_db) for _ in range(2)]
    day = batch_day(batch1.batch_id)
    assert batch_day(batch2.batch_id) == day
    assert await reconcile_day(own_db, day) == []
    await _lose_success_mark(own_db, batch1)
    await _lose_success_mark(own_db, batch2)

    drift = await reconcile_day(own_db, day, fix=True)

    assert sorted((d.user_id, d.metric, d.expected, d.stored) for d in drift) == sorted(
        [(first, "success", 1, 0), (second, "success", 1, 0)]
    )
    assert await reconcile_day(own_db, day) == []
    stats = StatsStore(own_db)
    for user in (first, second):
        assert (await stats.count_day(user, day)).get("success") == 1


async def test_a_days_active_users_are_spread_over_buckets_and_all_found(
    own_db: Database,
) -> None:
    stats = StatsStore(own_db)
    users = [uuid.UUID(int=n * 7919 + 3) for n in range(40)]
    batch_id = uuid.uuid1()
    day = batch_day(batch_id)
    for user in users:
        await stats.mark(user, batch_id, "queued", [uuid.uuid1()])
    assert await stats.active_users(day) == sorted(users, key=str)
    rows = await own_db.all_pages("SELECT bucket, user_id FROM active_user_buckets")
    assert {r["bucket"] for r in rows} == {user_bucket(u) for u in users}
    assert len({user_bucket(u) for u in users}) > 1  # not one partition for everyone


async def test_a_day_indexed_before_the_buckets_is_still_found(own_db: Database) -> None:
    legacy, current = uuid.uuid4(), uuid.uuid4()
    batch_id = uuid.uuid1()
    day = batch_day(batch_id)
    await own_db.execute(
        "INSERT INTO active_users (day, user_id) VALUES (?, ?)", (day, legacy)
    )  # what releases before the buckets wrote
    await StatsStore(own_db).mark(current, batch_id, "queued", [uuid.uuid1()])
    assert set(await StatsStore(own_db).active_users(day)) == {legacy, current}
