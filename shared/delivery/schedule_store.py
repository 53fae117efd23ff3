"""Batches waiting for their ``send_at``: the one writer of ``scheduled_batches`` and
``scheduler_state``.

A scheduled batch is a row in the minute it is due (``shared.core.lanes.bucket_of``). One
scheduler per namespace (the holder of a lease taken by a lightweight transaction, with a
TTL, so a dead holder's lease lapses) reads the minutes from the one after its cursor up to
the current one, hands each batch on, then moves the cursor past the minutes it finished: a
scheduler that dies part-way hands the same batches on again (the caller's publish is
idempotent by batch id), never skips one. Nothing polls hot: a pass reads only the minutes
that came due since the last one.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final, Protocol

from cassandra.query import BoundStatement

from shared.core.lanes import BUCKET, bucket_of
from shared.infra.db import Database, Row, utc

#: Minutes read per pass (a day: a scheduler back from a long outage catches up in passes).
MAX_MINUTES: Final = 1440
#: Minutes, the current one included, a pass leaves open: rows may still be added to them.
OPEN_MINUTES: Final = 3
#: How long a row outlives its time (a scheduler back from an outage of up to a week).
KEEP_AFTER: Final = timedelta(days=7)
#: Minute partitions read at once.
READ_WINDOW: Final = 32


@dataclass(frozen=True, slots=True)
class Due:
    minute: datetime
    batch_id: uuid.UUID
    send_at: datetime


class Schedules(Protocol):
    """What callers use of :class:`ScheduleStore` (the store, or its in-memory twin)."""

    async def add(self, batch_id: uuid.UUID, at: datetime) -> None: ...

    async def statement(self, batch_id: uuid.UUID, at: datetime) -> BoundStatement: ...

    async def take_lease(
        self, owner: uuid.UUID, seconds: int, *, renewing: bool = False
    ) -> bool: ...

    async def release_lease(self, owner: uuid.UUID) -> None: ...

    async def done_through(self) -> datetime | None: ...

    async def due(self, now: datetime) -> tuple[list[Due], datetime | None]: ...

    async def finish(self, owner: uuid.UUID, through: datetime) -> bool: ...


class ScheduleStore:
    def __init__(self, db: Database, namespace: str) -> None:
        self.db = db
        self.namespace = namespace

    async def add(self, batch_id: uuid.UUID, at: datetime) -> None:
        await self.db.execute(
            "INSERT INTO scheduled_batches (namespace, minute, batch_id, send_at) "
            "VALUES (?, ?, ?, ?) USING TTL ?",
            (self.namespace, bucket_of(at), batch_id, at, _ttl(at)),
            idempotent=True,
        )

    async def statement(self, batch_id: uuid.UUID, at: datetime) -> BoundStatement:
        """The row's write, for the API to send with the batch's own (one mutation: a
        scheduled batch always has its row)."""
        insert = await self.db.prepare(
            "INSERT INTO scheduled_batches (namespace, minute, batch_id, send_at) "
            "VALUES (?, ?, ?, ?) USING TTL ?"
        )
        return insert.bind((self.namespace, bucket_of(at), batch_id, at, _ttl(at)))

    async def take_lease(self, owner: uuid.UUID, seconds: int, *, renewing: bool = False) -> bool:
        """Take the namespace's lease, or renew it when ``owner`` holds it already. A caller
        that believes it holds the lease says ``renewing``: the renewal is then asked first,
        one lightweight transaction where taking first costs two (issue 34: a quiet idle)."""
        if renewing:
            renewed = await self._renew(owner, seconds)
            if renewed is None or renewed["[applied]"] or renewed.get("owner") is not None:
                return bool(renewed and renewed["[applied]"])
        row = await self.db.one(
            "UPDATE scheduler_state USING TTL ? SET owner = ? WHERE namespace = ? IF owner = null",
            (seconds, owner, self.namespace),
        )
        if row and row["[applied]"]:
            return True
        if renewing or not row or row.get("owner") != owner:
            return False
        renewed = await self._renew(owner, seconds)
        return bool(renewed and renewed["[applied]"])

    async def _renew(self, owner: uuid.UUID, seconds: int) -> Row | None:
        return await self.db.one(
            "UPDATE scheduler_state USING TTL ? SET owner = ? WHERE namespace = ? IF owner = ?",
            (seconds, owner, self.namespace, owner),
        )

    async def release_lease(self, owner: uuid.UUID) -> None:
        await self.db.one(
            "UPDATE scheduler_state SET owner = null WHERE namespace = ? IF owner = ?",
            (self.namespace, owner),
        )

    async def done_through(self) -> datetime | None:
        row = await self.db.one(
            "SELECT done_through FROM scheduler_state WHERE namespace = ?",
            (self.namespace,),
            serial=True,
        )
        return utc(row["done_through"]) if row else None

    async def due(self, now: datetime) -> tuple[list[Due], datetime | None]:
        """The batches of the minutes due since the cursor, oldest minute first, and the
        last minute read (None: none was due). The current minute's rows include batches
        whose second has not come yet: the caller leaves those for a later pass."""
        cursor = await self.done_through()
        current = bucket_of(now)
        # Without a cursor (a new namespace), a day back: nothing can be older.
        minute = cursor + BUCKET if cursor else current - (MAX_MINUTES - 1) * BUCKET
        minutes: list[datetime] = []
        while minute <= current and len(minutes) < MAX_MINUTES:
            minutes.append(minute)
            minute += BUCKET
        window = asyncio.Semaphore(READ_WINDOW)

        async def read(at: datetime) -> list[Due]:
            async with window:
                rows = await self.db.all_pages(
                    "SELECT batch_id, send_at FROM scheduled_batches WHERE namespace = ? "
                    "AND minute = ?",
                    (self.namespace, at),
                )
            return [Due(at, r["batch_id"], utc(r["send_at"]) or at) for r in rows]

        found = [d for part in await asyncio.gather(*(read(m) for m in minutes)) for d in part]
        last = minutes[-1] if minutes else None
        return found, last

    async def finish(self, owner: uuid.UUID, through: datetime) -> bool:
        """Move the cursor past ``through`` (only while holding the lease). The current
        minute is never finished: batches may still be added to it."""
        row = await self.db.one(
            "UPDATE scheduler_state SET done_through = ? WHERE namespace = ? IF owner = ?",
            (through, self.namespace, owner),
        )
        return bool(row and row["[applied]"])


def _ttl(at: datetime) -> int:
    """Seconds a row is kept: until :data:`KEEP_AFTER` past its time, whatever the horizon."""
    return max(1, int((at - datetime.now(UTC) + KEEP_AFTER).total_seconds()))


def finished_through(last: datetime | None, now: datetime) -> datetime | None:
    """How far a pass may move the cursor: up to the last minute read, but not within
    :data:`OPEN_MINUTES` of the current one. A row may still land in a minute just past:
    the API's write of a batch due within seconds can arrive after its minute ended, and
    the API's clock may be behind the scheduler's (pure)."""
    if last is None:
        return None
    current = bucket_of(now.astimezone(UTC))
    return min(last, current - OPEN_MINUTES * BUCKET)
