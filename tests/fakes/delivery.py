"""Twins of the stores of :mod:`shared.delivery`: batches, recipients, stats and attempts
(their rows in :class:`tests.fakes.cassandra.FakeCassandra`), domain volumes, the outbox
and the schedule.

In-memory twin of :class:`shared.delivery.schedule_store.ScheduleStore`: the batches waiting in
the minute they are due, and each namespace's lease and cursor.

It keeps what the scheduler depends on: every round trip yields to the event loop; the lease
is a lightweight transaction on a cell with a TTL, so a holder is the only one until it
releases the lease or the TTL passes on the twin's :class:`Clock` (which a test moves); the
cursor moves only under ``IF owner = ?``; rows read back in Cassandra's order (minutes oldest
first, each minute's batches in ``timeuuid`` order) with timestamps at Cassandra's precision
(UTC, milliseconds); a row expires with the table's ``default_time_to_live``.
``tests/contracts/test_schedule_store.py`` runs one suite over this twin and the real store.

The outbox (:class:`FakeOutbox`) lives in the tables of
:class:`tests.fakes.cassandra.FakeCassandra` and makes the round trips the real store makes: a
row is written by the batch's own logged batch (its ``statement`` is applied by
``FakeBatches.write``), marked published by one write, and listed per (minute, shard)
partition. ``tests/contracts/test_acceptance_stores.py`` holds it to the real store.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from functools import partial
from typing import Any, Final

from shared.core import batch_ids, lanes
from shared.core.errors import DependencyUnavailable
from shared.core.lanes import BUCKET
from shared.core.models import Message
from shared.delivery import precedence
from shared.delivery.attempts import COLUMNS, Attempt, Attempts, from_row
from shared.delivery.batchstore import (
    INLINE_BYTES,
    STATEMENT_BYTES,
    STORED_STATUS_STAMP,
    Batches,
    BatchHeader,
    Content,
    NewBatch,
    _header_stamp,
    content_of,
    month_of,
    shown_status,
)
from shared.delivery.domain_capacity import HISTORY_DAYS, OUTCOMES, DayVolume, Volumes
from shared.delivery.outbox import Outbox, OutboxRows, minute_of
from shared.delivery.recipients import (
    CHUNK_ROW,
    Recipients,
    Report,
    Selection,
    by_chunk,
    decode_recipients,
    log_id_for,
    merged_chunk,
    merged_one,
    timeuuid_order,
)
from shared.delivery.schedule_store import MAX_MINUTES, Due, Schedules
from shared.delivery.stats import (
    DEFAULT_BUCKETS,
    DIRTY_SHARDS,
    EVENT_METRICS,
    INLINE_ROWS,
    SETTLE,
    Drift,
    Mark,
    Roll,
    Rollup,
    Stats,
    add,
    batch_day,
    bucket_of,
    closing,
    count_rows,
    current,
    day_of,
    dirty_shard,
    fresh_enough,
    is_closed,
    roll_step,
    user_bucket,
)
from shared.infra.db import slices
from tests.fakes.cassandra import (
    OTHER_ROW_BYTES,
    Cell,
    Cells,
    Clock,
    FakeCassandra,
    Write,
    as_stored,
    ms,
)
from tests.fakes.wire import LOOPBACK, Wire, round_trip


class FakeBatches(Batches):
    """Twin of :class:`shared.delivery.batchstore.BatchStore`."""

    def __init__(self, db: FakeCassandra, stats: FakeStats | None = None) -> None:
        self.db = db
        self.stats = stats or FakeStats(db)

    async def write(
        self,
        batch: NewBatch,
        *,
        also: Sequence[Write] = (),
        content: Content | None = None,
        indexed: bool = False,
    ) -> None:
        """As the real store: a large batch's content in statements on its partition alone
        (one round trip each, ``batches.content``), then its header with ``also`` (other
        twins' writes, as the real store sends other partitions' statements), its indexes
        when ``indexed`` and a small batch's content (at most ``INLINE_BYTES``) in one
        logged batch (``batches.write``): all of that lands, or none."""
        content = content if content is not None else content_of(batch)
        sizes = [len(content.message) + len(content.response), *map(len, content.chunks)]
        inline = content.size <= INLINE_BYTES
        for run in [] if inline else slices(sizes, STATEMENT_BYTES):
            failure = await self.db._before("batches.content")
            self.db.refuse_oversized([sum(sizes[i] for i in run)])
            for i in run:
                self._content(batch, content, i)
            self.db._after(failure)
        failure = await self.db._before("batches.write")
        own = len(batch.message.subject.encode()) + 64 + (content.size if inline else 0)
        others = len(also) + (3 if indexed else 0)
        self.db.refuse_oversized([own] + [OTHER_ROW_BYTES] * others)
        if inline:
            for i in range(len(sizes)):
                self._content(batch, content, i)
        header = self.db.headers.setdefault(batch.batch_id, Cells())
        header.insert(
            {
                "user_id": batch.user_id,
                "created_at": batch_ids.accepted_at(batch.batch_id),
                "subject": batch.message.subject,
                "recipient_count": len(batch.recipients),
                "chunk_size": batch.chunk_size,
                "chunk_count": batch.chunk_count,
                "send_at": batch.send_at,
            },
            _header_stamp(batch.batch_id),
        )
        header.put("status", batch.status, STORED_STATUS_STAMP)
        if indexed:
            self._listed(
                batch.batch_id, batch.user_id, batch.message.subject, len(batch.recipients)
            )
            self.db.apply(
                await self.stats.accepted_statements(
                    batch.user_id,
                    batch.batch_id,
                    len(batch.recipients),
                    _header_stamp(batch.batch_id),
                )
            )
            self.db.apply(await self.stats.activity_statements(batch.user_id, batch.batch_id))
        self.db.apply(also)
        self.db._after(failure)
        if indexed:
            self.stats.recorded(batch.user_id, batch.batch_id)

    def _content(self, batch: NewBatch, content: Content, index: int) -> None:
        """The ``index``-th value of the content: 0 the message and 202, then each chunk's
        list."""
        if index == 0:
            header = self.db.headers.setdefault(batch.batch_id, Cells())
            stored = {"message": content.message, "accept_response": content.response or None}
            header.insert(stored, _header_stamp(batch.batch_id))
            return
        queued = precedence.queued_stamp(batch.batch_id)
        listed = {"recipients": content.chunks[index - 1]}
        self.db.insert(batch.batch_id, index - 1, CHUNK_ROW, listed, queued)

    async def index(self, batch: NewBatch) -> None:
        failure = await self.db._before("batches.index")
        await self._index(
            batch.batch_id, batch.user_id, batch.message.subject, len(batch.recipients)
        )
        self.db._after(failure)

    async def index_stored(self, header: BatchHeader) -> None:
        failure = await self.db._before("batches.index_stored")
        await self._index(
            header.batch_id, header.user_id, header.message.subject, header.recipient_count
        )
        self.db._after(failure)

    async def _index(
        self, batch_id: uuid.UUID, user_id: uuid.UUID, subject: str, recipients: int
    ) -> None:
        self._listed(batch_id, user_id, subject, recipients)
        await self.stats.accepted(user_id, batch_id, recipients, _header_stamp(batch_id))

    def _listed(
        self, batch_id: uuid.UUID, user_id: uuid.UUID, subject: str, recipients: int
    ) -> None:
        self.db.by_user[(user_id, month_of(batch_id))][batch_id] = {
            "subject": subject,
            "recipient_count": recipients,
        }

    async def uncount(self, user_id: uuid.UUID, batch_id: uuid.UUID) -> None:
        failure = await self.db._before("batches.uncount")
        await self.stats.cancelled(user_id, batch_id, _header_stamp(batch_id) + 1)
        self.db._after(failure)

    async def header(self, batch_id: uuid.UUID) -> BatchHeader | None:
        self.db._after(await self.db._before("batches.header"))
        h = self.db.headers.get(batch_id)
        if h is None or h.get("created_at") is None or h.get("message") is None:
            return None
        return BatchHeader(
            batch_id=batch_id,
            user_id=h.get("user_id"),
            created_at=h.get("created_at").replace(tzinfo=UTC),
            message=Message.decode(h.get("message")),
            recipient_count=h.get("recipient_count"),
            chunk_size=h.get("chunk_size"),
            chunk_count=h.get("chunk_count"),
            status=shown_status(h.get("status"), h.get("dispatched")) or "incomplete",
            reason=h.get("reason"),
            response=h.get("accept_response"),
            send_at=h.get("send_at"),
        )

    async def commit(
        self, batch_id: uuid.UUID, status: str, *, timeout: float | None = None
    ) -> str | None:
        return await self._transition(batch_id, ("pending",), status, "batches.commit")

    async def cancel(self, batch_id: uuid.UUID) -> str | None:
        return await self._transition(batch_id, (None, "pending"), "cancelled", "batches.cancel")

    async def start_scheduled(self, batch_id: uuid.UUID) -> str | None:
        return await self._transition(
            batch_id, ("scheduled",), "accepted", "batches.start_scheduled"
        )

    async def cancel_scheduled(self, batch_id: uuid.UUID) -> str | None:
        return await self._transition(
            batch_id, ("scheduled",), "cancelled", "batches.cancel_scheduled"
        )

    async def _transition(
        self, batch_id: uuid.UUID, expected: tuple[str | None, ...], status: str, op: str
    ) -> str | None:
        """``UPDATE ... IF status = ...``: applied when the status read at SERIAL is one of
        ``expected`` (a missing partition reads null), written at the transaction's ballot;
        it answers ``status`` when applied (whatever a read sees after), else the status
        it read."""
        failure = await self.db._before(op)
        h = self.db.headers.get(batch_id)
        current = h.get("status") if h is not None else None
        applied = current in expected
        if applied:
            h = self.db.headers.setdefault(batch_id, Cells())
            stamp = self.db.ballot()
            h.put("status", status, stamp)
            h.put("updated_at", self.db.now() + self.db.server_offset, stamp)
        self.db._after(failure)
        return status if applied else current

    async def owner(self, batch_id: uuid.UUID) -> uuid.UUID | None:
        self.db._after(await self.db._before("batches.owner"))
        h = self.db.headers.get(batch_id)
        return h.get("user_id") if h else None

    async def status(self, batch_id: uuid.UUID) -> str | None:
        self.db._after(await self.db._before("batches.status"))
        h = self.db.headers.get(batch_id)
        if h is None or h.get("created_at") is None:
            return None
        return shown_status(h.get("status"), h.get("dispatched"))

    async def mark_dispatched(self, batch_id: uuid.UUID) -> None:
        failure = await self.db._before("batches.mark_dispatched")
        self.db.headers.setdefault(batch_id, Cells()).put("dispatched", True, self.db.stamp())
        self.db._after(failure)


class FakeStats(Stats):
    """Twin of :class:`shared.delivery.stats.StatsStore`: ``stat_rows`` partitions of cells, counted
    and judged by the production functions."""

    def __init__(
        self, db: FakeCassandra, buckets: int = DEFAULT_BUCKETS, *, inline_rows: int = INLINE_ROWS
    ) -> None:
        self.db = db
        self.buckets = buckets
        self.inline_rows = inline_rows
        self.rows_counted = 0
        self.rows_counted_inline = 0
        self.marked: Callable[[], None] = lambda: None
        self.marks_seen = 0
        self._active_memo: set[tuple[uuid.UUID, date]] = set()
        # Background roll-ups not yet run (the real store's tasks; :meth:`rolled` runs them).
        self._rolls: dict[tuple[uuid.UUID, date, int], None] = {}

    # -- cells ---------------------------------------------------------------------------

    def _put(
        self,
        user_id: uuid.UUID,
        day: date,
        bucket: int,
        batch_id: uuid.UUID,
        log_id: uuid.UUID,
        column: str,
        value: Any,
        stamp: int | None,
    ) -> None:
        """A stat row's cell, at ``stamp`` (None: at the time it is applied)."""
        cells = self.db.stat_rows[(user_id, day, bucket)].rows.setdefault(
            (batch_id, log_id), Cells()
        )
        cells.put(column, value, self.db.stamp() if stamp is None else stamp)

    def _static(self, user_id: uuid.UUID, day: date, bucket: int, column: str, value: Any) -> None:
        self.db.stat_rows[(user_id, day, bucket)].static.put(column, value, self.db.stamp())

    def _mark(self, user_id: uuid.UUID, day: date, bucket: int, now: datetime) -> None:
        marks = self.db.stat_dirty[(day_of(now), dirty_shard(user_id))]
        marks[(user_id, day, bucket)].put("at", now, self.db.stamp())

    def _day_put(self, user_id: uuid.UUID, day: date, column: str, value: Any) -> None:
        self.db.stat_days[(user_id, day)].put(column, value, self.db.stamp())

    def _dirty(
        self, user_id: uuid.UUID, day: date, buckets: Iterable[int], now: datetime
    ) -> list[Write]:
        self.marked()
        out: list[Write] = []
        for b in buckets:
            out.append(partial(self._static, user_id, day, b, "dirty_at", now))
            out.append(partial(self._mark, user_id, day, b, now))
        if closing(day, now):
            out.append(partial(self._day_put, user_id, day, "dirty_at", now))
        return out

    # -- writes --------------------------------------------------------------------------

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
    ) -> list[Write]:
        day, bucket = batch_day(batch_id), bucket_of(log_id, self.buckets)
        key = (user_id, day, bucket, batch_id, log_id)
        out: list[Write] = []
        if outcome is not None:
            out.append(partial(self._put, *key, "outcome", outcome, stamp))
        for metric in metrics:
            if metric not in EVENT_METRICS:
                raise ValueError(f"not an event metric: {metric}")
            out.append(partial(self._put, *key, metric, True, None))
        if out:
            out += self._dirty(user_id, day, [bucket], now)
        return out

    async def outcomes(
        self,
        user_id: uuid.UUID,
        batch_id: uuid.UUID,
        log_ids: Sequence[uuid.UUID],
        outcome: str,
        stamp: int,
    ) -> None:
        failure = await self.db._before("stats.outcomes")
        now, day = self.db.now(), batch_day(batch_id)
        by_bucket: dict[int, list[uuid.UUID]] = {}
        for log_id in log_ids:
            by_bucket.setdefault(bucket_of(log_id, self.buckets), []).append(log_id)
        for bucket, ids in by_bucket.items():
            writes = [
                partial(self._put, user_id, day, bucket, batch_id, i, "outcome", outcome, stamp)
                for i in ids
            ]
            self.db.apply([*writes, *self._dirty(user_id, day, [bucket], now)])
        self._active(user_id, day)
        self.db._after(failure)

    async def accepted(
        self, user_id: uuid.UUID, batch_id: uuid.UUID, recipients: int, stamp: int
    ) -> None:
        failure = await self.db._before("stats.accepted")
        self._queued(user_id, batch_id, recipients, stamp)
        self._active(user_id, batch_day(batch_id))
        self.db._after(failure)

    async def accepted_statements(
        self, user_id: uuid.UUID, batch_id: uuid.UUID, recipients: int, stamp: int
    ) -> list[Write]:
        return [partial(self._queued, user_id, batch_id, recipients, stamp)]

    async def cancelled(self, user_id: uuid.UUID, batch_id: uuid.UUID, stamp: int) -> None:
        failure = await self.db._before("stats.cancelled")
        self._queued(user_id, batch_id, 0, stamp)
        self.db._after(failure)

    def _queued(self, user_id: uuid.UUID, batch_id: uuid.UUID, recipients: int, stamp: int) -> None:
        day, bucket = batch_day(batch_id), bucket_of(batch_id, self.buckets)
        self._put(user_id, day, bucket, batch_id, batch_id, "queued", recipients, stamp)
        self.db.apply(self._dirty(user_id, day, [bucket], self.db.now()))

    async def activity(self, user_id: uuid.UUID, batch_id: uuid.UUID) -> None:
        if (user_id, batch_day(batch_id)) in self._active_memo:
            return  # remembered: no round trip, as in the real store
        failure = await self.db._before("stats.activity")
        self._active(user_id, batch_day(batch_id))
        self.db._after(failure)

    async def activity_statements(self, user_id: uuid.UUID, batch_id: uuid.UUID) -> list[Write]:
        day = batch_day(batch_id)
        if (user_id, day) in self._active_memo:
            return []
        return [partial(self._record, user_id, day)]

    def recorded(self, user_id: uuid.UUID, batch_id: uuid.UUID) -> None:
        self._active_memo.add((user_id, batch_day(batch_id)))

    def _active(self, user_id: uuid.UUID, day: date) -> None:
        if (user_id, day) in self._active_memo:
            return
        self._record(user_id, day)
        self._active_memo.add((user_id, day))

    def _record(self, user_id: uuid.UUID, day: date) -> None:
        """The day's activity rows (``active_user_buckets``, ``stat_days``)."""
        self.db.active[(day, user_bucket(user_id))].add(user_id)
        self.db.stat_days[(user_id, day)].insert({}, self.db.stamp())

    # -- reads ---------------------------------------------------------------------------

    def _rows(self, user_id: uuid.UUID, day: date, bucket: int) -> list[dict[str, Any]]:
        part = self.db.stat_rows.get((user_id, day, bucket))
        if part is None:
            return []
        keys = sorted(
            (k for k, c in part.rows.items() if c.live()),
            key=lambda k: (timeuuid_order(k[0]), timeuuid_order(k[1])),
        )
        columns = ("queued", "outcome", *EVENT_METRICS)
        return [{"log_id": k[1], **{c: part.rows[k].get(c) for c in columns}} for k in keys]

    def _rollup(
        self, user_id: uuid.UUID, day: date, bucket: int
    ) -> tuple[Rollup | None, datetime | None]:
        part = self.db.stat_rows.get((user_id, day, bucket))
        if part is None or not (part.static.live() or any(c.live() for c in part.rows.values())):
            return None, None
        return Rollup.decode(part.static.get("rollup")), part.static.get("dirty_at")

    def _recount(self, user_id: uuid.UUID, day: date, bucket: int) -> Rollup:
        started = self.db.now()
        rows = self._rows(user_id, day, bucket)
        self.rows_counted += len(rows)
        fresh = Rollup(count_rows(rows), started, len(rows))
        self._static(user_id, day, bucket, "rollup", fresh.encode())
        return fresh

    def _bucket(self, user_id: uuid.UUID, day: date, bucket: int) -> tuple[dict[str, int], bool]:
        stored, dirty_at = self._rollup(user_id, day, bucket)
        served = stored.counts if stored else {}
        if current(stored, dirty_at) or fresh_enough(stored, self.db.now()):
            return served, False
        key = (user_id, day, bucket)
        if key in self._rolls or (stored is not None and stored.rows > self.inline_rows):
            self._rolls[key] = None
            return served, True
        # One page of inline_rows + 1: the whole bucket when it holds no more than that.
        page = self._rows(user_id, day, bucket)[: self.inline_rows + 1]
        self.rows_counted += len(page)
        self.rows_counted_inline += len(page)
        if len(page) > self.inline_rows:
            self._rolls[key] = None
            return served, True
        fresh = Rollup(count_rows(page), self.db.now(), len(page))
        self._static(user_id, day, bucket, "rollup", fresh.encode())
        return fresh.counts, False

    def _day(self, user_id: uuid.UUID, day: date) -> tuple[dict[str, int], bool]:
        parts = [self._bucket(user_id, day, b) for b in range(self.buckets)]
        return add(p[0] for p in parts), any(p[1] for p in parts)

    async def marks(self, marked_on: date, shard: int) -> list[Mark]:
        self.db._after(await self.db._before("stats.marks"))
        found = self.db.stat_dirty.get((marked_on, shard), {})
        return [
            Mark(user, day, bucket, stamp)
            for (user, day, bucket), cells in sorted(found.items(), key=lambda i: str(i[0]))
            if (stamp := cells.stamp("at")) is not None
        ]

    async def unmark(self, marked_on: date, shard: int, mark: Mark) -> None:
        failure = await self.db._before("stats.unmark")
        cells = self.db.stat_dirty[(marked_on, shard)][(mark.user_id, mark.day, mark.bucket)]
        cells.put("at", None, mark.stamp)
        self.db._after(failure)

    async def roll_due(self, now: datetime) -> int:
        recounted = seen = 0
        for marked_on in (day_of(now) - timedelta(days=1), day_of(now)):
            for shard in range(DIRTY_SHARDS):
                for mark in await self.marks(marked_on, shard):
                    seen += 1
                    key = (mark.user_id, mark.day, mark.bucket)
                    stored, dirty_at = self._rollup(*key)
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
        """Run the background roll-ups the reads started (the real store's are tasks)."""
        while self._rolls:
            key = next(iter(self._rolls))
            failure = await self.db._before("stats.recount")
            del self._rolls[key]
            self._recount(*key)
            self.db._after(failure)

    async def bucket_rows(self, user_id: uuid.UUID, day: date, bucket: int) -> list[dict[str, Any]]:
        self.db._after(await self.db._before("stats.bucket_rows"))
        return self._rows(user_id, day, bucket)

    async def rollup(
        self, user_id: uuid.UUID, day: date, bucket: int
    ) -> tuple[Rollup | None, datetime | None]:
        self.db._after(await self.db._before("stats.rollup"))
        return self._rollup(user_id, day, bucket)

    async def recount(self, user_id: uuid.UUID, day: date, bucket: int) -> Rollup:
        failure = await self.db._before("stats.recount")
        fresh = self._recount(user_id, day, bucket)
        self.db._after(failure)
        return fresh

    async def bucket(self, user_id: uuid.UUID, day: date, bucket: int) -> dict[str, int]:
        failure = await self.db._before("stats.bucket")
        counts = self._bucket(user_id, day, bucket)[0]
        self.db._after(failure)
        return counts

    async def day(self, user_id: uuid.UUID, day: date) -> dict[str, int]:
        failure = await self.db._before("stats.day")
        counts = self._day(user_id, day)[0]
        self.db._after(failure)
        return counts

    async def range(self, user_id: uuid.UUID, start: date, end: date) -> dict[date, dict[str, int]]:
        failure = await self.db._before("stats.range")
        out: dict[date, dict[str, int]] = {}
        for (user, d), row in sorted(self.db.stat_days.items(), key=lambda i: i[0][1]):
            if user != user_id or not start <= d <= end or not row.live():
                continue
            kept = Rollup.decode(row.get("totals"))
            if (
                kept is not None
                and is_closed(d, kept.scanned_at - SETTLE)
                and current(kept, row.get("dirty_at"))
            ):
                out[d] = kept.counts
                continue
            started = self.db.now()
            out[d], behind = self._day(user_id, d)
            if not behind and is_closed(d, started - SETTLE):
                self._day_put(user_id, d, "totals", Rollup(out[d], started).encode())
        for d, totals in (await self.hits(user_id, start, end)).items():
            out[d] = {**out.get(d, {}), **totals}
        self.db._after(failure)
        return out

    async def hit(
        self, user_id: uuid.UUID, batch_id: uuid.UUID, kind: str, *, machine: bool
    ) -> None:
        failure = await self.db._before("stats.hit")
        day = batch_day(batch_id)
        self.db.engagement[
            (user_id, day, "opens_total" if kind == "opened" else "clicks_total")
        ] += 1
        if machine:
            metric = "machine_opens" if kind == "opened" else "machine_clicks"
            self.db.engagement[(user_id, day, metric)] += 1
        self.db._after(failure)

    async def hits(self, user_id: uuid.UUID, start: date, end: date) -> dict[date, dict[str, int]]:
        found: dict[date, dict[str, int]] = {}
        for (user, d, metric), count in self.db.engagement.items():
            if user == user_id and start <= d <= end:
                found.setdefault(d, {})[metric] = count
        return found

    async def user_days(self, user_id: uuid.UUID) -> list[date]:
        self.db._after(await self.db._before("stats.user_days"))
        return sorted(d for (u, d), row in self.db.stat_days.items() if u == user_id and row.live())

    async def active_users(self, day: date) -> list[uuid.UUID]:
        self.db._after(await self.db._before("stats.active_users"))
        found = {u for (d, _), users in self.db.active.items() if d == day for u in users}
        return sorted(found, key=str)

    async def reconcile(self, user_id: uuid.UUID, day: date, *, fix: bool) -> list[Drift]:
        failure = await self.db._before("stats.reconcile")
        drifts = []
        for bucket in range(self.buckets):
            stored, dirty_at = self._rollup(user_id, day, bucket)
            if not current(stored, dirty_at):
                if fix:
                    self._recount(user_id, day, bucket)
                continue
            counted = count_rows(self._rows(user_id, day, bucket))
            have = stored.counts if stored else {}
            if have != counted:
                drifts.append(Drift(user_id, day, bucket, have, counted))
                if fix:
                    self._recount(user_id, day, bucket)
        if fix and drifts:
            self._day_put(user_id, day, "totals", None)
            self._day_put(user_id, day, "dirty_at", self.db.now())
        self.db._after(failure)
        return drifts


