"""``safedelivr stats reconcile --day D``: recount a day's stats from its outcome rows.

Outcome rows are the truth (written in the same logged batch as each recipient's state, see
``shared.delivery.recipients``); rollups are derived from them. Reconciling a day walks each user's
buckets one at a time (bounded memory: one bucket's rows), reports every bucket whose rollup
claims to be current yet disagrees with its rows, and with ``fix`` stores the recount as the
rollup, never the reverse.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import UTC, date, datetime, timedelta

from cassandra.util import min_uuid_from_time

from shared.delivery.stats import DEFAULT_BUCKETS, Drift, StatsStore
from shared.infra.db import Database


async def day_batches(db: Database, user_id: uuid.UUID, day: date) -> list[uuid.UUID]:
    """The batches a user had accepted on ``day``."""
    start = datetime.combine(day, datetime.min.time(), UTC)
    end = start + timedelta(days=1)
    rows = await db.all_pages(
        "SELECT batch_id FROM batches_by_user WHERE user_id = ? AND month = ? "
        "AND batch_id >= ? AND batch_id < ?",
        (
            user_id,
            day.strftime("%Y-%m"),
            min_uuid_from_time(start.timestamp()),
            min_uuid_from_time(end.timestamp()),  # up to midnight, its last 100 ns included
        ),
    )
    return [r["batch_id"] for r in rows]


async def reconcile_day(
    db: Database,
    day: date,
    *,
    fix: bool = False,
    users: Iterable[uuid.UUID] | None = None,
    buckets: int = DEFAULT_BUCKETS,
) -> list[Drift]:
    """Compare (and with ``fix`` repair) ``day`` for ``users``, or for every user if None."""
    stats = StatsStore(db, buckets)
    if users is None:
        scope = set(await stats.active_users(day))
        scope |= {r["user_id"] for r in await db.all_pages("SELECT user_id FROM users")}
    else:
        scope = set(users)
    drifts: list[Drift] = []
    for user_id in sorted(scope, key=str):
        drifts += await stats.reconcile(user_id, day, fix=fix)
    return drifts
