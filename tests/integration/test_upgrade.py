"""``safedelivr migrate`` moves a keyspace written by data model v1 to v2 (real Cassandra).

The module's tests share a keyspace of their own (a migration takes seconds): each test
leaves it upgraded, so the next one's upgrade finds only what that test wrote as v1."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cassandra.util import uuid_from_time

from services.api import queries
from shared.core.models import Address, Message
from shared.delivery.attempts import AttemptStore
from shared.delivery.batchstore import BatchStore
from shared.delivery.outbox import Outbox, Relay
from shared.delivery.recipients import CHUNK_ROW, RecipientStore, Report
from shared.delivery.stats import StatsStore, batch_day
from shared.infra.db import Database
from shared.ops.upgrade import upgrade
from tests.conftest import KeyspacePool, private_keyspace, unique
from tests.integration.v1_writer import V1Recipient, V1Writer


@pytest.fixture(scope="module")
async def own_db(keyspace_pool: KeyspacePool) -> AsyncIterator[Database]:
    async with private_keyspace(keyspace_pool) as cassandra:
        conn = await Database.connect(cassandra, keyspace=cassandra.keyspace)
        try:
            yield conn
        finally:
            await conn.close()


@pytest.fixture
async def db(own_db: Database) -> AsyncIterator[Database]:
    """The module's keyspace, upgraded again after the test (whatever it left half done)."""
    yield own_db
    await upgrade(own_db, StatsStore(own_db))


async def _v1_batch(db: Database) -> tuple[uuid.UUID, uuid.UUID]:
    """A v1 batch of five in three chunks: delivered, bounced, given up, sent, queued."""
    writer = V1Writer(db)
    user_id, batch_id = uuid.uuid4(), uuid_from_time(datetime.now(UTC) - timedelta(minutes=5))
    message = Message(sender=Address(email="news@example.com"), subject="v1", text="hello")
    ids = await writer.batch(
        batch_id,
        user_id,
        message,
        [
            V1Recipient("ok@example.com", "Ok", '{"first": "Ok"}'),
            V1Recipient("bounce@example.com"),
            V1Recipient("gone@example.com"),
            V1Recipient("sent@example.com"),
            V1Recipient("wait@example.com"),
        ],
    )
    now = datetime.now(UTC)
    for email, chunk in (("ok", 0), ("bounce", 0), ("sent", 1)):
        await writer.sent(batch_id, chunk, ids[f"{email}@example.com"], "sg", now)
    await writer.outcome(
        user_id, batch_id, 0, ids["ok@example.com"], event="delivered", state="success",
        rank=5, when=now,
    )  # fmt: skip
    await writer.outcome(
        user_id, batch_id, 0, ids["bounce@example.com"], event="bounced", state="failed",
        rank=6, when=now,
    )  # fmt: skip
    await writer.mark(user_id, batch_id, "bounced", ids["bounce@example.com"])
    await writer.mark(user_id, batch_id, "opened", ids["ok@example.com"])
    await writer.give_up(user_id, batch_id, 1, ids["gone@example.com"], now)
    return user_id, batch_id


async def _views(db: Database, batch_id: uuid.UUID) -> tuple[Any, Any, Any]:
    store = BatchStore(db)
    rows = await RecipientStore(db).batch_rows(batch_id)
    visible = sorted(
        (r["email"], r["state"], r["event"], r["gave_up_reason"], dict(r["providers"] or {}))
        for r in rows
    )
    counts = await queries.batch_counts(store, batch_id)
    logs = await queries.logs_page(store, AttemptStore(db), batch_id, 100, None, None)
    return visible, counts, logs