class FakeRecipients(Recipients):
    """Twin of :class:`shared.delivery.recipients.RecipientStore`: chunk rows and own rows as cells,
    read back through :func:`shared.delivery.recipients.merged_chunk`."""

    def __init__(self, db: FakeCassandra, stats: FakeStats | None = None) -> None:
        self.db = db
        self.stats = stats or FakeStats(db)

    # -- reads ---------------------------------------------------------------------------

    async def batch_rows(self, batch_id: uuid.UUID) -> list[dict[str, Any]]:
        self.db._after(await self.db._before("recipients.batch_rows"))
        out: list[dict[str, Any]] = []
        for chunk, rows in by_chunk(self.db.stored(batch_id)).items():
            out += merged_chunk(batch_id, chunk, rows)
        return out

    async def chunk_rows(self, batch_id: uuid.UUID, chunk: int) -> list[dict[str, Any]]:
        self.db._after(await self.db._before("recipients.chunk_rows"))
        return merged_chunk(batch_id, chunk, self.db.stored(batch_id, chunk))

    async def member(self, batch_id: uuid.UUID, chunk: int, log_id: uuid.UUID) -> bool:
        self.db._after(await self.db._before("recipients.member"))
        rows = merged_chunk(batch_id, chunk, self.db.stored(batch_id, chunk))
        return any(r["log_id"] == log_id for r in rows)

    async def stored_chunk(self, batch_id: uuid.UUID, chunk: int) -> list[dict[str, Any]]:
        self.db._after(await self.db._before("recipients.stored_chunk"))
        return self.db.stored(batch_id, chunk)

    async def one(
        self, batch_id: uuid.UUID, chunk: int, log_id: uuid.UUID, *, addresses: bool = False
    ) -> dict[str, Any] | None:
        self.db._after(await self.db._before("recipients.one"))
        stored = self.db.stored(batch_id, chunk)
        if addresses:
            merged = merged_chunk(batch_id, chunk, stored)
            return next((r for r in merged if r["log_id"] == log_id), None)
        return merged_one(batch_id, chunk, log_id, stored)

    async def locate(self, batch_id: uuid.UUID, email: str) -> tuple[int, uuid.UUID] | None:
        self.db._after(await self.db._before("recipients.locate"))
        wanted = email.lower()
        for r in self.db.stored(batch_id):
            if r["log_id"] == CHUNK_ROW:
                for address, _, _ in decode_recipients(r["recipients"] or b"[]"):
                    if address.lower() == wanted:
                        return r["chunk"], log_id_for(batch_id, address)
            elif r["email"] is not None and r["email"].lower() == wanted:
                return r["chunk"], r["log_id"]
        return None

    # -- writes --------------------------------------------------------------------------

    def _targets(self, batch_id: uuid.UUID, chosen: Selection) -> list[Cells]:
        """The rows a write of ``chosen`` goes to: the chunk's row (``whole``) or each
        recipient's own row."""
        targets = (CHUNK_ROW,) if chosen.whole else chosen.log_ids
        return [self.db.row(batch_id, chosen.chunk, t) for t in targets]

    async def accepted(
        self,
        batch_id: uuid.UUID,
        chosen: Selection,
        *,
        provider: str,
        tag: str,
        when: datetime,
        message_id: str | None,
    ) -> None:
        failure = await self.db._before("recipients.accepted")
        stamp = precedence.provider_stamp(batch_id, when, 0)
        for c in self._targets(batch_id, chosen):
            c.add("evidence", [tag], stamp)
            c.put("event", "sent", stamp)
            c.put("last_update", when, stamp)
            c.put_entry("providers", provider, "sent", stamp)
            if message_id:
                c.put_entry("message_ids", provider, message_id, stamp)
        self.db._after(failure)

    async def call_failed(
        self,
        batch_id: uuid.UUID,
        chosen: Selection,
        *,
        provider: str,
        result: str,
        when: datetime,
    ) -> None:
        failure = await self.db._before("recipients.call_failed")
        stamp = precedence.provider_stamp(batch_id, when, 0)
        for c in self._targets(batch_id, chosen):
            c.put_entry("providers", provider, result[:300], stamp)
        self.db._after(failure)

    async def give_up(
        self,
        batch_id: uuid.UUID,
        user_id: uuid.UUID,
        chosen: Selection,
        *,
        reason: str,
        when: datetime,
    ) -> None:
        if not chosen.log_ids:
            return
        failure = await self.db._before("recipients.give_up")
        stamp = precedence.give_up_stamp(batch_id)

        def state() -> None:
            for c in self._targets(batch_id, chosen):
                c.put("gave_up_reason", reason[:1000], stamp)
                c.put("gave_up_at", when, stamp)

        if len(chosen.log_ids) == 1:
            outcome = await self.stats.outcome_statements(
                user_id,
                batch_id,
                chosen.log_ids[0],
                outcome="failed",
                stamp=stamp,
                now=self.db.now(),
            )
            self.db.apply([state, *outcome])  # one logged batch
            await self.stats.activity(user_id, batch_id)
        else:
            # The outcome rows first, the state last (as the real store does).
            await self.stats.outcomes(user_id, batch_id, chosen.log_ids, "failed", stamp)
            state()
        self.db._after(failure)

    async def suppressed(
        self,
        batch_id: uuid.UUID,
        user_id: uuid.UUID,
        chunk: int,
        reasons: Mapping[uuid.UUID, str],
        *,
        when: datetime,
    ) -> None:
        if not reasons:
            return
        stamp = precedence.suppressed_stamp(batch_id)

        def state() -> None:
            for log_id, why in reasons.items():
                c = self.db.row(batch_id, chunk, log_id)
                c.put("event", "dropped", stamp)
                c.put("state", "failed", stamp)
                c.put("reason_detail", why[:1000], stamp)
                c.put("last_update", when, stamp)

        if len(reasons) == 1:
            (log_id,) = reasons
            outcome = await self.stats.outcome_statements(
                user_id, batch_id, log_id, outcome="failed", stamp=stamp, now=self.db.now()
            )
            failure = await self.db._before("recipients.suppressed")
            self.db.apply([state, *outcome])  # one logged batch
            self.db._after(failure)
            await self.stats.activity(user_id, batch_id)
            return
        # The outcome rows first (fault point ``stats.outcomes``), the states last (fault
        # point ``recipients.suppressed``: one mutation of the batch's partition), as the real
        # store sends them.
        await self.stats.outcomes(user_id, batch_id, list(reasons), "failed", stamp)
        failure = await self.db._before("recipients.suppressed")
        state()
        self.db._after(failure)

    async def supersede(
        self,
        batch_id: uuid.UUID,
        chunk: int,
        log_id: uuid.UUID,
        *,
        tag: str,
        provider: str,
        result: str,
        when: datetime,
    ) -> None:
        failure = await self.db._before("recipients.supersede")
        stamp = precedence.provider_stamp(batch_id, when, 0)
        c = self.db.row(batch_id, chunk, log_id)
        c.add("superseded", [tag], stamp)
        c.put_entry("providers", provider, result[:300], stamp)
        self.db._after(failure)

    async def reported(self, report: Report) -> None:
        failure = await self.db._before("recipients.reported")
        counted = await self._counted(report)
        self._state(report)
        self.db.apply([*report.also, *counted])  # in the same logged batch as the state
        if counted:
            await self.stats.activity(report.user_id, report.batch_id)
        self.db._after(failure)

    async def reported_many(self, reports: Sequence[Report]) -> None:
        """One report as :meth:`reported`; more: stat rows first (fault point
        ``recipients.reported_many.stats``), then states with their timeline rows
        (``recipients.reported_many.states``), as the real store sends them: a failure
        between leaves stat rows without their states."""
        if len(reports) == 1:
            await self.reported(reports[0])
            return
        counted = [await self._counted(r) for r in reports]
        failure = await self.db._before("recipients.reported_many.stats")
        self.db.apply([w for writes in counted for w in writes])
        self.db._after(failure)
        active = {
            (r.user_id, batch_day(r.batch_id)): r.batch_id
            for r, writes in zip(reports, counted, strict=True)
            if writes
        }
        await asyncio.gather(*(self.stats.activity(u, b) for (u, _), b in active.items()))
        failure = await self.db._before("recipients.reported_many.states")
        for r in reports:
            self._state(r)
            self.db.apply(list(r.also))
        self.db._after(failure)

    async def _counted(self, r: Report) -> list[Write]:
        stamp = precedence.provider_stamp(r.batch_id, r.when, r.rank)
        outcome = r.state if r.state in ("success", "failed") else None
        return await self.stats.outcome_statements(
            r.user_id,
            r.batch_id,
            r.log_id,
            outcome=outcome,
            stamp=stamp,
            metrics=r.metrics,
            now=self.db.now(),
        )

    def _state(self, r: Report) -> None:
        stamp = precedence.provider_stamp(r.batch_id, r.when, r.rank)
        c = self.db.row(r.batch_id, r.chunk, r.log_id)
        stage = precedence.provider_stamp(r.batch_id, r.when, r.stage_rank)
        if r.provider_result:  # our own tracking endpoint is no provider: no entry of its own
            c.put_entry("providers", r.provider, r.provider_result[:300], stage)
            if r.message_id:
                c.put_entry("message_ids", r.provider, r.message_id, stage)
            if r.evidence is not None:
                c.add("evidence", [r.evidence], stage)
        if r.event is not None:
            c.put("event", r.event, stamp)
            c.put("last_update", r.when, stamp)
            if r.state is not None:
                c.put("state", r.state, stamp)
            if r.state == "failed" and r.reason:
                c.put("reason_detail", r.reason[:1000], stamp)


