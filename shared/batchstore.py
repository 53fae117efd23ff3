"""Batches in Cassandra: the batch partition, the user's batch list, and reads of both.

Layout (``deploy/cql``): one ``batches`` partition per batch holds the header in static
columns and one row per chunk (at most a provider request's worth of recipients) with the
chunk's recipient list, so storing a batch is one single-partition mutation whose size grows
with its recipients but whose row count grows with its chunks (``shared.recipients`` owns the
chunk rows' state and the recipient rows written when fates diverge). The user's batch list
and the batch's ``queued`` stat row are written after it and can be rewritten from it at any
time (:meth:`BatchStore.index_stored`), which is what finishing an interrupted acceptance does.

Every id is deterministic: the batch id is fixed before anything is written (when an
``Idempotency-Key`` is claimed, with it) and each recipient's log id derives from the batch id
and the address (``shared.recipients.log_id_for``), so writing the same batch twice writes the
same rows.
"""

from __future__ import annotations

import asyncio
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from cassandra.query import UNSET_VALUE, Statement
from cassandra.util import uuid_from_time

from shared import precedence
from shared.db import Database, utc
from shared.models import Message
from shared.recipients import CHUNK_ROW, Addressee, encode_recipients
from shared.stats import StatsStore


def month_of(batch_id: uuid.UUID) -> str:
    """The ``batches_by_user`` bucket (UTC ``YYYY-MM``) of a time-based batch id."""
    return timeuuid_datetime(batch_id).strftime("%Y-%m")


def timeuuid_datetime(value: uuid.UUID) -> datetime:
    return precedence.accepted_at(value)


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
    send_at: datetime | None = None
    """When a scheduled batch is (or was) to go."""


def new_batch_id(at: float) -> uuid.UUID:
    """A time UUID for a batch accepted at ``at`` (Unix seconds), its node and clock sequence
    from the OS's cryptographic randomness (the driver's ``uuid_from_time`` uses ``random``,
    whose output can be predicted from a few ids)."""
    node = secrets.randbits(48) | 0x010000000000  # the multicast bit: not a real MAC
    made: uuid.UUID = uuid_from_time(at, node=node, clock_seq=secrets.randbits(14))
    return made