async def test_upgrade_keeps_every_view_and_derives_stats_from_the_v1_outcomes(
    db: Database,
) -> None:
    user_id, batch_id = await _v1_batch(db)
    before = await _views(db, batch_id)
    stats = StatsStore(db)

    report = await upgrade(db, stats)

    assert (report.upgraded, report.recipients) == (1, 5)
    assert await _views(db, batch_id) == before
    chunk_rows = await db.rows(
        "SELECT chunk FROM batches WHERE batch_id = ? AND chunk IN (0, 1, 2) AND log_id = ?",
        (batch_id, CHUNK_ROW),
    )
    assert sorted(r["chunk"] for r in chunk_rows) == [0, 1, 2]
    day = batch_day(batch_id)
    counts = (await stats.range(user_id, day, day))[day]
    assert counts == {"queued": 5, "success": 1, "failed": 2, "bounced": 1, "opened": 1}


async def test_upgrade_twice_changes_nothing_the_second_time(db: Database) -> None:
    user_id, batch_id = await _v1_batch(db)
    stats = StatsStore(db)
    first = await upgrade(db, stats)
    views = await _views(db, batch_id)

    again = await upgrade(db, stats)

    assert again.upgraded == 0
    assert again.already == first.already + first.upgraded  # the module's earlier ones, and ours
    assert await _views(db, batch_id) == views
    day = batch_day(batch_id)
    assert (await stats.range(user_id, day, day))[day]["queued"] == 5


async def test_an_upgraded_recipient_takes_new_outcomes_through_the_v2_writer(
    db: Database,
) -> None:
    """After the upgrade, a late event for a v1 recipient is written, merged and counted
    like any other."""
    user_id, batch_id = await _v1_batch(db)
    stats = StatsStore(db)
    await upgrade(db, stats)
    store = RecipientStore(db, stats)
    waiting = next(r for r in await store.batch_rows(batch_id) if r["email"] == "wait@example.com")

    await store.reported(
        Report(
            batch_id,
            user_id,
            waiting["chunk"],
            waiting["log_id"],
            provider="sg",
            provider_result="delivered",
            message_id=None,
            stage_rank=5,
            rank=5,
            when=datetime.now(UTC),
            event="delivered",
            state="success",
            reason=None,
            evidence=None,
        )
    )

    rows = {r["email"]: r for r in await store.batch_rows(batch_id)}
    assert rows["wait@example.com"]["state"] == "success"
    day = batch_day(batch_id)
    assert (await stats.range(user_id, day, day))[day]["success"] == 2


async def test_upgrade_moves_the_old_outbox_rows_where_the_relay_finds_them(
    db: Database,
) -> None:
    """A batch an earlier release stored but never saw confirmed is still published."""
    user_id, batch_id = await _v1_batch(db)
    namespace = unique("ex")
    await db.execute(
        "INSERT INTO outbox (namespace, shard, batch_id, user_id, created_at) "
        "VALUES (?, 3, ?, ?, ?)",
        (namespace, batch_id, user_id, datetime.now(UTC)),
    )

    report = await upgrade(db, StatsStore(db))

    assert report.outbox_moved == 1
    assert await db.rows("SELECT batch_id FROM outbox") == []
    relayed: list[uuid.UUID] = []

    async def finish(b: uuid.UUID) -> object:
        relayed.append(b)
        return object()

    await Relay(Outbox(db, namespace), finish, grace=0).once()
    assert relayed == [batch_id]


async def test_upgrade_flags_time_bucketed_outbox_rows_written_without_a_published_value(
    db: Database,
) -> None:
    """Rows written before the relay selected on ``published = false`` are still relayed;
    rows already marked published stay so."""
    unset, marked = uuid_from_time(datetime.now(UTC)), uuid_from_time(datetime.now(UTC))
    outbox = Outbox(db, unique("ns"))
    for batch_id, published in ((unset, None), (marked, True)):
        minute, shard = outbox.bucket(batch_id)
        await db.execute(
            "INSERT INTO outbox_minutes (namespace, minute, shard, batch_id, user_id, published) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (outbox.namespace, minute, shard, batch_id, uuid.uuid4(), published),
        )

    report = await upgrade(db, StatsStore(db))

    assert report.outbox_flagged == 1
    relayed: list[uuid.UUID] = []

    async def finish(b: uuid.UUID) -> object:
        relayed.append(b)
        return object()

    await Relay(outbox, finish, grace=0).once()
    assert relayed == [unset]