_ATTEMPT_COLUMNS = [c.strip() for c in COLUMNS.split(",")]


class FakeAttempts(Attempts):
    """Twin of :class:`shared.delivery.attempts.AttemptStore`: every write is conditional."""

    def __init__(self, db: FakeCassandra) -> None:
        self.db = db

    async def line(self, batch_id: uuid.UUID, line: str, *, serial: bool = False) -> list[Attempt]:
        self.db._after(await self.db._before("attempts.line"))
        rows = self.db.attempts.get((batch_id, line), {})
        return [from_row(line, rows[n]) for n in sorted(rows)]

    async def lines(self, batch_id: uuid.UUID) -> dict[str, list[Attempt]]:
        out: dict[str, list[Attempt]] = {}
        for (b, line), rows in sorted(self.db.attempts.items()):
            if b == batch_id and rows:
                out[line] = [from_row(line, rows[n]) for n in sorted(rows)]
        return out

    async def create(
        self,
        batch_id: uuid.UUID,
        line: str,
        attempt: int,
        *,
        chunk: int,
        provider: str,
        state: str,
        owner: uuid.UUID | None = None,
        cause: str | None = None,
        reason: str | None = None,
        calling_at: datetime | None = None,
        template_version: int | None = None,
    ) -> bool:
        failure = await self.db._before("attempts.create")
        rows = self.db.attempts[(batch_id, line)]
        applied = attempt not in rows
        if applied:
            row: dict[str, Any] = dict.fromkeys(_ATTEMPT_COLUMNS)
            row.update(
                attempt=attempt,
                chunk=chunk,
                provider=provider,
                state=state,
                owner=owner,
                cause=cause,
                reason=reason,
                created_at=as_stored(self.db.now()),
                calling_at=as_stored(calling_at) if calling_at else None,
                checks=0,
                template_version=template_version,
            )
            rows[attempt] = row
        self.db._after(failure)
        return applied

    async def transition(
        self,
        batch_id: uuid.UUID,
        line: str,
        attempt: int,
        *,
        expect: Mapping[str, Any],
        values: Mapping[str, Any],
    ) -> bool:
        failure = await self.db._before("attempts.transition")
        row = self.db.attempts.get((batch_id, line), {}).get(attempt)
        applied = row is not None and all(row[k] == v for k, v in expect.items())
        if applied:
            assert row is not None
            row.update(
                {k: as_stored(v) if isinstance(v, datetime) else v for k, v in values.items()}
            )
        self.db._after(failure)
        return applied


