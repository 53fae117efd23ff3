"""Per-user daily stats, derived from outcome rows by construction.

The truth is ``stat_rows``: one row per recipient that reached an outcome or earned an
engagement metric (``outcome`` = success | failed, ``bounced``, ``complained``, ``opened``,
``clicked``) and one ``queued`` row per accepted batch, in partitions keyed by (user, UTC day
of the batch, bucket = log id mod B). The recipient's state and its outcome row are written in
one logged batch with the same write timestamp (``shared.delivery.recipients``), so they agree, and
a replayed event rewrites the same cells, so it counts once. The day is the day the recipient's
batch was accepted (cohort stats), so a recipient's row has one home however late its outcome.

Reading a day costs O(buckets) and never recounts a large bucket in the request: each bucket
partition carries its own rollup (static columns: the counts and when they were scanned) and
``dirty_at``, stamped by every write that changes a count. A rollup scanned more than
:data:`SETTLE` after the bucket's last change is current and served. A changed bucket whose
rows fit one small page (:data:`INLINE_ROWS`) is counted from that page in the request; a
larger one is served from its stored rollup (issue 34: the first read of a 10 M-row day
recounted 64 buckets inside the request, 94-118 s). Rollups are kept current ahead of reads:
every write that changes a bucket also marks it in ``stat_dirty`` in the same logged batch,
and the consumers' roll-up pass (:meth:`StatsStore.roll_due`, every :data:`ROLL_EVERY` while
buckets are marked; a writer wakes the roll-ups when it starts marking: :func:`tell_rollups`,
``services.consumers.rollups``) recounts each marked bucket, a large one (its last count read
more than :data:`LARGE_BUCKET` rows) at most once per :data:`LARGE_STALE`, and drops the
mark once the rollup is current. A read therefore lags the writes by at most a pass and a recount
(:data:`LARGE_STALE` and a recount for a large bucket) and is exact once caught up; a read
that finds a large bucket behind also starts its roll-up in the background.
A closed day's totals are kept in ``stat_days`` and stand until a late outcome marks the day
dirty. ``reconcile`` recounts every bucket and repairs rollups from outcome rows, never the
reverse. The bucket count is fixed per keyspace (``layout``): a recipient's bucket never moves.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any, Protocol

import orjson
from cassandra.query import BoundStatement

from shared.core import batch_ids
from shared.infra.db import Database, Row, utc
from shared.infra.leases import STATS_WAKE, Announcer, Notice

log = logging.getLogger(__name__)

#: Metrics, in the order the API lists them.
METRICS = ("queued", "success", "failed", "bounced", "complained", "opened", "clicked")
#: Engagement hits in total (every open and click, however often one recipient makes them),
#: and those made by machines (``shared.engagement.prefetch``), counted in ``engagement_counts``.
TOTALS = ("opens_total", "clicks_total", "machine_opens", "machine_clicks")
#: Metrics an event earns besides its outcome, each a boolean column of its stat row.
EVENT_METRICS = ("bounced", "complained", "opened", "clicked")
#: A day is closed (its totals are kept) once this much of the next day has passed.
CLOSE_AFTER = timedelta(hours=6)
#: Writers mark a day's totals dirty from this long before it closes (a write that saw the
#: day open has landed long before a reader can close it).
CLOSE_MARGIN = timedelta(hours=1)
#: Longest range one stats request may ask for.
MAX_RANGE_DAYS = 366
#: How long after a bucket's last change its rows may still be arriving (a write stamped
#: earlier that is still in flight). A rollup scanned less than this after the last change is
#: recounted on the next read.
SETTLE = timedelta(seconds=30)
#: Rows above which a changed bucket may be served from a count up to LARGE_STALE old.
LARGE_BUCKET = 20_000
LARGE_STALE = timedelta(seconds=60)
#: Partitions per marking day of the index of changed buckets (``stat_dirty``).
DIRTY_SHARDS = 4
#: How often the roll-up pass (:meth:`StatsStore.roll_due`) looks for changed buckets.
ROLL_EVERY = timedelta(seconds=10)
#: Rows a read may count itself: a changed bucket that holds at most this many rows is counted
#: from one page in the request; a larger one is rolled up in the background.
INLINE_ROWS = 100
#: Buckets per user-day unless configured otherwise.
DEFAULT_BUCKETS = 64

#: (user, day) pairs remembered as already recorded as active.
ACTIVE_MEMO = 100_000
#: Partitions a day's active users are spread over (no single hot partition per day).
ACTIVE_BUCKETS = 16


def day_of(when: datetime) -> date:
    return when.astimezone(UTC).date()


def batch_day(batch_id: uuid.UUID) -> date:
    """The UTC day a batch was accepted: where its recipients' stat rows live."""
    return batch_ids.accepted_at(batch_id).date()


