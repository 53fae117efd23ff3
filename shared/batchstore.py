"""Batches in Cassandra: durable acceptance, the outbox of unpublished batches, reads by chunk.

Layout (``deploy/cql/0001_core.cql``): one ``batches`` partition per batch holds the header in
static columns and one row per recipient clustered by ``(chunk, log_id)``, so accepting a
batch and updating one chunk's recipients are each a single-partition mutation.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import orjson
from cassandra.query import UNSET_VALUE, BatchStatement, BatchType

from shared.db import Database, Row
from shared.models import Message, Recipient
from shared.stats import StatsStore


def month_of(batch_id: uuid.UUID) -> str:
    """The ``batches_by_user`` bucket (UTC ``YYYY-MM``) of a time-based batch id."""
    return timeuuid_datetime(batch_id).strftime("%Y-%m")


def timeuuid_datetime(value: uuid.UUID) -> datetime:
    # RFC 4122 time: 100 ns intervals since 1582-10-15.
    return datetime.fromtimestamp((value.time - 0x01B21DD213814000) / 1e7, UTC)


@dataclass(frozen=True, slots=True)
class BatchHeader:
    batch_id: uuid.UUID
    user_id: uuid.UUID
    created_at: datetime
    message: Message
    recipient_count: int
    chunk_size: int
    chunk_count: int
    status: str
    reason: str | None


@dataclass(frozen=True, slots=True)
class NewBatch:
    batch_id: uuid.UUID
    user_id: uuid.UUID
    message: Message
    recipients: Sequence[Recipient]
    chunk_size: int

    @property
    def chunk_count(self) -> int:
        return -(-len(self.recipients) // self.chunk_size)


_INSERT_RECIPIENT = (
    "INSERT INTO batches (batch_id, chunk, log_id, email, name, substitutions, state, event, "
    "last_update) VALUES (?, ?, ?, ?, ?, ?, 'queued', 'queued', ?) USING TIMESTAMP ?"
)
_INSERT_HEADER = (
    "INSERT INTO batches (batch_id, user_id, created_at, subject, message, recipient_count, "
    "chunk_size, chunk_count, status, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'accepted', ?)"
)
_INSERT_EMAIL = "INSERT INTO batch_emails (batch_id, email, chunk, log_id) VALUES (?, ?, ?, ?)"


class BatchStore:
    """Every batch query; one method per operation."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.stats = StatsStore(db)

    async def accept(self, batch: NewBatch) -> None:
        """Store a batch durably before it is published.

        The user's index row, the address index and the queued marks go first, then the
        batch partition with its header as one single-partition mutation: the header is what
        makes a batch exist, so a reader never sees half a batch. The caller writes the
        outbox row before calling this (see ``shared.outbox``).
        """
        now = datetime.now(UTC)
        db = self.db
        index = (
            await db.prepare(
                "INSERT INTO batches_by_user (user_id, month, batch_id, subject, "
                "recipient_count) VALUES (?, ?, ?, ?, ?)"
            )
        ).bind(
            (
                batch.user_id,
                month_of(batch.batch_id),
                batch.batch_id,
                batch.message.subject,
                len(batch.recipients),
            )
        )
        rows = BatchStatement(batch_type=BatchType.UNLOGGED)
        insert = await db.prepare(_INSERT_RECIPIENT)
        # Provider events are written at whole-second timestamps; starting just below this
        # second keeps any event of the same second ahead of ``queued``.
        queued_at = int(now.timestamp()) * 1_000_000 - 1
        emails = BatchStatement(batch_type=BatchType.UNLOGGED)
        insert_email = await db.prepare(_INSERT_EMAIL)
        for i, r in enumerate(batch.recipients):
            chunk = i // batch.chunk_size
            # Unset, not null: a bound null writes a tombstone per recipient.
            subs = orjson.dumps(r.substitutions).decode() if r.substitutions else UNSET_VALUE
            name = r.name if r.name is not None else UNSET_VALUE
            rows.add(insert, (batch.batch_id, chunk, r.log_id, r.email, name, subs, now, queued_at))
            emails.add(insert_email, (batch.batch_id, r.email.lower(), chunk, r.log_id))
        # The header goes last in the same mutation: a batch is visible only when complete.
        rows.add(
            await db.prepare(_INSERT_HEADER),
            (
                batch.batch_id,
                batch.user_id,
                now,
                batch.message.subject,
                batch.message.encode(),
                len(batch.recipients),
                batch.chunk_size,
                batch.chunk_count,
                now,
            ),
        )
        # Everything but the header, concurrently (a failure in any stops before the header);
        # the queued marks too, so a batch that exists always has them.
        await asyncio.gather(
            db.execute(index),
            db.execute(emails),
            self.stats.mark(
                batch.user_id, now, "queued", [str(r.log_id) for r in batch.recipients]
            ),
        )
        await db.execute(rows)

    async def header(self, batch_id: uuid.UUID) -> BatchHeader | None:
        row = await self.db.one(
            "SELECT batch_id, user_id, created_at, message, recipient_count, chunk_size, "
            "chunk_count, status, reason FROM batches WHERE batch_id = ? LIMIT 1",
            (batch_id,),
        )
        if row is None or row["message"] is None:
            return None
        return BatchHeader(
            batch_id=row["batch_id"],
            user_id=row["user_id"],
            created_at=row["created_at"].replace(tzinfo=UTC),
            message=Message.decode(row["message"]),
            recipient_count=row["recipient_count"],
            chunk_size=row["chunk_size"],
            chunk_count=row["chunk_count"],
            status=row["status"],
            reason=row["reason"],
        )

    async def status(self, batch_id: uuid.UUID) -> str | None:
        """The header's status alone (None when the batch does not exist)."""
        row = await self.db.one(
            "SELECT status FROM batches WHERE batch_id = ? LIMIT 1", (batch_id,)
        )
        return row["status"] if row else None

    async def set_status(self, batch_id: uuid.UUID, status: str, reason: str | None = None) -> None:
        await self.db.execute(
            "UPDATE batches SET status = ?, reason = ?, updated_at = ? WHERE batch_id = ?",
            (status, reason, datetime.now(UTC), batch_id),
            idempotent=True,
        )

    async def chunk_rows(self, batch_id: uuid.UUID, chunk: int) -> list[Row]:
        return await self.db.all_pages(
            "SELECT log_id, email, name, substitutions, state, event, providers "
            "FROM batches WHERE batch_id = ? AND chunk = ?",
            (batch_id, chunk),
        )