@dataclass(frozen=True, slots=True)
class NewBatch:
    batch_id: uuid.UUID
    user_id: uuid.UUID
    message: Message
    recipients: Sequence[Addressee]
    chunk_size: int
    response: bytes = b""
    """The 202 body, stored with the header so a retried request gets the same answer."""
    split: int = 0
    """The first ``split`` recipients are chunked apart from the rest (a template's canary:
    ``shared.template_use``), so no chunk mixes the two."""
    send_at: datetime | None = None
    """When a scheduled batch is to go (None: now); it is stored ``scheduled`` until then."""

    @property
    def status(self) -> str:
        return "scheduled" if self.send_at is not None else "accepted"

    @property
    def chunk_count(self) -> int:
        return len(self.chunks())

    def chunk_of(self, index: int) -> int:
        """The chunk of the ``index``-th recipient."""
        size, split = self.chunk_size, self.split
        if index < split:
            return index // size
        return -(-split // size) + (index - split) // size

    def chunks(self) -> list[Sequence[Addressee]]:
        size, split, everyone = self.chunk_size, self.split, self.recipients
        first = [everyone[i : min(i + size, split)] for i in range(0, split, size)]
        return first + [everyone[i : i + size] for i in range(split, len(everyone), size)]


_INSERT_CHUNK = (
    "INSERT INTO batches (batch_id, chunk, log_id, recipients) VALUES (?, ?, ?, ?) "
    "USING TIMESTAMP ?"
)
_INSERT_HEADER = (
    "INSERT INTO batches (batch_id, user_id, created_at, subject, message, recipient_count, "
    "chunk_size, chunk_count, status, updated_at, accept_response, send_at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) USING TIMESTAMP ?"
)
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

    def __init__(self, db: Database, stats: StatsStore | None = None) -> None:
        self.db = db
        self.stats = stats or StatsStore(db)

    async def write(self, batch: NewBatch, *, also: Sequence[Statement] = ()) -> None:
        """The batch partition, header and chunks, as one single-partition mutation (sent in
        one request with the writes ``also`` of other partitions, e.g. its outbox row)."""
        db = self.db
        insert = await db.prepare(_INSERT_CHUNK)
        created = precedence.accepted_at(batch.batch_id)
        queued = precedence.queued_stamp(batch.batch_id)
        chunks = batch.chunks()
        rows = [
            insert.bind((batch.batch_id, i, CHUNK_ROW, encode_recipients(part), queued))
            for i, part in enumerate(chunks)
        ]
        rows.append(
            (await db.prepare(_INSERT_HEADER)).bind(
                (
                    batch.batch_id,
                    batch.user_id,
                    created,
                    batch.message.subject,
                    batch.message.encode(),
                    len(batch.recipients),
                    batch.chunk_size,
                    len(chunks),
                    batch.status,
                    created,
                    batch.response or UNSET_VALUE,
                    batch.send_at or UNSET_VALUE,
                    _header_stamp(batch.batch_id),
                )
            )
        )
        await db.batch([*rows, *also])

    async def index(self, batch: NewBatch) -> None:
        """The user's batch list and the batch's ``queued`` stat row (idempotent)."""
        await self._index(
            batch.batch_id, batch.user_id, batch.message.subject, len(batch.recipients)
        )

    async def index_stored(self, header: BatchHeader) -> None:
        """Rewrite the indexes of a stored batch from its header (finishing an acceptance
        that stopped after the batch was written)."""
        await self._index(
            header.batch_id, header.user_id, header.message.subject, header.recipient_count
        )

    async def _index(
        self, batch_id: uuid.UUID, user_id: uuid.UUID, subject: str, recipients: int
    ) -> None:
        listed = (await self.db.prepare(_INSERT_LISTED)).bind(
            (user_id, month_of(batch_id), batch_id, subject, recipients)
        )
        queued = await self.stats.accepted_statements(
            user_id, batch_id, recipients, _header_stamp(batch_id)
        )
        await self.db.batch([listed, *queued])
        await self.stats.activity(user_id, batch_id)

    async def cancel(self, batch_id: uuid.UUID, user_id: uuid.UUID) -> None:
        """Mark a batch whose storing failed (its client got an error) as never to be sent,
        and as counting nothing, even if the failed writes land later: both are written just
        after the header's own timestamp."""
        await asyncio.gather(
            self.db.execute(
                "UPDATE batches USING TIMESTAMP ? SET status = 'cancelled' WHERE batch_id = ?",
                (_header_stamp(batch_id) + 1, batch_id),
                idempotent=True,
            ),
            self.stats.cancelled(user_id, batch_id, _header_stamp(batch_id) + 1),
        )

    async def header(self, batch_id: uuid.UUID) -> BatchHeader | None:
        row = await self.db.one(
            "SELECT batch_id, user_id, created_at, message, recipient_count, chunk_size, "
            "chunk_count, status, reason, accept_response, send_at FROM batches WHERE batch_id = ? "
            "LIMIT 1",
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
            send_at=utc(row["send_at"]),
        )

    async def owner(self, batch_id: uuid.UUID) -> uuid.UUID | None:
        """The user a batch belongs to (None when it does not exist)."""
        row = await self.db.one(
            "SELECT user_id FROM batches WHERE batch_id = ? LIMIT 1", (batch_id,)
        )
        return row["user_id"] if row else None

    async def status(self, batch_id: uuid.UUID) -> str | None:
        """The header's status alone (None when the batch does not exist)."""
        row = await self.db.one(
            "SELECT status, created_at FROM batches WHERE batch_id = ? LIMIT 1", (batch_id,)
        )
        return row["status"] if row and row["created_at"] is not None else None

    async def start_scheduled(self, batch_id: uuid.UUID) -> str | None:
        """Move a scheduled batch to ``accepted`` (its time came), unless it was cancelled:
        a lightweight transaction, so a cancellation racing the scheduler either wins or
        comes too late, never both. The status after (None: no such batch)."""
        return await self._from_scheduled(batch_id, "accepted")

    async def cancel_scheduled(self, batch_id: uuid.UUID, user_id: uuid.UUID) -> str | None:
        """Cancel a batch still waiting for its ``send_at`` (and uncount it); the status
        after: ``cancelled``, or the one that made it too late (None: no such batch)."""
        status = await self._from_scheduled(batch_id, "cancelled")
        if status == "cancelled":
            await self.stats.cancelled(user_id, batch_id, _header_stamp(batch_id) + 1)
        return status

    async def _from_scheduled(self, batch_id: uuid.UUID, status: str) -> str | None:
        row = await self.db.one(
            "UPDATE batches SET status = ?, updated_at = ? WHERE batch_id = ? "
            "IF status = 'scheduled'",
            (status, datetime.now(UTC), batch_id),
        )
        if row is None:
            return None
        if row["[applied]"]:
            return status
        current: str | None = row.get("status")
        return current

    async def set_status(self, batch_id: uuid.UUID, status: str, reason: str | None = None) -> None:
        await self.db.execute(
            "UPDATE batches SET status = ?, reason = ?, updated_at = ? WHERE batch_id = ?",
            (status, reason, datetime.now(UTC), batch_id),
            idempotent=True,
        )
