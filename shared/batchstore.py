"""Batches in Cassandra: the batch partition, its indexes, and reads of both.

Layout (``deploy/cql``): one ``batches`` partition per batch holds the header in static
columns and one row per recipient clustered by ``(chunk, log_id)``, so storing a batch is one
single-partition mutation (all of it or none of it) and updating one chunk's recipients is
another. The indexes (the user's batch list, the address index webhooks use, the ``queued``
marks) are written after it and can be rewritten from it at any time
(:meth:`BatchStore.index_stored`), which is what finishing an interrupted acceptance does.

Every id is deterministic: the batch id is fixed before anything is written (when an
``Idempotency-Key`` is claimed, with it) and each recipient's log id derives from the batch id
and the address, so writing the same batch twice writes the same rows.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import orjson
from cassandra.query import UNSET_VALUE, BatchStatement, BatchType

from shared import precedence
from shared.db import Database
from shared.models import Message, Recipient
from shared.stats import StatsStore


def month_of(batch_id: uuid.UUID) -> str:
    """The ``batches_by_user`` bucket (UTC ``YYYY-MM``) of a time-based batch id."""
    return timeuuid_datetime(batch_id).strftime("%Y-%m")


def timeuuid_datetime(value: uuid.UUID) -> datetime:
    return precedence.accepted_at(value)


def log_id_for(batch_id: uuid.UUID, email: str) -> uuid.UUID:
    """The log id of ``email`` in a batch: a time-based UUID with the batch's time and a
    clock sequence and node derived from the address, so it is the same on every write."""
    digest = hashlib.sha256(batch_id.bytes + email.lower().encode()).digest()
    clock_seq = int.from_bytes(digest[:2], "big") & 0x3FFF
    node = int.from_bytes(digest[2:8], "big")
    return uuid.UUID(
        fields=(
            batch_id.time_low,
            batch_id.time_mid,
            batch_id.time_hi_version,
            0x80 | (clock_seq >> 8),
            clock_seq & 0xFF,
            node,
        )
    )


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
    response: bytes | None = None
    """The 202 body the API answered when it accepted the batch."""


@dataclass(frozen=True, slots=True)
class NewBatch:
    batch_id: uuid.UUID
    user_id: uuid.UUID
    message: Message
    recipients: Sequence[Recipient]
    chunk_size: int
    response: bytes = b""
    """The 202 body, stored with the header so a retried request gets the same answer."""

    @property
    def chunk_count(self) -> int:
        return -(-len(self.recipients) // self.chunk_size)

    def chunk_of(self, index: int) -> int:
        return index // self.chunk_size


_INSERT_RECIPIENT = (
    "INSERT INTO batches (batch_id, chunk, log_id, email, name, substitutions, state, event, "
    "last_update) VALUES (?, ?, ?, ?, ?, ?, 'queued', 'queued', ?) USING TIMESTAMP ?"
)
_INSERT_HEADER = (
    "INSERT INTO batches (batch_id, user_id, created_at, subject, message, recipient_count, "
    "chunk_size, chunk_count, status, updated_at, accept_response) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'accepted', ?, ?) USING TIMESTAMP ?"
)
_INSERT_EMAIL = "INSERT INTO batch_emails (batch_id, email, chunk, log_id) VALUES (?, ?, ?, ?)"
_INSERT_LISTED = (
    "INSERT INTO batches_by_user (user_id, month, batch_id, subject, recipient_count) "
    "VALUES (?, ?, ?, ?, ?)"
)


def _header_stamp(batch_id: uuid.UUID) -> int:
    """The header's write timestamp: the batch's own time, so a cancellation written just
    after it wins however late the header's write lands."""
    return int(precedence.accepted_at(batch_id).timestamp() * 1_000_000)


