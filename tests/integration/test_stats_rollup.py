"""Stats rolled up ahead of reads, on a real Cassandra, in a keyspace of its own (so that the
roll-up pass sees only these marks): after the pass, the first read of a busy day counts no
row and is exact. The writes and the pass are stamped by clocks the test sets (the writes an
hour before the pass), so that the pass finds each bucket settled without waiting."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from cassandra.util import uuid_from_time

from shared.delivery.stats import StatsStore, batch_day, day_of, dirty_shard
from shared.infra.db import Database
from tests.conftest import KeyspacePool, private_keyspace

BUCKETS = 4
RECIPIENTS = 2_000
#: Recipients per logged batch of the seeding writes.
PER_WRITE = 100


@pytest.fixture(scope="module")
async def own_db(keyspace_pool: KeyspacePool) -> AsyncIterator[Database]:
    async with private_keyspace(keyspace_pool) as cassandra:
        db = await Database.connect(cassandra, keyspace=cassandra.keyspace)
        try:
            yield db
        finally:
            await db.close()


async def _write(
    stats: StatsStore,
    user_id: uuid.UUID,
    batch_id: uuid.UUID,
    log_ids: list[uuid.UUID],
    outcome: str,
    when: datetime,
    metrics: tuple[str, ...] = (),
) -> None:
    stamp = int(when.timestamp() * 1_000_000)
    for start in range(0, len(log_ids), PER_WRITE):
        stmts = []
        for log_id in log_ids[start : start + PER_WRITE]:
            stmts += await stats.outcome_statements(
                user_id, batch_id, log_id, outcome=outcome, stamp=stamp, metrics=metrics, now=when
            )
        await stats.db.batch(stmts)


async def _marked(stats: StatsStore, user_id: uuid.UUID, when: datetime) -> int:
    return len(
        [m for m in await stats.marks(day_of(when), dirty_shard(user_id)) if m.user_id == user_id]
    )


async def test_after_a_roll_up_pass_the_first_read_of_a_busy_day_counts_no_row(
    own_db: Database,
) -> None:
    """Outcomes written in bulk are counted by one roll-up pass; a new process's first read
    of the day then counts no row and is exact, before and after further changes."""
    user_id, batch_id = uuid.uuid4(), uuid_from_time(time.time())
    day, then = batch_day(batch_id), datetime.now(UTC) - timedelta(hours=1)
    writer = StatsStore(own_db, BUCKETS)
    log_ids = [uuid_from_time(time.time()) for _ in range(RECIPIENTS)]  # random nodes
    await _write(writer, user_id, batch_id, log_ids, "success", then)

    behind = StatsStore(own_db, BUCKETS)
    assert await behind.day(user_id, day) == {}  # not rolled up yet: nothing recounted in it
    # In the read's own time: a page per bucket at most. The background recounts it started
    # may already have run while the read awaited its other buckets (CI saw 917 in all).
    assert behind.rows_counted_inline <= BUCKETS * (behind.inline_rows + 1)
    await behind.rolled()  # its background roll-ups, as a busy API process would run them
    assert await _marked(writer, user_id, then) == BUCKETS

    assert await StatsStore(own_db, BUCKETS).roll_due(datetime.now(UTC)) == 0  # all current
    assert await _marked(writer, user_id, then) == 0
    cold = StatsStore(own_db, BUCKETS)
    assert await cold.day(user_id, day) == {"success": RECIPIENTS}
    assert cold.rows_counted == 0

    later = datetime.now(UTC)
    await _write(writer, user_id, batch_id, log_ids[:300], "failed", later, ("bounced",))
    hour_on = later + timedelta(hours=1)  # the pass and the read, an hour after the writes
    roller = StatsStore(own_db, BUCKETS, clock=lambda: hour_on)
    assert await roller.roll_due(hour_on) == BUCKETS
    cold = StatsStore(own_db, BUCKETS, clock=lambda: hour_on)
    assert await cold.day(user_id, day) == {
        "success": RECIPIENTS - 300,
        "failed": 300,
        "bounced": 300,
    }
    assert cold.rows_counted == 0
    assert await _marked(writer, user_id, later) == 0
