"""Per-user daily stats as an exact ledger: marks per (metric, recipient), counted on read.

A mark is a row ``(user, UTC day, metric, log_id)``; writing it again changes nothing, so an
event delivered ten times (or concurrently) counts once and a recipient counts once per
metric however often it failed over. The day is the day the recipient's batch was accepted
(cohort stats: of the recipients queued on a day, how many succeeded, failed, bounced...),
so a recipient's marks have one home however late its outcome arrives. The outcome marks
(``success``, ``failed``) mirror the recipient's state: each outcome write sets its mark and
deletes the other one with the same write timestamp as the state (``shared.recipients``), so
a late ``delivered`` after a give-up moves the recipient from ``failed`` to ``success``.
Counting a day is a ``GROUP BY`` over one partition; closed days are rolled up into
``daily_stats`` the first time they are read.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, date, datetime, timedelta

from cassandra.query import BatchStatement, BatchType

from shared import precedence
from shared.db import Database

#: Metrics, in the order the API lists them.
METRICS = ("queued", "success", "failed", "bounced", "complained", "opened", "clicked")
#: A day is closed (and rolled up) once this much of the next day has passed.
CLOSE_AFTER = timedelta(hours=6)
#: Longest range one stats request may ask for.
MAX_RANGE_DAYS = 366


#: The two outcome metrics, each the other's opposite.
OUTCOMES = {"success": "failed", "failed": "success"}


def day_of(when: datetime) -> date:
    return when.astimezone(UTC).date()


def batch_day(batch_id: uuid.UUID) -> date:
    """The UTC day a batch was accepted: where its recipients' marks live."""
    return precedence.accepted_at(batch_id).date()


def days(start: date, end: date) -> list[date]:
    return [start + timedelta(days=i) for i in range((end - start).days + 1)]


def zero_filled(
    start: date, end: date, counts: Mapping[date, Mapping[str, int]]
) -> list[dict[str, object]]:
    """One row per day in [start, end], with every metric present (zeros for quiet days)."""
    return [
        {"date": d.isoformat(), **{m: int(counts.get(d, {}).get(m, 0)) for m in METRICS}}
        for d in days(start, end)
    ]


def is_closed(day: date, now: datetime) -> bool:
    return now >= datetime.combine(day + timedelta(days=1), datetime.min.time(), UTC) + CLOSE_AFTER


#: (user, day) pairs remembered as already recorded as active.
ACTIVE_MEMO = 100_000
#: Partitions a day's active users are spread over (no single hot partition per day).
ACTIVE_BUCKETS = 16


def user_bucket(user_id: uuid.UUID, buckets: int = ACTIVE_BUCKETS) -> int:
    """The ``active_user_buckets`` partition of a user (stable: from the id alone)."""
    return user_id.int % buckets


class StatsStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        self._active_memo: set[tuple[uuid.UUID, date]] = set()

    async def mark(
        self, user_id: uuid.UUID, batch_id: uuid.UUID, metric: str, keys: Iterable[uuid.UUID]
    ) -> None:
        """Record ``metric`` for each recipient (log id) of a batch, on the batch's day."""
        day = batch_day(batch_id)
        stmt = await self.db.prepare(
            "INSERT INTO stat_marks (user_id, day, metric, key) VALUES (?, ?, ?, ?)"
        )
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        batch.is_idempotent = True
        for key in keys:
            batch.add(stmt, (user_id, day, metric, str(key)))
        if len(batch):
            await self.db.execute(batch)
        await self._active(user_id, day)

    async def outcome(
        self,
        user_id: uuid.UUID,
        batch_id: uuid.UUID,
        log_ids: Iterable[uuid.UUID],
        metric: str,
        stamp: int,
    ) -> None:
        """Mirror recipients' outcome (``success`` or ``failed``) written at ``stamp``.

        Sets the outcome's mark and deletes the opposite one at the same timestamp, so the
        latest outcome by the precedence rule is the only one counted.
        """
        day = batch_day(batch_id)
        add = await self.db.prepare(
            "INSERT INTO stat_marks (user_id, day, metric, key) VALUES (?, ?, ?, ?) "
            "USING TIMESTAMP ?"
        )
        remove = await self.db.prepare(
            "DELETE FROM stat_marks USING TIMESTAMP ? "
            "WHERE user_id = ? AND day = ? AND metric = ? AND key = ?"
        )
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        batch.is_idempotent = True
        for log_id in log_ids:
            batch.add(add, (user_id, day, metric, str(log_id), stamp))
            batch.add(remove, (stamp, user_id, day, OUTCOMES[metric], str(log_id)))
        if len(batch):
            await self.db.execute(batch)
        await self._active(user_id, day)

    async def _active(self, user_id: uuid.UUID, day: date) -> None:
        if (user_id, day) in self._active_memo:
            return
        await self.db.execute(
            "INSERT INTO active_user_buckets (day, bucket, user_id) VALUES (?, ?, ?)",
            (day, user_bucket(user_id), user_id),
            idempotent=True,
        )
        if len(self._active_memo) >= ACTIVE_MEMO:
            self._active_memo.clear()
        self._active_memo.add((user_id, day))

    async def count_day(self, user_id: uuid.UUID, day: date) -> dict[str, int]:
        rows = await self.db.rows(
            "SELECT metric, COUNT(*) AS n FROM stat_marks WHERE user_id = ? AND day = ? "
            "GROUP BY metric",
            (user_id, day),
            timeout=60,
        )
        return {r["metric"]: int(r["n"]) for r in rows}

    async def range(self, user_id: uuid.UUID, start: date, end: date) -> dict[date, dict[str, int]]:
        """Counts for every day of the range: rollups for closed days, live counts otherwise."""
        now = datetime.now(UTC)
        rollups = {
            r["day"].date() if hasattr(r["day"], "date") else r["day"]: dict(r["counts"] or {})
            for r in await self.db.rows(
                "SELECT day, counts FROM daily_stats WHERE user_id = ? AND day >= ? AND day <= ?",
                (user_id, start, end),
            )
        }
        out: dict[date, dict[str, int]] = {}
        for d in days(start, end):
            if d in rollups:
                out[d] = rollups[d]
                continue
            counts = await self.count_day(user_id, d)
            if is_closed(d, now):
                await self.store_rollup(user_id, d, counts)
            out[d] = counts
        return out

    async def store_rollup(self, user_id: uuid.UUID, day: date, counts: Mapping[str, int]) -> None:
        await self.db.execute(
            "INSERT INTO daily_stats (user_id, day, counts, computed_at) VALUES (?, ?, ?, ?)",
            (user_id, day, dict(counts), datetime.now(UTC)),
            idempotent=True,
        )

    async def active_users(self, day: date) -> list[uuid.UUID]:
        """Every user with a stat on ``day``: its buckets read in parallel, and the index of
        releases before the buckets (days recorded then are still found)."""
        parts = await asyncio.gather(
            *(
                self.db.all_pages(
                    "SELECT user_id FROM active_user_buckets WHERE day = ? AND bucket = ?",
                    (day, bucket),
                )
                for bucket in range(ACTIVE_BUCKETS)
            ),
            self.db.all_pages("SELECT user_id FROM active_users WHERE day = ?", (day,)),
        )
        return sorted({r["user_id"] for rows in parts for r in rows}, key=str)

    async def keys(self, user_id: uuid.UUID, day: date, metric: str) -> set[str]:
        rows = await self.db.all_pages(
            "SELECT key FROM stat_marks WHERE user_id = ? AND day = ? AND metric = ?",
            (user_id, day, metric),
        )
        return {r["key"] for r in rows}