class BatchStore:
    """Every batch query; one method per operation."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.stats = StatsStore(db)

    async def write(self, batch: NewBatch) -> None:
        """The batch partition, header and recipients, as one single-partition mutation."""
        db = self.db
        rows = BatchStatement(batch_type=BatchType.UNLOGGED)
        rows.is_idempotent = True  # deterministic ids and timestamps
        insert = await db.prepare(_INSERT_RECIPIENT)
        created = precedence.accepted_at(batch.batch_id)
        queued = precedence.queued_stamp(batch.batch_id)
        for i, r in enumerate(batch.recipients):
            # Unset, not null: a bound null writes a tombstone per recipient.
            subs = orjson.dumps(r.substitutions).decode() if r.substitutions else UNSET_VALUE
            name = r.name if r.name is not None else UNSET_VALUE
            rows.add(
                insert,
                (batch.batch_id, batch.chunk_of(i), r.log_id, r.email, name, subs, created, queued),
            )
        rows.add(
            await db.prepare(_INSERT_HEADER),
            (
                batch.batch_id,
                batch.user_id,
                created,
                batch.message.subject,
                batch.message.encode(),
                len(batch.recipients),
                batch.chunk_size,
                batch.chunk_count,
                created,
                batch.response or UNSET_VALUE,
                _header_stamp(batch.batch_id),
            ),
        )
        await db.execute(rows)

    async def index(self, batch: NewBatch) -> None:
        """The user's batch list, the address index and the ``queued`` marks (idempotent)."""
        await self._index(
            batch.batch_id,
            batch.user_id,
            batch.message.subject,
            [(batch.chunk_of(i), r.log_id, r.email) for i, r in enumerate(batch.recipients)],
        )

    async def index_stored(self, header: BatchHeader) -> None:
        """Rewrite the indexes of a stored batch from its partition (finishing an acceptance
        that stopped after the batch was written)."""
        rows = await self.db.all_pages(
            "SELECT chunk, log_id, email FROM batches WHERE batch_id = ?", (header.batch_id,)
        )
        await self._index(
            header.batch_id,
            header.user_id,
            header.message.subject,
            [(r["chunk"], r["log_id"], r["email"]) for r in rows if r["log_id"] is not None],
        )

    async def _index(
        self,
        batch_id: uuid.UUID,
        user_id: uuid.UUID,
        subject: str,
        recipients: Sequence[tuple[int, uuid.UUID, str]],
    ) -> None:
        db = self.db
        emails = BatchStatement(batch_type=BatchType.UNLOGGED)
        emails.is_idempotent = True
        insert_email = await db.prepare(_INSERT_EMAIL)
        for chunk, log_id, email in recipients:
            emails.add(insert_email, (batch_id, email.lower(), chunk, log_id))
        await asyncio.gather(
            db.execute(
                _INSERT_LISTED,
                (user_id, month_of(batch_id), batch_id, subject, len(recipients)),
                idempotent=True,
            ),
            db.execute(emails),
            self.stats.mark(user_id, batch_id, "queued", [log_id for _, log_id, _ in recipients]),
        )

    async def cancel(self, batch_id: uuid.UUID) -> None:
        """Mark a batch whose storing failed (its client got an error) as never to be sent,
        even if the failed write lands later: the status is written just after the header."""
        await self.db.execute(
            "UPDATE batches USING TIMESTAMP ? SET status = 'cancelled' WHERE batch_id = ?",
            (_header_stamp(batch_id) + 1, batch_id),
            idempotent=True,
        )

    async def header(self, batch_id: uuid.UUID) -> BatchHeader | None:
        row = await self.db.one(
            "SELECT batch_id, user_id, created_at, message, recipient_count, chunk_size, "
            "chunk_count, status, reason, accept_response FROM batches WHERE batch_id = ? LIMIT 1",
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
            response=row["accept_response"],
        )

    async def owner(self, batch_id: uuid.UUID) -> uuid.UUID | None:
        """The user a batch belongs to (None when it does not exist)."""
        row = await self.db.one(
            "SELECT user_id FROM batches WHERE batch_id = ? LIMIT 1", (batch_id,)
        )
        return row["user_id"] if row else None

    async def locate(self, batch_id: uuid.UUID, email: str) -> tuple[int, uuid.UUID] | None:
        """The chunk and log id of a batch's recipient, by address (case-insensitive)."""
        row = await self.db.one(
            "SELECT chunk, log_id FROM batch_emails WHERE batch_id = ? AND email = ?",
            (batch_id, email.lower()),
        )
        return (row["chunk"], row["log_id"]) if row else None

    async def status(self, batch_id: uuid.UUID) -> str | None:
        """The header's status alone (None when the batch does not exist)."""
        row = await self.db.one(
            "SELECT status, created_at FROM batches WHERE batch_id = ? LIMIT 1", (batch_id,)
        )
        return row["status"] if row and row["created_at"] is not None else None

    async def set_status(self, batch_id: uuid.UUID, status: str, reason: str | None = None) -> None:
        await self.db.execute(
            "UPDATE batches SET status = ?, reason = ?, updated_at = ? WHERE batch_id = ?",
            (status, reason, datetime.now(UTC), batch_id),
            idempotent=True,
        )
