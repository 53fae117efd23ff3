"""Batches in Cassandra: the batch partition, the user's batch list, and reads of both.

Layout (``deploy/cql``): one ``batches`` partition per batch holds the header in static
columns and one row per chunk (at most a provider request's worth of recipients) with the
chunk's recipient list, so its row count grows with its chunks (``shared.delivery.recipients`` owns
the chunk rows' state and the recipient rows written when fates diverge). The user's batch list
and the batch's ``queued`` stat row (its *indexes*) are written with its header when it is
accepted (``indexed``), and can be rewritten from it at any time
(:meth:`BatchStore.index_stored`), which is what finishing an acceptance stored by an earlier
release, whose indexes came after its header, does.

A batch whose content is small (at most :data:`INLINE_BYTES`, the common case) is stored in
one logged batch: its content, its header and the rows below, all of it or none. A larger one
is stored in two steps (:meth:`BatchStore.write`), because Cassandra refuses a batch of
statements over several partitions whose data passes ``batch_size_fail_threshold`` (640 KiB
in ``deploy/``, 50 KiB upstream) with "Batch too large", and a batch's content reaches
megabytes (1,000 recipients with 10 kB of substitutions each make one chunk's list 10 MB):

1. its *content* (the message, the stored 202, every chunk's recipient list), in statements
   on the batch's partition alone, each of at most :data:`STATEMENT_BYTES` (a single value
   larger than that goes alone): a single-partition write is not held to the batch threshold,
   only to ``max_mutation_size`` (16 MiB by default), and the API refuses a batch whose content
   would pass that (:func:`too_large`, 413) before anything is written;
2. its *header* (owner, time, counts, status) in one logged batch with the rows of other
   partitions that look after it (its outbox row, its schedule row, a canary's record, its
   indexes): a few kilobytes, all of which land or none.

The header is what makes a batch exist (every read asks for ``created_at``), so content
written by a request that died before step 2, or whose step 2 failed, is invisible: nothing
reads it, nothing sends it, and a retry (same batch id, same values, same write timestamps)
writes the same rows again. A recipient is never half-accepted: step 2 is sent only once
every content statement was acknowledged.

Every id is deterministic: the batch id is fixed before anything is written (when an
``Idempotency-Key`` is claimed, with it) and each recipient's log id derives from the batch id
and the address (``shared.delivery.recipients.log_id_for``), so writing the same batch twice writes
the same rows.

A batch's ``status`` moves only by lightweight transactions (``pending`` to ``accepted`` or
``scheduled`` or ``cancelled``, ``scheduled`` to ``accepted`` or ``cancelled``). A transaction
writes at its Paxos ballot's time, taken from a Cassandra node's clock, so the header's own
write stamps ``status`` at :data:`STORED_STATUS_STAMP`, below any ballot: however far the
API's clock runs ahead of Cassandra's, no plain write can shadow a transition (a transition
that applied and was then read back as the old status stranded scheduled batches). The
splitter's mark is a cell of its own (``dispatched``), which no transaction moves, and the
header read shows it as the status ``dispatched``.
"""

from __future__ import annotations

import asyncio
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Protocol

from cassandra.query import UNSET_VALUE, Statement
from cassandra.util import uuid_from_time

from shared.core import batch_ids
from shared.core.models import Message
from shared.delivery import precedence
from shared.delivery.recipients import CHUNK_ROW, Addressee, encode_recipients
from shared.delivery.stats import Stats, StatsStore
from shared.infra.db import Database, slices, utc


def month_of(batch_id: uuid.UUID) -> str:
    """The ``batches_by_user`` bucket (UTC ``YYYY-MM``) of a time-based batch id."""
    return timeuuid_datetime(batch_id).strftime("%Y-%m")