def days(start: date, end: date) -> list[date]:
    return [start + timedelta(days=i) for i in range((end - start).days + 1)]


def zero_filled(
    start: date, end: date, counts: Mapping[date, Mapping[str, int]]
) -> list[dict[str, object]]:
    """One row per day in [start, end], with every metric present (zeros for quiet days)."""
    return [
        {
            "date": d.isoformat(),
            **{m: int(counts.get(d, {}).get(m, 0)) for m in (*METRICS, *TOTALS)},
        }
        for d in days(start, end)
    ]


def _day_end(day: date) -> datetime:
    return datetime.combine(day + timedelta(days=1), datetime.min.time(), UTC)


def is_closed(day: date, now: datetime) -> bool:
    return now >= _day_end(day) + CLOSE_AFTER


def closing(day: date, now: datetime) -> bool:
    """Whether a write on ``day`` must mark the day's kept totals dirty."""
    return now >= _day_end(day) + CLOSE_AFTER - CLOSE_MARGIN


def user_bucket(user_id: uuid.UUID, buckets: int = ACTIVE_BUCKETS) -> int:
    """The ``active_user_buckets`` partition of a user (stable: from the id alone)."""
    return user_id.int % buckets


def dirty_shard(user_id: uuid.UUID) -> int:
    """The ``stat_dirty`` shard of a user's marks."""
    return user_id.int % DIRTY_SHARDS


@dataclass(frozen=True, slots=True)
class Mark:
    """A bucket marked changed in ``stat_dirty``, and the write time of its mark."""

    user_id: uuid.UUID
    day: date
    bucket: int
    stamp: int


def bucket_of(key: uuid.UUID, buckets: int) -> int:
    """The stats bucket of a recipient (its log id) or of a batch's ``queued`` row (its id)."""
    # The low 48 bits: the address-derived node of a log id, the random node of a batch id.
    return (key.int & 0xFFFFFFFFFFFF) % buckets