class FakeDomainVolumes(Volumes):
    """``shared.delivery.domain_capacity.DomainVolumes`` in memory: per (domain, day) counters."""

    def __init__(self) -> None:
        self.days: dict[tuple[str, date], dict[str, int]] = {}
        self.failing = False
        """Set to raise DependencyUnavailable from every call (an outage)."""

    def _day(self, domain: str, day: date) -> dict[str, int]:
        if self.failing:
            raise DependencyUnavailable("cassandra", "fake outage")
        return self.days.setdefault((domain, day), dict.fromkeys(("sent", *OUTCOMES), 0))

    async def take(self, domain: str, day: date, recipients: int) -> int:
        counts = self._day(domain, day)
        counts["sent"] += recipients
        return counts["sent"]

    async def give_back(self, domain: str, day: date, recipients: int) -> None:
        self._day(domain, day)["sent"] -= recipients

    async def outcome(self, domain: str, day: date, kind: str) -> None:
        if kind not in OUTCOMES:
            raise ValueError(f"not a counted outcome: {kind}")
        self._day(domain, day)[kind] += 1

    async def history(self, domain: str, today: date) -> dict[date, DayVolume]:
        if self.failing:
            raise DependencyUnavailable("cassandra", "fake outage")
        start = today - timedelta(days=HISTORY_DAYS)
        return {
            day: DayVolume(**counts)
            for (d, day), counts in self.days.items()
            if d == domain and start <= day <= today
        }