def timeuuid_datetime(value: uuid.UUID) -> datetime:
    return batch_ids.accepted_at(value)


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

    @property
    def mailed(self) -> int:
        """Addresses it mails (recipients, cc and bcc): what the daily quota charged."""
        return mailed(self.message, self.recipient_count)


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
    ``shared.templates.template_use``), so no chunk mixes the two."""
    send_at: datetime | None = None
    """When a scheduled batch is to go (None: now); it is stored ``scheduled`` until then."""

    pending: bool = False
    """Stored ``pending`` until its request commits it (:meth:`BatchStore.commit`): a request
    without an Idempotency-Key, whose client may send again after an error, so the batch
    must never go unless its 202 was decided."""

    @property
    def status(self) -> str:
        """The status it is stored with."""
        return "pending" if self.pending else self.committed

    @property
    def committed(self) -> str:
        """Its status once accepted: ``scheduled`` until its ``send_at``, else ``accepted``."""
        return "scheduled" if self.send_at is not None else "accepted"

    @property
    def mailed(self) -> int:
        """Addresses it mails (recipients, cc and bcc): what the daily quota charged."""
        return mailed(self.message, len(self.recipients))

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


#: Content bytes one statement of step 1 carries at most; a single value larger than this
#: (a message, a chunk's recipient list) goes alone. Cassandra holds a single-partition
#: write to ``max_mutation_size`` only, not to its batch thresholds: this keeps each request
#: small all the same (a 10 MB batch of small chunks is some forty writes, not one).
STATEMENT_BYTES: Final = 256 * 1024
#: Content bytes (:attr:`Content.size`) small enough to travel in step 2's logged batch
#: instead of ahead of it, making the whole write one request (``make bench``'s 100-recipient
#: batch is some 5 kB). A batch over several partitions is held to
#: ``batch_size_fail_threshold`` (50 KiB upstream, 640 KiB in ``deploy/``): this leaves the
#: header, outbox, schedule and index rows room below either. Cassandra logs a warning for
#: a batch over ``batch_size_warn_threshold`` (5 KiB upstream, 64 KiB in ``deploy/``).
INLINE_BYTES: Final = 32 * 1024
#: Statements of step 1 in flight at once.
STATEMENT_WINDOW: Final = 4
#: Bytes of a mutation that are not our values (keys, clustering, write timestamps, cell
#: headers, the commit log entry's own), kept free below ``max_mutation_size``.
MUTATION_HEADROOM: Final = 64 * 1024


@dataclass(frozen=True, slots=True)
class Content:
    """What step 1 writes, encoded once: measured before anything is accepted
    (:func:`too_large`), then written (:meth:`BatchStore.write`)."""

    message: bytes
    response: bytes
    chunks: tuple[bytes, ...]
    """Each chunk's recipient list (``shared.delivery.recipients.encode_recipients``)."""

    @property
    def size(self) -> int:
        """Bytes of the values it writes."""
        return len(self.message) + len(self.response) + sum(map(len, self.chunks))


def content_of(batch: NewBatch) -> Content:
    """``batch``'s content as its partition stores it (pure; some 10 ms per 10 MB)."""
    return Content(
        batch.message.encode(),
        batch.response,
        tuple(encode_recipients(part) for part in batch.chunks()),
    )


def most_stored(max_mutation_bytes: int) -> int:
    """The most content one batch may store: Cassandra's ``max_mutation_size``
    (``max_mutation_bytes``) less :data:`MUTATION_HEADROOM`."""
    return max_mutation_bytes - MUTATION_HEADROOM


def too_large(content: Content, max_mutation_bytes: int) -> bool:
    """Whether a batch's content passes :func:`most_stored`. The whole content counts, so
    that any one of its statements fits, and so does a read of its whole partition."""
    return content.size > most_stored(max_mutation_bytes)


_INSERT_CHUNK = (
    "INSERT INTO batches (batch_id, chunk, log_id, recipients) VALUES (?, ?, ?, ?) "
    "USING TIMESTAMP ?"
)
_INSERT_BODY = (
    "INSERT INTO batches (batch_id, message, accept_response) VALUES (?, ?, ?) USING TIMESTAMP ?"
)
_INSERT_HEADER = (
    "INSERT INTO batches (batch_id, user_id, created_at, subject, recipient_count, "
    "chunk_size, chunk_count, send_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) USING TIMESTAMP ?"
)
#: The write timestamp of the status a batch is stored with (µs since the epoch): lower than
#: any lightweight transaction's, which are taken from a clock, so every transition wins.
STORED_STATUS_STAMP = 1
_STORED_STATUS = "UPDATE batches USING TIMESTAMP ? SET status = ? WHERE batch_id = ?"
_HEADER_COLUMNS = (
    "batch_id, user_id, created_at, message, recipient_count, chunk_size, chunk_count, status, "
    "dispatched, reason, accept_response, send_at"
)
_INSERT_LISTED = (
    "INSERT INTO batches_by_user (user_id, month, batch_id, subject, recipient_count) "
    "VALUES (?, ?, ?, ?, ?)"
)


def mailed(message: Message, recipients: int) -> int:
    """Addresses a batch of ``recipients`` mails: the quota counts cc and bcc copies too."""
    return recipients + len(message.cc) + len(message.bcc)


def shown_status(status: str | None, dispatched: bool | None) -> str | None:
    """The status a read shows: ``dispatched`` once the splitter marked an accepted batch."""
    return "dispatched" if dispatched and status == "accepted" else status


def _header_stamp(batch_id: uuid.UUID) -> int:
    """The header's write timestamp: the batch's own time, so a cancellation written just
    after it wins however late the header's write lands."""
    return int(batch_ids.accepted_at(batch_id).timestamp() * 1_000_000)