def count_rows(rows: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """A bucket's counts from its rows (pure)."""
    counts: Counter[str] = Counter()
    for row in rows:
        if row.get("queued"):
            counts["queued"] += int(row["queued"])
        outcome = row.get("outcome")
        if outcome in ("success", "failed"):
            counts[outcome] += 1
        for metric in EVENT_METRICS:
            if row.get(metric):
                counts[metric] += 1
    return {m: counts[m] for m in METRICS if counts[m]}


@dataclass(frozen=True, slots=True)
class Rollup:
    counts: dict[str, int]
    scanned_at: datetime
    rows: int = 0
    """Rows the count read (how much a recount of the bucket costs)."""

    def encode(self) -> bytes:
        return orjson.dumps(
            {"counts": self.counts, "scanned_at": self.scanned_at.isoformat(), "rows": self.rows}
        )

    @classmethod
    def decode(cls, raw: bytes | None) -> Rollup | None:
        if not raw:
            return None
        data = orjson.loads(raw)
        return cls(
            dict(data["counts"]), datetime.fromisoformat(data["scanned_at"]), data.get("rows", 0)
        )


def current(rollup: Rollup | None, dirty_at: datetime | None) -> bool:
    """Whether a bucket's (or a day's) rollup still counts every row (pure).

    Nothing ever changed: current (empty). Changed and never scanned: not current. Otherwise
    current when scanned more than :data:`SETTLE` after the last change.
    """
    if dirty_at is None:
        return True
    if rollup is None:
        return False
    return rollup.scanned_at - SETTLE > utc(dirty_at)


def fresh_enough(rollup: Rollup | None, now: datetime) -> bool:
    """Whether a large bucket that changed since its count may still be served from it (pure).

    A bucket of a sender busy right now changes all the time; recounting its rows on every
    read would cost O(recipients). A bucket whose last count read more than
    :data:`LARGE_BUCKET` rows is therefore served from a count at most :data:`LARGE_STALE`
    old; smaller buckets are always recounted when they changed.
    """
    return (
        rollup is not None and rollup.rows > LARGE_BUCKET and now - rollup.scanned_at < LARGE_STALE
    )


class Roll(enum.Enum):
    """What the roll-up pass does with a marked bucket (:func:`roll_step`)."""

    DROP = "drop"
    """Its rollup is current: drop the mark."""
    RECOUNT = "recount"
    """Recount it (then drop the mark if the recount is current)."""
    KEEP = "keep"
    """Leave it marked for a later pass (a large bucket counted less than LARGE_STALE ago, or
    a recount still within SETTLE of the last change)."""


def roll_step(stored: Rollup | None, dirty_at: datetime | None, now: datetime) -> Roll:
    """The roll-up pass's decision for one marked bucket from its rollup and last change
    (pure; asked again with the fresh rollup after a recount, whose RECOUNT means KEEP)."""
    if current(stored, dirty_at):
        return Roll.DROP
    if fresh_enough(stored, now):
        return Roll.KEEP
    return Roll.RECOUNT


def add(totals: Iterable[Mapping[str, int]]) -> dict[str, int]:
    out: Counter[str] = Counter()
    for counts in totals:
        out.update(counts)
    return {m: out[m] for m in METRICS if out[m]}


@dataclass(frozen=True, slots=True)
class Drift:
    """A bucket whose stored rollup differs from the count of its outcome rows."""

    user_id: uuid.UUID
    day: date
    bucket: int
    stored: dict[str, int]
    counted: dict[str, int]


_OUTCOME = (
    "UPDATE stat_rows USING TIMESTAMP ? SET outcome = ? "
    "WHERE user_id = ? AND day = ? AND bucket = ? AND batch_id = ? AND log_id = ?"
)
_QUEUED = (
    "UPDATE stat_rows USING TIMESTAMP ? SET queued = ? "
    "WHERE user_id = ? AND day = ? AND bucket = ? AND batch_id = ? AND log_id = ?"
)
_DIRTY = "UPDATE stat_rows SET dirty_at = ? WHERE user_id = ? AND day = ? AND bucket = ?"
_MARK = (
    "UPDATE stat_dirty SET at = ? "
    "WHERE marked_on = ? AND shard = ? AND user_id = ? AND day = ? AND bucket = ?"
)
_DAY_DIRTY = "UPDATE stat_days SET dirty_at = ? WHERE user_id = ? AND day = ?"


class Stats(Protocol):
    """What callers use of :class:`StatsStore` (the store, or its in-memory twin)."""

    buckets: int
    marked: Callable[[], None]
    marks_seen: int

    async def outcome_statements(
        self,
        user_id: uuid.UUID,
        batch_id: uuid.UUID,
        log_id: uuid.UUID,
        *,
        outcome: str | None,
        stamp: int,
        metrics: Sequence[str] = (),
        now: datetime,
    ) -> list[BoundStatement]: ...

    async def outcomes(
        self,
        user_id: uuid.UUID,
        batch_id: uuid.UUID,
        log_ids: Sequence[uuid.UUID],
        outcome: str,
        stamp: int,
    ) -> None: ...

    async def accepted(
        self, user_id: uuid.UUID, batch_id: uuid.UUID, recipients: int, stamp: int
    ) -> None: ...

    async def accepted_statements(
        self, user_id: uuid.UUID, batch_id: uuid.UUID, recipients: int, stamp: int
    ) -> list[BoundStatement]: ...

    async def cancelled(self, user_id: uuid.UUID, batch_id: uuid.UUID, stamp: int) -> None: ...

    async def activity(self, user_id: uuid.UUID, batch_id: uuid.UUID) -> None: ...

    async def activity_statements(
        self, user_id: uuid.UUID, batch_id: uuid.UUID
    ) -> list[BoundStatement]: ...

    def recorded(self, user_id: uuid.UUID, batch_id: uuid.UUID) -> None: ...

    async def bucket_rows(self, user_id: uuid.UUID, day: date, bucket: int) -> list[Row]: ...

    async def rollup(
        self, user_id: uuid.UUID, day: date, bucket: int
    ) -> tuple[Rollup | None, datetime | None]: ...

    async def recount(self, user_id: uuid.UUID, day: date, bucket: int) -> Rollup: ...

    async def bucket(self, user_id: uuid.UUID, day: date, bucket: int) -> dict[str, int]: ...

    async def marks(self, marked_on: date, shard: int) -> list[Mark]: ...

    async def unmark(self, marked_on: date, shard: int, mark: Mark) -> None: ...

    async def roll_due(self, now: datetime) -> int: ...

    async def rolled(self) -> None: ...

    async def day(self, user_id: uuid.UUID, day: date) -> dict[str, int]: ...

    async def range(
        self, user_id: uuid.UUID, start: date, end: date
    ) -> dict[date, dict[str, int]]: ...

    async def hit(
        self, user_id: uuid.UUID, batch_id: uuid.UUID, kind: str, *, machine: bool
    ) -> None: ...

    async def hits(
        self, user_id: uuid.UUID, start: date, end: date
    ) -> dict[date, dict[str, int]]: ...

    async def user_days(self, user_id: uuid.UUID) -> list[date]: ...

    async def active_users(self, day: date) -> list[uuid.UUID]: ...

    async def reconcile(self, user_id: uuid.UUID, day: date, *, fix: bool) -> list[Drift]: ...


class StatsStore:
    """The one writer of ``stat_rows``, ``stat_days`` and ``active_user_buckets``."""

    def __init__(
        self,
        db: Database,
        buckets: int = DEFAULT_BUCKETS,
        *,
        inline_rows: int = INLINE_ROWS,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.db = db
        #: When this process writes, counts and judges a rollup current (tests set it).
        self.now: Callable[[], datetime] = clock or _utcnow
        self.buckets = buckets
        self.inline_rows = inline_rows
        #: Called as a bucket is marked changed (the services tell the roll-up with it:
        #: ``shared.infra.leases.Notice``).
        self.marked: Callable[[], None] = _unheard
        #: Marks the last :meth:`roll_due` pass found (0: nothing was changed).
        self.marks_seen = 0
        #: Stat rows read by counts, in requests and roll-ups alike (what a read cost).
        self.rows_counted = 0
        #: Of those, the rows reads counted in their callers' time (never more than a page
        #: per bucket); the rest were counted by roll-ups, in the background.
        self.rows_counted_inline = 0
        self._active_memo: set[tuple[uuid.UUID, date]] = set()
        # Background roll-ups in flight, one per bucket: a strong reference keeps each alive.
        self._rolls: dict[tuple[uuid.UUID, date, int], asyncio.Task[Rollup]] = {}

    # -- writes -------------------------------------------------------------------------

    async def outcome_statements(
        self,
        user_id: uuid.UUID,
        batch_id: uuid.UUID,
        log_id: uuid.UUID,
        *,
        outcome: str | None,
        stamp: int,
        metrics: Sequence[str] = (),
        now: datetime,
    ) -> list[BoundStatement]:
        """The writes of one recipient's stat row (its outcome at ``stamp``, the same write
        timestamp as its state, and the metrics it earned) and of the dirty marks they make:
        for a caller to put in the same logged batch as the recipient's state."""
        day, bucket = batch_day(batch_id), bucket_of(log_id, self.buckets)
        key = (user_id, day, bucket, batch_id, log_id)
        out: list[BoundStatement] = []
        if outcome is not None:
            out.append((await self.db.prepare(_OUTCOME)).bind((stamp, outcome, *key)))
        for metric in metrics:
            if metric not in EVENT_METRICS:
                raise ValueError(f"not an event metric: {metric}")
            stmt = await self.db.prepare(
                f"UPDATE stat_rows SET {metric} = true "  # noqa: S608 - checked column
                "WHERE user_id = ? AND day = ? AND bucket = ? AND batch_id = ? AND log_id = ?"
            )
            out.append(stmt.bind(key))
        if out:
            out += await self._dirty(user_id, day, [bucket], now)
        return out

    async def outcomes(
        self,
        user_id: uuid.UUID,
        batch_id: uuid.UUID,
        log_ids: Sequence[uuid.UUID],
        outcome: str,
        stamp: int,
    ) -> None:
        """Outcome rows of many recipients (a chunk given up): one write per bucket."""
        now = self.now()
        day = batch_day(batch_id)
        by_bucket: dict[int, list[uuid.UUID]] = {}
        for log_id in log_ids:
            by_bucket.setdefault(bucket_of(log_id, self.buckets), []).append(log_id)
        update = await self.db.prepare(_OUTCOME)

        async def one(bucket: int, ids: list[uuid.UUID]) -> None:
            stmts = [update.bind((stamp, outcome, user_id, day, bucket, batch_id, i)) for i in ids]
            stmts += await self._dirty(user_id, day, [bucket], now)
            await self.db.batch(stmts)

        await asyncio.gather(*(one(b, ids) for b, ids in by_bucket.items()))
        await self._active(user_id, day)

    async def accepted(
        self, user_id: uuid.UUID, batch_id: uuid.UUID, recipients: int, stamp: int
    ) -> None:
        """A batch's ``queued`` row (written at ``stamp``, the batch header's own)."""
        await self.db.batch(await self.accepted_statements(user_id, batch_id, recipients, stamp))
        await self._active(user_id, batch_day(batch_id))

    async def accepted_statements(
        self, user_id: uuid.UUID, batch_id: uuid.UUID, recipients: int, stamp: int
    ) -> list[BoundStatement]:
        """The writes of :meth:`accepted` but the day's activity, for a caller to send with
        its own (:meth:`activity` records that)."""
        return await self._queued(user_id, batch_id, recipients, stamp)

    async def cancelled(self, user_id: uuid.UUID, batch_id: uuid.UUID, stamp: int) -> None:
        """A batch cancelled after a failed store counts nothing (written above its
        ``queued`` row, so it wins whichever lands last)."""
        await self.db.batch(await self._queued(user_id, batch_id, 0, stamp))

    async def _queued(
        self, user_id: uuid.UUID, batch_id: uuid.UUID, recipients: int, stamp: int
    ) -> list[BoundStatement]:
        day, bucket = batch_day(batch_id), bucket_of(batch_id, self.buckets)
        stmt = (await self.db.prepare(_QUEUED)).bind(
            (stamp, recipients, user_id, day, bucket, batch_id, batch_id)
        )
        return [stmt, *await self._dirty(user_id, day, [bucket], self.now())]

    async def _dirty(
        self, user_id: uuid.UUID, day: date, buckets: Iterable[int], now: datetime
    ) -> list[BoundStatement]:
        stmt, mark = await self.db.prepare(_DIRTY), await self.db.prepare(_MARK)
        marked_on, shard = day_of(now), dirty_shard(user_id)
        self.marked()
        out = []
        for b in buckets:
            out.append(stmt.bind((now, user_id, day, b)))
            out.append(mark.bind((now, marked_on, shard, user_id, day, b)))
        if closing(day, now):
            out.append((await self.db.prepare(_DAY_DIRTY)).bind((now, user_id, day)))
        return out

    async def activity(self, user_id: uuid.UUID, batch_id: uuid.UUID) -> None:
        """Record that the user has stats on the batch's day (idempotent, remembered)."""
        await self._active(user_id, batch_day(batch_id))

    async def activity_statements(
        self, user_id: uuid.UUID, batch_id: uuid.UUID
    ) -> list[BoundStatement]:
        """The writes of :meth:`activity`, for a caller to send with its own (none when this
        process recorded the day already); once they landed, the caller says so
        (:meth:`recorded`)."""
        day = batch_day(batch_id)
        if (user_id, day) in self._active_memo:
            return []
        active = await self.db.prepare(
            "INSERT INTO active_user_buckets (day, bucket, user_id) VALUES (?, ?, ?)"
        )
        listed = await self.db.prepare("INSERT INTO stat_days (user_id, day) VALUES (?, ?)")
        return [active.bind((day, user_bucket(user_id), user_id)), listed.bind((user_id, day))]

    def recorded(self, user_id: uuid.UUID, batch_id: uuid.UUID) -> None:
        """The writes of :meth:`activity_statements` landed: remembered, not written again."""
        self._remember(user_id, batch_day(batch_id))

    async def _active(self, user_id: uuid.UUID, day: date) -> None:
        if (user_id, day) in self._active_memo:
            return
        await asyncio.gather(
            self.db.execute(
                "INSERT INTO active_user_buckets (day, bucket, user_id) VALUES (?, ?, ?)",
                (day, user_bucket(user_id), user_id),
                idempotent=True,
            ),
            self.db.execute(
                "INSERT INTO stat_days (user_id, day) VALUES (?, ?)",
                (user_id, day),
                idempotent=True,
            ),
        )
        self._remember(user_id, day)

    def _remember(self, user_id: uuid.UUID, day: date) -> None:
        if len(self._active_memo) >= ACTIVE_MEMO:
            self._active_memo.clear()
        self._active_memo.add((user_id, day))

    # -- reads --------------------------------------------------------------------------

    async def bucket_rows(self, user_id: uuid.UUID, day: date, bucket: int) -> list[Row]:
        return await self.db.all_pages(
            "SELECT log_id, queued, outcome, bounced, complained, opened, clicked "
            "FROM stat_rows WHERE user_id = ? AND day = ? AND bucket = ?",
            (user_id, day, bucket),
            page_size=5000,
        )

    async def rollup(
        self, user_id: uuid.UUID, day: date, bucket: int
    ) -> tuple[Rollup | None, datetime | None]:
        """A bucket's stored rollup and when it last changed."""
        row = await self.db.one(
            "SELECT dirty_at, rollup FROM stat_rows WHERE user_id = ? AND day = ? AND bucket = ? "
            "LIMIT 1",
            (user_id, day, bucket),
        )
        if row is None:
            return None, None
        return Rollup.decode(row["rollup"]), row["dirty_at"]

    async def recount(self, user_id: uuid.UUID, day: date, bucket: int) -> Rollup:
        """Count a bucket's rows and store the result as its rollup."""
        started = self.now()
        rows = await self.bucket_rows(user_id, day, bucket)
        self.rows_counted += len(rows)
        return await self._store(user_id, day, bucket, Rollup(count_rows(rows), started, len(rows)))

    async def _store(self, user_id: uuid.UUID, day: date, bucket: int, fresh: Rollup) -> Rollup:
        await self.db.execute(
            "UPDATE stat_rows SET rollup = ? WHERE user_id = ? AND day = ? AND bucket = ?",
            (fresh.encode(), user_id, day, bucket),
            idempotent=True,
        )
        return fresh

    async def bucket(self, user_id: uuid.UUID, day: date, bucket: int) -> dict[str, int]:
        """A bucket's counts: its rollup when current; a changed small bucket counted from one
        page; a changed large one served from its last rollup while a background roll-up
        recounts it (never a recount of a large bucket in the caller's time)."""
        return (await self._bucket(user_id, day, bucket))[0]

    async def _bucket(
        self, user_id: uuid.UUID, day: date, bucket: int
    ) -> tuple[dict[str, int], bool]:
        """:meth:`bucket`, and whether its counts are behind a roll-up still to run."""
        stored, dirty_at = await self.rollup(user_id, day, bucket)
        served = stored.counts if stored else {}
        if current(stored, dirty_at) or fresh_enough(stored, self.now()):
            return served, False
        key = (user_id, day, bucket)
        if key in self._rolls or (stored is not None and stored.rows > self.inline_rows):
            self._roll(key)
            return served, True
        started = self.now()
        page = await self.db.execute(
            "SELECT log_id, queued, outcome, bounced, complained, opened, clicked "
            "FROM stat_rows WHERE user_id = ? AND day = ? AND bucket = ?",
            (user_id, day, bucket),
            page_size=self.inline_rows + 1,
        )
        self.rows_counted += len(page.rows)
        self.rows_counted_inline += len(page.rows)
        if page.paging_state is not None or len(page.rows) > self.inline_rows:
            self._roll(key)
            return served, True
        fresh = Rollup(count_rows(page.rows), started, len(page.rows))
        return (await self._store(user_id, day, bucket, fresh)).counts, False

    def _roll(self, key: tuple[uuid.UUID, date, int]) -> None:
        """Recount a bucket in the background unless a roll-up of it is already running."""
        if key in self._rolls:
            return
        task = asyncio.create_task(self.recount(*key), name=f"stats-roll-{key[0]}-{key[2]}")
        self._rolls[key] = task
        task.add_done_callback(lambda t: self._rolled(key, t))

    def _rolled(self, key: tuple[uuid.UUID, date, int], task: asyncio.Task[Rollup]) -> None:
        self._rolls.pop(key, None)
        if not task.cancelled() and task.exception() is not None:
            # The bucket stays changed: the next read starts another roll-up.
            log.warning("stats roll-up of %s failed: %r", key, task.exception())

    async def marks(self, marked_on: date, shard: int) -> list[Mark]:
        """The buckets marked changed on ``marked_on`` in ``shard``."""
        rows = await self.db.all_pages(
            "SELECT user_id, day, bucket, WRITETIME(at) AS stamp FROM stat_dirty "
            "WHERE marked_on = ? AND shard = ?",
            (marked_on, shard),
        )
        return [Mark(r["user_id"], _date(r["day"]), r["bucket"], r["stamp"]) for r in rows]

    async def unmark(self, marked_on: date, shard: int, mark: Mark) -> None:
        """Delete a mark as of its own write time: a mark written again since survives."""
        await self.db.execute(
            "DELETE FROM stat_dirty USING TIMESTAMP ? WHERE marked_on = ? AND shard = ? "
            "AND user_id = ? AND day = ? AND bucket = ?",
            (mark.stamp, marked_on, shard, mark.user_id, mark.day, mark.bucket),
            idempotent=True,
        )

    async def roll_due(self, now: datetime) -> int:
        """One roll-up pass: recount every bucket marked changed today or yesterday whose
        rollup is not current (a large one at most once per :data:`LARGE_STALE`), and drop
        the marks of buckets now current. Idempotent: any number of processes may run it.
        Returns the buckets recounted."""
        recounted = seen = 0
        for marked_on in (day_of(now) - timedelta(days=1), day_of(now)):
            for shard in range(DIRTY_SHARDS):
                for mark in await self.marks(marked_on, shard):
                    seen += 1
                    key = (mark.user_id, mark.day, mark.bucket)
                    stored, dirty_at = await self.rollup(*key)
                    step = roll_step(stored, dirty_at, now)
                    if step is Roll.RECOUNT:
                        stored = await self.recount(*key)
                        recounted += 1
                        step = roll_step(stored, dirty_at, now)
                    if step is Roll.DROP:
                        await self.unmark(marked_on, shard, mark)
        self.marks_seen = seen
        return recounted

    async def rolled(self) -> None:
        """Wait for the background roll-ups running now (tests, the bench, a clean stop)."""
        while self._rolls:
            await asyncio.gather(*self._rolls.values(), return_exceptions=True)

    async def day(self, user_id: uuid.UUID, day: date) -> dict[str, int]:
        """A day's counts: every bucket, read in parallel."""
        return (await self._day(user_id, day))[0]

    async def _day(self, user_id: uuid.UUID, day: date) -> tuple[dict[str, int], bool]:
        """:meth:`day`, and whether any bucket's counts are behind a roll-up still to run."""
        parts = await asyncio.gather(*(self._bucket(user_id, day, b) for b in range(self.buckets)))
        return add(p[0] for p in parts), any(p[1] for p in parts)

    async def range(self, user_id: uuid.UUID, start: date, end: date) -> dict[date, dict[str, int]]:
        """Counts for every day of the range with traffic: a closed day's kept totals while
        they stand, its buckets otherwise."""
        rows = await self.db.rows(
            "SELECT day, dirty_at, totals FROM stat_days WHERE user_id = ? AND day >= ? "
            "AND day <= ?",
            (user_id, start, end),
        )

        async def one(row: Row) -> tuple[date, dict[str, int]]:
            d = _date(row["day"])
            kept = Rollup.decode(row["totals"])
            if (
                kept is not None
                and is_closed(d, kept.scanned_at - SETTLE)
                and current(kept, row["dirty_at"])
            ):
                return d, kept.counts
            started = self.now()
            counts, behind = await self._day(user_id, d)
            # A day's totals are kept only from buckets all counted (none behind a roll-up).
            if not behind and is_closed(d, started - SETTLE):
                await self.db.execute(
                    "UPDATE stat_days SET totals = ? WHERE user_id = ? AND day = ?",
                    (Rollup(counts, started).encode(), user_id, d),
                    idempotent=True,
                )
            return d, counts

        found, hits = await asyncio.gather(
            asyncio.gather(*(one(r) for r in rows)), self.hits(user_id, start, end)
        )
        counts = dict(found)
        for d, totals in hits.items():
            counts[d] = {**counts.get(d, {}), **totals}
        return counts

    async def hit(
        self, user_id: uuid.UUID, batch_id: uuid.UUID, kind: str, *, machine: bool
    ) -> None:
        """One more open or click (``kind``) in the totals of the batch's day. Counters: a
        replayed provider event counts again (totals are hits as received)."""
        metrics = ["opens_total" if kind == "opened" else "clicks_total"]
        if machine:
            metrics.append("machine_opens" if kind == "opened" else "machine_clicks")
        day = batch_day(batch_id)
        await asyncio.gather(
            *(
                self.db.execute(
                    "UPDATE engagement_counts SET hits = hits + 1 WHERE user_id = ? AND day = ? "
                    "AND metric = ?",
                    (user_id, day, metric),
                )
                for metric in metrics
            )
        )

    async def hits(self, user_id: uuid.UUID, start: date, end: date) -> dict[date, dict[str, int]]:
        """The engagement totals of each day of the range that has any."""
        rows = await self.db.rows(
            "SELECT day, metric, hits FROM engagement_counts WHERE user_id = ? AND day IN ?",
            (user_id, days(start, end)),
        )
        found: dict[date, dict[str, int]] = {}
        for row in rows:
            found.setdefault(_date(row["day"]), {})[row["metric"]] = int(row["hits"] or 0)
        return found

    async def user_days(self, user_id: uuid.UUID) -> list[date]:
        rows = await self.db.all_pages("SELECT day FROM stat_days WHERE user_id = ?", (user_id,))
        return [_date(r["day"]) for r in rows]

    async def active_users(self, day: date) -> list[uuid.UUID]:
        """Every user with stats on ``day``: its buckets read in parallel, and the index of
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

    # -- reconcile ----------------------------------------------------------------------

    async def reconcile(self, user_id: uuid.UUID, day: date, *, fix: bool) -> list[Drift]:
        """Recount each bucket of a user-day from its rows, one bucket in memory at a time;
        with ``fix``, store the recount as the bucket's rollup (and drop the day's kept
        totals, recomputed on the next read)."""
        drifts = []
        for bucket in range(self.buckets):
            stored, dirty_at = await self.rollup(user_id, day, bucket)
            if not current(stored, dirty_at):
                # Changed since its last count: the next read recounts it anyway.
                if fix:
                    await self.recount(user_id, day, bucket)
                continue
            counted = count_rows(await self.bucket_rows(user_id, day, bucket))
            have = stored.counts if stored else {}
            if have != counted:
                drifts.append(Drift(user_id, day, bucket, have, counted))
                if fix:
                    await self.recount(user_id, day, bucket)
        if fix and drifts:
            await self.db.execute(
                "UPDATE stat_days SET totals = null, dirty_at = ? WHERE user_id = ? AND day = ?",
                (self.now(), user_id, day),
                idempotent=True,
            )
        return drifts


def tell_rollups(stats: Stats, broker: Announcer) -> Stats:
    """``stats``, telling every process's roll-up when it marks buckets changed (a wake-up
    at its first mark and at most one per :data:`ROLL_EVERY` after: ``shared.infra.leases``)."""
    stats.marked = Notice(broker, STATS_WAKE, ROLL_EVERY.total_seconds()).touch
    return stats


def _unheard() -> None:
    """No one is told of marks (tools, tests)."""


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _date(value: Any) -> date:
    """A ``date`` column as read (the driver returns its own ``Date`` type)."""
    out: date = value.date() if hasattr(value, "date") else value
    return out