class FakeOutbox(OutboxRows):
    """Twin of :class:`shared.delivery.outbox.Outbox`."""

    def __init__(self, db: FakeCassandra, namespace: str = "ns") -> None:
        self.db = db
        self.namespace = namespace
        self.written: Callable[[], None] = lambda: None

    bucket = staticmethod(Outbox.bucket)

    def _key(self, batch_id: uuid.UUID) -> tuple[str, datetime, int]:
        minute, shard = self.bucket(batch_id)
        return self.namespace, minute, shard

    async def statement(self, batch_id: uuid.UUID, user_id: uuid.UUID) -> Write:
        self.written()
        return partial(self._put, batch_id, user_id)

    def _put(self, batch_id: uuid.UUID, user_id: uuid.UUID) -> None:
        # As the real INSERT: a repeated acceptance marks the row unpublished again.
        self.db.outbox[self._key(batch_id)][batch_id] = {"user_id": user_id, "published": False}

    async def add(self, batch_id: uuid.UUID, user_id: uuid.UUID) -> None:
        done = await self.db._before("outbox.add")
        self._put(batch_id, user_id)
        self.db._after(done)

    async def done(self, batch_id: uuid.UUID) -> None:
        done = await self.db._before("outbox.done")
        self._mark(batch_id)
        self.db._after(done)

    async def done_many(self, batch_ids: Iterable[uuid.UUID]) -> None:
        """As the real store: one write per partition (``outbox.done`` each), all at once."""
        parts: dict[tuple[str, datetime, int], list[uuid.UUID]] = {}
        for batch_id in batch_ids:
            parts.setdefault(self._key(batch_id), []).append(batch_id)

        async def one(ids: list[uuid.UUID]) -> None:
            done = await self.db._before("outbox.done")
            for batch_id in ids:
                self._mark(batch_id)
            self.db._after(done)

        if len(parts) == 1:  # as the real store: one partition written in the caller's task
            await one(next(iter(parts.values())))
            return
        results = await asyncio.gather(
            *(one(ids) for ids in parts.values()), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    def _mark(self, batch_id: uuid.UUID) -> None:
        self.db.outbox[self._key(batch_id)].setdefault(batch_id, {})["published"] = True

    async def unpublished(self, minute: datetime, shard: int) -> list[uuid.UUID]:
        self.db._after(await self.db._before("outbox.unpublished"))
        rows = self.db.outbox.get((self.namespace, minute_of(minute), shard), {})
        return [b for b in sorted(rows, key=lambda b: b.bytes) if rows[b].get("published") is False]

    def pending(self) -> set[uuid.UUID]:
        """Every batch whose row is not marked published (what the relay still looks at; no
        round trip: for tests and the simulator)."""
        return {
            b
            for (namespace, _, _), rows in self.db.outbox.items()
            if namespace == self.namespace
            for b, row in rows.items()
            if row.get("published") is False
        }


#: ``scheduled_batches``' ``default_time_to_live`` (deploy/cql).
ROW_TTL: Final = timedelta(seconds=3_196_800)


@dataclass
class ScheduleTables:
    """``scheduled_batches`` and ``scheduler_state``, shared by the twins of one keyspace."""

    clock: Clock = field(default_factory=Clock)
    rows: dict[tuple[str, datetime], dict[uuid.UUID, Cell[datetime]]] = field(default_factory=dict)
    """(namespace, minute) -> batch -> its ``send_at``, expiring with the table's TTL."""
    leases: dict[str, Cell[uuid.UUID]] = field(default_factory=dict)
    """``scheduler_state``'s lease cell (its owner, with a TTL), by namespace."""
    cursors: dict[str, datetime] = field(default_factory=dict)
    wire: Wire = LOOPBACK
    """How each round trip travels (``tests.fakes.wire``)."""


class FakeSchedule(Schedules):
    """Twin of :class:`shared.delivery.schedule_store.ScheduleStore` (every operation; ``statement``
    gives a :data:`tests.fakes.cassandra.Write` to apply with the caller's own write)."""

    def __init__(self, namespace: str, tables: ScheduleTables | None = None) -> None:
        self.namespace = namespace
        self.tables = tables or ScheduleTables()

    @property
    def wire(self) -> Wire:
        return self.tables.wire

    def _now(self) -> datetime:
        return self.tables.clock.now()

    @round_trip("schedule.add", "write")
    async def add(self, batch_id: uuid.UUID, at: datetime) -> None:
        self._put(batch_id, at)

    async def statement(self, batch_id: uuid.UUID, at: datetime) -> Write:
        return partial(self._put, batch_id, at)

    def _put(self, batch_id: uuid.UUID, at: datetime) -> None:
        minute = self.tables.rows.setdefault((self.namespace, lanes.bucket_of(at)), {})
        minute[batch_id] = Cell(ms(at), self._now() + ROW_TTL)

    def _holder(self) -> uuid.UUID | None:
        lease = self.tables.leases.get(self.namespace)
        return lease.value if lease and lease.alive(self._now()) else None

    async def take_lease(self, owner: uuid.UUID, seconds: int, *, renewing: bool = False) -> bool:
        if renewing:
            # The renewal first, IF owner = owner; a free lease is then taken.
            trip = await self.wire.trip("schedule.renew_lease", "lwt")
            holder = self._holder()
            if holder == owner:
                self._lease(owner, seconds)
            trip.landed()
            if holder is not None:
                return holder == owner
            trip = await self.wire.trip("schedule.take_lease", "lwt")
            holder = self._holder()
            if holder is None:
                self._lease(owner, seconds)
            trip.landed()
            return holder is None
        trip = await self.wire.trip("schedule.take_lease", "lwt")
        holder = self._holder()
        if holder is None:
            self._lease(owner, seconds)
        trip.landed()
        if holder is None or holder != owner:
            return holder is None
        # The renewal is a second transaction, IF owner = owner.
        trip = await self.wire.trip("schedule.renew_lease", "lwt")
        renewed = self._holder() == owner
        if renewed:
            self._lease(owner, seconds)
        trip.landed()
        return renewed

    def _lease(self, owner: uuid.UUID, seconds: int) -> None:
        self.tables.leases[self.namespace] = Cell(owner, self._now() + timedelta(seconds=seconds))

    @round_trip("schedule.release_lease", "lwt")
    async def release_lease(self, owner: uuid.UUID) -> None:
        if self._holder() == owner:
            del self.tables.leases[self.namespace]

    @round_trip("schedule.done_through", "read")
    async def done_through(self) -> datetime | None:
        return self.tables.cursors.get(self.namespace)

    async def due(self, now: datetime) -> tuple[list[Due], datetime | None]:
        cursor = await self.done_through()
        current = lanes.bucket_of(now)
        minute = cursor + BUCKET if cursor else current - (MAX_MINUTES - 1) * BUCKET
        minutes: list[datetime] = []
        while minute <= current and len(minutes) < MAX_MINUTES:
            minutes.append(minute)
            minute += BUCKET
        trip = await self.wire.trip("schedule.due", "read")
        trip.landed()
        found: list[Due] = []
        for at in minutes:
            rows = self.tables.rows.get((self.namespace, at), {})
            for batch_id in sorted(rows, key=timeuuid_order):
                row = rows[batch_id]
                if row.alive(self._now()):
                    found.append(Due(at, batch_id, row.value))
        return found, minutes[-1] if minutes else None

    @round_trip("schedule.finish", "lwt")
    async def finish(self, owner: uuid.UUID, through: datetime) -> bool:
        if self._holder() != owner:
            return False
        self.tables.cursors[self.namespace] = ms(through)
        return True