class Batches(Protocol):
    """What callers use of :class:`BatchStore` (the store, or its in-memory twin)."""

    async def write(
        self,
        batch: NewBatch,
        *,
        also: Sequence[Statement] = (),
        content: Content | None = None,
        indexed: bool = False,
    ) -> None: ...

    async def index(self, batch: NewBatch) -> None: ...

    async def index_stored(self, header: BatchHeader) -> None: ...

    async def uncount(self, user_id: uuid.UUID, batch_id: uuid.UUID) -> None: ...

    async def header(self, batch_id: uuid.UUID) -> BatchHeader | None: ...

    async def owner(self, batch_id: uuid.UUID) -> uuid.UUID | None: ...

    async def status(self, batch_id: uuid.UUID) -> str | None: ...

    async def commit(
        self, batch_id: uuid.UUID, status: str, *, timeout: float | None = None
    ) -> str | None: ...

    async def cancel(self, batch_id: uuid.UUID) -> str | None: ...

    async def start_scheduled(self, batch_id: uuid.UUID) -> str | None: ...

    async def cancel_scheduled(self, batch_id: uuid.UUID) -> str | None: ...

    async def mark_dispatched(self, batch_id: uuid.UUID) -> None: ...


class BatchStore:
    """Every batch query; one method per operation."""

    def __init__(self, db: Database, stats: Stats | None = None) -> None:
        self.db = db
        self.stats = stats or StatsStore(db)

    async def write(
        self,
        batch: NewBatch,
        *,
        also: Sequence[Statement] = (),
        content: Content | None = None,
        indexed: bool = False,
    ) -> None:
        """Store ``batch`` (``content``: its :func:`content_of`, when the caller has it):
        its content, then its header in one logged batch with the writes ``also`` of other
        partitions (its outbox row, its schedule row) and, when ``indexed``, its indexes
        (:meth:`index`). Content of at most :data:`INLINE_BYTES` travels in that same logged
        batch: one request. Raises DependencyUnavailable when a step fails, and
        TooLargeToStore when Cassandra refuses a statement for its size: either way the
        batch exists as a whole or not at all (its content alone is never read), and a retry
        writes the same rows."""
        content = content if content is not None else content_of(batch)
        writes = await self._header(batch)
        if content.size <= INLINE_BYTES:
            writes = [*(w for _, w in await self._content(batch, content)), *writes]
        else:
            await self._write_content(batch, content)
        if indexed:
            writes += await self._indexes(
                batch.batch_id, batch.user_id, batch.message.subject, len(batch.recipients)
            )
        await self.db.batch([*writes, *also], logged=bool(also) or indexed)
        if indexed:
            self.stats.recorded(batch.user_id, batch.batch_id)

    async def _content(self, batch: NewBatch, content: Content) -> list[tuple[int, Statement]]:
        """The content's writes, each with the bytes of its values: the message and the
        stored 202, then each chunk's list."""
        db = self.db
        chunk = await db.prepare(_INSERT_CHUNK)
        queued = precedence.queued_stamp(batch.batch_id)
        body = (await db.prepare(_INSERT_BODY)).bind(
            (
                batch.batch_id,
                content.message,
                content.response or UNSET_VALUE,
                _header_stamp(batch.batch_id),
            )
        )
        writes: list[tuple[int, Statement]] = [(len(content.message) + len(content.response), body)]
        writes += [
            (len(part), chunk.bind((batch.batch_id, i, CHUNK_ROW, part, queued)))
            for i, part in enumerate(content.chunks)
        ]
        return writes

    async def _write_content(self, batch: NewBatch, content: Content) -> None:
        """Step 1: the message, the stored 202 and the chunks' lists, on the batch's partition
        alone, in statements of at most :data:`STATEMENT_BYTES` (a larger value alone)."""
        db = self.db
        writes = await self._content(batch, content)
        window = asyncio.Semaphore(STATEMENT_WINDOW)

        async def one(run: range) -> None:
            async with window:
                await db.batch([writes[i][1] for i in run])

        sizes = [size for size, _ in writes]
        await asyncio.gather(*(one(run) for run in slices(sizes, STATEMENT_BYTES)))

    async def _header(self, batch: NewBatch) -> list[Statement]:
        """Step 2's writes of the batch's partition: the header, and the status it is stored
        with."""
        header = (await self.db.prepare(_INSERT_HEADER)).bind(
            (
                batch.batch_id,
                batch.user_id,
                batch_ids.accepted_at(batch.batch_id),
                batch.message.subject,
                len(batch.recipients),
                batch.chunk_size,
                batch.chunk_count,
                batch.send_at or UNSET_VALUE,
                _header_stamp(batch.batch_id),
            )
        )
        status = (await self.db.prepare(_STORED_STATUS)).bind(
            (STORED_STATUS_STAMP, batch.status, batch.batch_id)
        )
        return [header, status]

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
        await self.db.batch(await self._indexes(batch_id, user_id, subject, recipients))
        self.stats.recorded(user_id, batch_id)

    async def _indexes(
        self, batch_id: uuid.UUID, user_id: uuid.UUID, subject: str, recipients: int
    ) -> list[Statement]:
        """The indexes' writes: the user's list, the ``queued`` stat row with its dirty
        marks, and the day's activity unless this process recorded it already."""
        listed = (await self.db.prepare(_INSERT_LISTED)).bind(
            (user_id, month_of(batch_id), batch_id, subject, recipients)
        )
        queued = await self.stats.accepted_statements(
            user_id, batch_id, recipients, _header_stamp(batch_id)
        )
        return [listed, *queued, *await self.stats.activity_statements(user_id, batch_id)]

    async def uncount(self, user_id: uuid.UUID, batch_id: uuid.UUID) -> None:
        """A cancelled batch counts nothing in the stats (idempotent: written just above the
        ``queued`` row's own timestamp, so it wins whichever lands last)."""
        await self.stats.cancelled(user_id, batch_id, _header_stamp(batch_id) + 1)

    async def header(self, batch_id: uuid.UUID) -> BatchHeader | None:
        row = await self.db.one(
            f"SELECT {_HEADER_COLUMNS} FROM batches WHERE batch_id = ? LIMIT 1",  # noqa: S608
            (batch_id,),
        )
        if row is None or row["created_at"] is None or row["message"] is None:
            return None  # not stored, or only its content (step 1) was
        return BatchHeader(
            batch_id=row["batch_id"],
            user_id=row["user_id"],
            created_at=row["created_at"].replace(tzinfo=UTC),
            message=Message.decode(row["message"]),
            recipient_count=row["recipient_count"],
            chunk_size=row["chunk_size"],
            chunk_count=row["chunk_count"],
            status=shown_status(row["status"], row["dispatched"]) or "incomplete",
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
            "SELECT status, dispatched, created_at FROM batches WHERE batch_id = ? LIMIT 1",
            (batch_id,),
        )
        if row is None or row["created_at"] is None:
            return None
        return shown_status(row["status"], row["dispatched"])

    async def commit(
        self, batch_id: uuid.UUID, status: str, *, timeout: float | None = None
    ) -> str | None:
        """Decide a ``pending`` batch's acceptance: ``status`` (``accepted`` or ``scheduled``)
        unless it was cancelled first. The status after: ``status`` when this or an earlier
        commit applied (the transaction reads at SERIAL, so repeating a commit whose outcome
        was unknown tells what was decided). Raises DependencyUnavailable while unknown."""
        return await self._transition(batch_id, "= 'pending'", status, timeout=timeout)

    async def cancel(self, batch_id: uuid.UUID) -> str | None:
        """Cancel a batch its request never committed (the request failed, or died): still
        ``pending``, or not stored at all yet (a write that lands later then stays cancelled,
        its status being stamped below this one). The status after: ``cancelled``, or the one
        its commit decided first."""
        return await self._transition(batch_id, "IN (null, 'pending')", "cancelled")

    async def start_scheduled(self, batch_id: uuid.UUID) -> str | None:
        """Move a scheduled batch to ``accepted`` (its time came), unless it was cancelled:
        a lightweight transaction, so a cancellation racing the scheduler either wins or
        comes too late, never both. The status after (None: no such batch; ``pending``:
        its request has not decided it yet)."""
        return await self._transition(batch_id, "= 'scheduled'", "accepted")

    async def cancel_scheduled(self, batch_id: uuid.UUID) -> str | None:
        """Cancel a batch still waiting for its ``send_at``; the status after: ``cancelled``,
        or the one that made it too late (None: no such batch). The caller settles what a
        cancellation owes (``shared.delivery.acceptance.Acceptance.settle``)."""
        return await self._transition(batch_id, "= 'scheduled'", "cancelled")

    async def _transition(
        self, batch_id: uuid.UUID, condition: str, status: str, *, timeout: float | None = None
    ) -> str | None:
        row = await self.db.one(
            "UPDATE batches SET status = ?, updated_at = ? WHERE batch_id = ? "  # noqa: S608
            f"IF status {condition}",
            (status, datetime.now(UTC), batch_id),
            timeout=timeout,
        )
        if row is None:
            return None
        if row["[applied]"]:
            return status
        current: str | None = row.get("status")
        return current

    async def mark_dispatched(self, batch_id: uuid.UUID) -> None:
        """The splitter published every chunk: reads show the batch ``dispatched`` (a cell no
        transaction moves, so this plain write can neither shadow one nor be shadowed)."""
        await self.db.execute(
            "UPDATE batches SET dispatched = true WHERE batch_id = ?",
            (batch_id,),
            idempotent=True,
        )
