"""In-memory twins of the Cassandra stores the consumers and the webhook service use.

They keep Cassandra's semantics where our correctness depends on them: every cell is
last-write-wins by write timestamp (a tie goes to a deletion, then to the larger value), set
and map columns merge element by element, rows cluster in Cassandra's order, ``IF NOT EXISTS``
and ``IF col = ?`` apply only when their condition holds. What the stores derive from the rows
they read (a chunk's recipients merged with their own rows, a bucket's counts, whether a
rollup is current) is computed by the production functions themselves
(``shared.delivery.recipients.merged_chunk``, ``shared.delivery.precedence.merge``,
``shared.delivery.stats.count_rows``, ``shared.delivery.stats.current`` ...), from rows shaped as
the real reads return them. ``tests/contracts`` runs the same suite over each twin and the real
store, so the twins cannot drift from what they stand in for.

Faults: ``FakeCassandra.fail(operation, error, applied=...)`` makes the next call of a store
operation raise ``error`` before (or, with ``applied=True``, after) it takes effect — a write
whose outcome is unknown.

Sizes: Cassandra refuses, before applying it, a batch of statements over several partitions
whose data passes ``batch_size_fail_threshold`` and a mutation of one partition past
``max_mutation_size`` (:meth:`FakeCassandra.refuse_oversized`, with ``deploy/``'s settings by
default): a twin that wrote a large batch as one request would fail as the real store did.

Clocks: a plain write without ``USING TIMESTAMP`` is stamped by its client's clock (``now``,
the driver's client-side timestamps), a lightweight transaction by a Cassandra node's (its
Paxos ballot: :meth:`FakeCassandra.ballot`), which ``server_offset`` sets apart from the
clients' — a node whose clock runs behind the API's, say.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from functools import partial
from typing import Any

from cassandra.util import SortedSet

from services.webhooks.timeline import Timelines
from services.webhooks.webhook_tokens import Tokens
from shared.audience.suppressions import LOOKUP_CHUNK, SuppressionChecks
from shared.core import batch_ids
from shared.core.errors import DependencyUnavailable, TooLargeToStore
from shared.core.models import Message
from shared.core.webhook_events import ProviderEvent
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
from tests.fakes.wire import LOOPBACK, Kind, Trip, Wire

#: A clustering row of ``batches``: (chunk, log_id).
Clustering = tuple[int, uuid.UUID]
#: ``batch_size_fail_threshold`` of the node ``deploy/local/cassandra.sh`` runs.
BATCH_FAIL_BYTES = 640 * 1024
#: ``max_mutation_size``: half of ``commitlog_segment_size`` (32 MiB there).
MAX_MUTATION_BYTES = 16 * 1024 * 1024
#: What a row another store hands over to be written with a batch (``Write``) weighs: an
#: outbox or schedule row, a canary's record (keys and a few small cells).
OTHER_ROW_BYTES = 100
#: A write a store hands to another to apply with its own (the twin of a bound statement).
Write = Callable[[], None]


def _stored(value: datetime) -> datetime:
    """A timestamp as Cassandra returns it: naive UTC, millisecond precision (the driver
    takes a naive datetime as UTC)."""
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


def _serialized(value: Any) -> Any:
    """What Cassandra compares when two cells tie on timestamp: their serialized bytes, in
    the order of their values for the types we store."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, datetime):
        return _stored(value)
    return value


def _wins(new: tuple[int, Any], old: tuple[int, Any] | None) -> bool:
    """Cassandra's reconciliation of two cells: the later timestamp; on a tie a deletion
    (``None``), then the larger value."""
    if old is None:
        return True
    if new[0] != old[0]:
        return new[0] > old[0]
    if old[1] is None or new[1] is None:
        return new[1] is None and old[1] is not None
    return bool(_serialized(new[1]) > _serialized(old[1]))


def _order(key: Clustering) -> tuple[int, tuple[int, bytes]]:
    return key[0], timeuuid_order(key[1])


@dataclass
class _Cells:
    """One row's cells: plain columns, map entries and set elements, each with its stamp (a
    plain cell whose value is None is a deletion), and the row marker an INSERT writes."""

    plain: dict[str, tuple[int, Any]] = field(default_factory=dict)
    maps: dict[str, dict[str, tuple[int, Any]]] = field(default_factory=lambda: defaultdict(dict))
    sets: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(dict))
    marker: int | None = None

    def insert(self, values: Mapping[str, Any], stamp: int) -> None:
        """An INSERT: the row marker and every column given (None columns are left unset)."""
        self.marker = max(stamp, self.marker or stamp)
        for column, value in values.items():
            if value is not None:
                self.put(column, value, stamp)

    def put(self, column: str, value: Any, stamp: int) -> None:
        value = _stored(value) if isinstance(value, datetime) else value
        if _wins((stamp, value), self.plain.get(column)):
            self.plain[column] = (stamp, value)

    def put_entry(self, column: str, key: str, value: Any, stamp: int) -> None:
        entries = self.maps[column]
        if _wins((stamp, value), entries.get(key)):
            entries[key] = (stamp, value)

    def add(self, column: str, elements: Iterable[str], stamp: int) -> None:
        for element in elements:
            self.sets[column][element] = max(stamp, self.sets[column].get(element, stamp))

    def get(self, column: str) -> Any:
        cell = self.plain.get(column)
        return cell[1] if cell else None

    def stamp(self, column: str) -> int | None:
        """``WRITETIME(column)`` of a plain column (None when it holds nothing)."""
        cell = self.plain.get(column)
        return cell[0] if cell and cell[1] is not None else None

    def as_map(self, column: str) -> tuple[dict[str, Any] | None, list[int] | None]:
        """A map column as read, and ``WRITETIME`` of its entries (in key order)."""
        entries = sorted(self.maps.get(column, {}).items())
        if not entries:
            return None, None
        return {k: v for k, (_, v) in entries}, [t for _, (t, _) in entries]

    def as_set(self, column: str) -> tuple[SortedSet | None, list[int] | None]:
        """A set column as read (the driver's sorted set), and ``WRITETIME`` of its elements
        (in element order)."""
        elements = sorted(self.sets.get(column, {}).items())
        if not elements:
            return None, None
        return SortedSet(e for e, _ in elements), [t for _, t in elements]

    def live(self) -> bool:
        """Whether a read finds the row: a row marker or any cell holding a value."""
        return (
            self.marker is not None
            or any(v is not None for _, v in self.plain.values())
            or any(self.maps.values())
            or any(self.sets.values())
        )


@dataclass
class _StatPartition:
    """One ``stat_rows`` partition (a user's day's bucket): its static cells (``dirty_at``,
    ``rollup``) and its rows by (batch_id, log_id)."""

    static: _Cells = field(default_factory=_Cells)
    rows: dict[tuple[uuid.UUID, uuid.UUID], _Cells] = field(default_factory=dict)


@dataclass
class _Failure:
    error: BaseException
    applied: bool


@dataclass
class _Landing:
    """What ends one operation once its effect is applied: the wire's trip, then the
    injected failure (a write whose answer is lost) if there is one."""

    trip: Trip
    failure: _Failure | None

    def landed(self) -> None:
        self.trip.landed()
        if self.failure is not None:
            raise self.failure.error


#: The operations a fault can be injected into (each store operation that does I/O), and
#: what each round trip is (``tests.fakes.wire.Kind``).
OPERATION_KINDS: dict[str, Kind] = {
    "attempts.create": "lwt",
    "attempts.line": "read",
    "attempts.transition": "lwt",
    "batches.cancel": "write",
    "batches.cancel_scheduled": "lwt",
    "batches.commit": "lwt",
    "batches.content": "write",
    "batches.header": "read",
    "batches.index": "write",
    "batches.index_stored": "write",
    "batches.mark_dispatched": "write",
    "batches.owner": "read",
    "batches.start_scheduled": "lwt",
    "batches.status": "read",
    "batches.uncount": "write",
    "batches.write": "write",
    "outbox.add": "write",
    "outbox.done": "write",
    "outbox.unpublished": "read",
    "quota.add": "write",
    "quota.read": "read",
    "quota.refund": "write",
    "quota.refunded": "read",
    "rate.add": "write",
    "rate.read": "read",
    "recent.cooling": "read",
    "recent.record": "write",
    "preferences.get": "read",
    "preferences.put": "write",
    "recipients.accepted": "write",
    "recipients.batch_rows": "read",
    "recipients.call_failed": "write",
    "recipients.chunk_rows": "read",
    "recipients.give_up": "write",
    "recipients.locate": "read",
    "recipients.member": "read",
    "recipients.one": "read",
    "recipients.reported": "write",
    "recipients.reported_many.stats": "write",
    "recipients.reported_many.states": "write",
    "recipients.stored_chunk": "read",
    "recipients.supersede": "write",
    "recipients.suppressed": "write",
    "stats.accepted": "write",
    "stats.active_users": "read",
    "stats.activity": "write",
    "stats.bucket": "read",
    "stats.bucket_rows": "read",
    "stats.cancelled": "write",
    "stats.day": "read",
    "stats.outcomes": "write",
    "stats.range": "read",
    "stats.hit": "write",
    "stats.marks": "read",
    "stats.unmark": "write",
    "stats.reconcile": "write",
    "stats.recount": "write",
    "stats.rollup": "write",
    "stats.user_days": "read",
    "suppressions.add": "write",
    "suppressions.listed": "read",
    "suppressions.suppressed": "read",
    "timeline.orphan": "write",
    "timeline.record": "write",
    "tokens.accept_once": "lwt",
}
OPERATIONS = frozenset(OPERATION_KINDS)


class FakeCassandra:
    """The tables the twins share (as one keyspace is shared by the real stores)."""

    def __init__(
        self,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        wire: Wire = LOOPBACK,
        *,
        batch_fail_bytes: int = BATCH_FAIL_BYTES,
        max_mutation_bytes: int = MAX_MUTATION_BYTES,
    ) -> None:
        self.now = now
        self.batch_fail_bytes = batch_fail_bytes
        """``batch_size_fail_threshold``: the most data a batch over several partitions holds."""
        self.max_mutation_bytes = max_mutation_bytes
        """``max_mutation_size``: the most data one request writes to one partition."""
        """The clock of server-side times (write timestamps, ``created_at``): the World's."""
        self.wire = wire
        """How each round trip travels (``tests.fakes.wire``): where a simulator's faults go."""
        self.headers: dict[uuid.UUID, _Cells] = {}
        """``batches``' static columns, by batch."""
        self.batches: dict[uuid.UUID, dict[Clustering, _Cells]] = defaultdict(dict)
        """``batches``' clustering rows (chunk rows and recipients' own rows), by batch."""
        self.by_user: dict[tuple[uuid.UUID, str], dict[uuid.UUID, dict[str, Any]]] = defaultdict(
            dict
        )
        self.attempts: dict[tuple[uuid.UUID, str], dict[int, dict[str, Any]]] = defaultdict(dict)
        self.stat_rows: dict[tuple[uuid.UUID, date, int], _StatPartition] = defaultdict(
            _StatPartition
        )
        self.stat_days: dict[tuple[uuid.UUID, date], _Cells] = defaultdict(_Cells)
        #: ``stat_dirty``: by (marked_on, shard), each mark's cells by (user, day, bucket).
        self.stat_dirty: dict[tuple[date, int], dict[tuple[uuid.UUID, date, int], _Cells]] = (
            defaultdict(lambda: defaultdict(_Cells))
        )
        self.active: dict[tuple[date, int], set[uuid.UUID]] = defaultdict(set)
        self.suppressions: dict[tuple[uuid.UUID, str], dict[str, Any]] = {}
        self.list_suppressions: dict[tuple[uuid.UUID, str, str], dict[str, Any]] = {}
        self.engagement: dict[tuple[uuid.UUID, date, str], int] = defaultdict(int)
        self.events: dict[tuple[uuid.UUID, uuid.UUID, datetime, str], dict[str, Any]] = {}
        self.orphans: dict[tuple[str, date, str], str] = {}
        self.tokens: dict[str, bytes] = {}
        self.outbox: dict[tuple[str, datetime, int], dict[uuid.UUID, dict[str, Any]]] = defaultdict(
            dict
        )
        """``outbox_minutes``: (namespace, minute, shard) -> batch -> row."""
        self.quota: dict[tuple[uuid.UUID, date], int] = defaultdict(int)
        """``recipient_quota``'s counters."""
        self.refunds: dict[tuple[uuid.UUID, date], dict[uuid.UUID, int]] = defaultdict(dict)
        """``quota_refunds``: (user, day) -> batch -> recipients."""
        self.rate_windows: dict[tuple[str, date, int], int] = defaultdict(int)
        """``rate_windows``' counters: (key, day, window) -> slots taken."""
        self.recent: dict[tuple[uuid.UUID, str, str], tuple[datetime, uuid.UUID, datetime]] = {}
        """``recent_mail``: (user, email, scope) -> (last_at, batch_id, expires)."""
        self.preferences: dict[uuid.UUID, Any] = {}
        """``user_preferences``: user -> ``shared.accounts.preferences.Preferences``."""
        self._failures: dict[str, list[_Failure]] = defaultdict(list)
        self.calls: list[str] = []
        self.server_offset = timedelta()
        """How far Cassandra's clock (which stamps lightweight transactions) is ahead of the
        clients' (negative: behind)."""
        self._ballot = 0

    def fail(self, operation: str, error: BaseException, *, applied: bool = False) -> None:
        """Make the next ``operation`` (e.g. ``"attempts.transition"``) raise ``error``."""
        if operation not in OPERATIONS:
            raise ValueError(f"no fault point {operation!r}; known: {sorted(OPERATIONS)}")
        self._failures[operation].append(_Failure(error, applied))

    def heal(self) -> None:
        """Drop every fault that has not fired yet (the outage is over)."""
        self._failures.clear()

    def stamp(self) -> int:
        """The write timestamp of a write without ``USING TIMESTAMP``: now, in µs."""
        return int(self.now().timestamp() * 1_000_000)

    def ballot(self) -> int:
        """The write timestamp of a lightweight transaction: its Paxos ballot, from the
        server's clock, and above every ballot before it."""
        server = int((self.now() + self.server_offset).timestamp() * 1_000_000)
        self._ballot = max(self._ballot + 1, server)
        return self._ballot

    def row(self, batch_id: uuid.UUID, chunk: int, log_id: uuid.UUID) -> _Cells:
        """A ``batches`` row to write (an UPDATE creates it if it is missing, as in Cassandra)."""
        return self.batches[batch_id].setdefault((chunk, log_id), _Cells())

    def insert(
        self,
        batch_id: uuid.UUID,
        chunk: int,
        log_id: uuid.UUID,
        values: Mapping[str, Any],
        stamp: int,
    ) -> None:
        """``INSERT INTO batches ... USING TIMESTAMP stamp`` (as release v1 wrote recipients)."""
        self.row(batch_id, chunk, log_id).insert(values, stamp)

    def stored(self, batch_id: uuid.UUID, chunk: int | None = None) -> list[dict[str, Any]]:
        """A batch's (or one chunk's) rows as ``SELECT recipients.SELECT`` returns them, in
        clustering order."""
        rows = self.batches.get(batch_id, {})
        keys = sorted(
            (k for k, c in rows.items() if (chunk is None or k[0] == chunk) and c.live()),
            key=_order,
        )
        return [_selected(k, rows[k]) for k in keys]

    def refuse_oversized(self, partitions: Sequence[int]) -> None:
        """Cassandra's checks of a request's size, before it applies anything: ``partitions``
        are the bytes it writes to each partition it touches. Raises TooLargeToStore as the
        real store does (``shared.infra.db``)."""
        largest = max(partitions, default=0)
        if largest > self.max_mutation_bytes:
            raise TooLargeToStore(
                f"Encountered an oversized mutation ({largest}/{self.max_mutation_bytes})"
            )
        if len(partitions) > 1 and sum(partitions) > self.batch_fail_bytes:
            raise TooLargeToStore("Batch too large")

    @staticmethod
    def apply(writes: Iterable[Write]) -> None:
        """Apply writes as one batch (the twin of ``Database.batch``)."""
        for write in writes:
            write()

    async def _before(self, operation: str) -> _Landing:
        # Every operation goes over the wire, which yields to the event loop as a real round
        # trip does, so concurrent callers interleave here as they would in production.
        trip = await self.wire.trip(operation, OPERATION_KINDS[operation])
        self.calls.append(operation)
        queue = self._failures.get(operation)
        failure = queue.pop(0) if queue else None
        if failure is not None and not failure.applied:
            raise failure.error
        return _Landing(trip, failure)

    @staticmethod
    def _after(done: _Landing) -> None:
        done.landed()


def _selected(key: Clustering, cells: _Cells) -> dict[str, Any]:
    """One ``batches`` row as ``SELECT shared.delivery.recipients.SELECT`` returns it: identity, the
    chunk's list, every state cell and its ``WRITETIME`` (a list for maps and sets)."""
    row: dict[str, Any] = {
        "chunk": key[0],
        "log_id": key[1],
        **{c: cells.get(c) for c in ("recipients", "email", "name", "substitutions")},
    }
    for cell in precedence.SCALAR_CELLS:
        row[cell], row[precedence.stamp_column(cell)] = cells.get(cell), cells.stamp(cell)
    for cell in precedence.MAP_CELLS:
        row[cell], row[precedence.stamp_column(cell)] = cells.as_map(cell)
    for cell in precedence.SET_CELLS:
        row[cell], row[precedence.stamp_column(cell)] = cells.as_set(cell)
    return row


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
        header = self.db.headers.setdefault(batch.batch_id, _Cells())
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
            header = self.db.headers.setdefault(batch.batch_id, _Cells())
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
            h = self.db.headers.setdefault(batch_id, _Cells())
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
        self.db.headers.setdefault(batch_id, _Cells()).put("dispatched", True, self.db.stamp())
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
            (batch_id, log_id), _Cells()
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
        for chunk, stored in by_chunk(self.db.stored(batch_id)).items():
            out += merged_chunk(batch_id, chunk, stored)
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

    def _targets(self, batch_id: uuid.UUID, chosen: Selection) -> list[_Cells]:
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
                created_at=_stored(self.db.now()),
                calling_at=_stored(calling_at) if calling_at else None,
                checks=0,
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
            row.update({k: _stored(v) if isinstance(v, datetime) else v for k, v in values.items()})
        self.db._after(failure)
        return applied


class FakeSuppressions(SuppressionChecks):
    """Twin of :class:`shared.audience.suppressions.SuppressionStore` (add and lookup). A row keeps
    its write time (``version``, the driver's client-side timestamp: above the row's last
    one) and its ``by_recipient`` mark's own, which a write without a mark leaves as it is."""

    def __init__(self, db: FakeCassandra) -> None:
        self.db = db

    async def add(
        self,
        user_id: uuid.UUID,
        email: str,
        *,
        reason: str,
        source: str,
        event_id: str | None = None,
        at: datetime | None = None,
        scope: str | None = None,
        by_recipient: str | None = None,
    ) -> None:
        failure = await self.db._before("suppressions.add")
        key: Any = (user_id, email.lower()) if scope is None else (user_id, scope, email.lower())
        table: dict[Any, dict[str, Any]] = (
            self.db.suppressions if scope is None else self.db.list_suppressions
        )
        earlier = table.get(key, {})
        version = max(self.db.stamp(), earlier.get("version", 0) + 1)
        row: dict[str, Any] = {"reason": reason, "source": source, "event_id": event_id or ""}
        row |= {"version": version, "by_recipient": earlier.get("by_recipient")}
        row["by_recipient_at"] = earlier.get("by_recipient_at", 0)
        if by_recipient is not None:
            row |= {"by_recipient": by_recipient, "by_recipient_at": version}
        table[key] = row
        self.db._after(failure)

    async def suppressed(
        self,
        user_id: uuid.UUID,
        emails: Iterable[str],
        scope: str | None = None,
        *,
        per_query: int = LOOKUP_CHUNK,
    ) -> dict[str, str]:
        """One round trip (fault point ``suppressions.suppressed``) per ``per_query``
        addresses and table, as the real store reads them."""
        wanted = sorted({e.lower() for e in emails})
        found: dict[str, str] = {}
        for i in range(0, len(wanted), per_query):
            part = wanted[i : i + per_query]
            failure = await self.db._before("suppressions.suppressed")
            for e in part:
                if (row := self.db.suppressions.get((user_id, e))) is not None:
                    found[e] = row["reason"]
            self.db._after(failure)
            if scope is None:
                continue
            failure = await self.db._before("suppressions.suppressed")
            for e in part:
                row = self.db.list_suppressions.get((user_id, scope, e))
                if e not in found and row is not None:
                    found[e] = f"{row['reason']} ({scope})"
            self.db._after(failure)
        return found

    async def listed(
        self, user_id: uuid.UUID, most: int, scope: str | None = None
    ) -> dict[str, str] | None:
        failure = await self.db._before("suppressions.listed")
        if scope is None:
            rows = [(k[1], r) for k, r in self.db.suppressions.items() if k[0] == user_id]
        else:
            rows = [
                (k[2], r) for k, r in self.db.list_suppressions.items() if k[:2] == (user_id, scope)
            ]
        self.db._after(failure)
        if len(rows) > most:
            return None
        return {email: row["reason"] for email, row in rows}


class FakeTimeline(Timelines):
    """Twin of :class:`services.webhooks.timeline.Timeline`."""

    def __init__(self, db: FakeCassandra) -> None:
        self.db = db

    async def record(
        self, batch_id: uuid.UUID, log_id: uuid.UUID, ev: ProviderEvent, *, counted: bool
    ) -> None:
        failure = await self.db._before("timeline.record")
        self._put(batch_id, log_id, ev, counted)
        self.db._after(failure)

    async def statement(
        self, batch_id: uuid.UUID, log_id: uuid.UUID, ev: ProviderEvent, *, counted: bool
    ) -> Write:
        return partial(self._put, batch_id, log_id, ev, counted)

    def _put(
        self, batch_id: uuid.UUID, log_id: uuid.UUID, ev: ProviderEvent, counted: bool
    ) -> None:
        self.db.events[(batch_id, log_id, _stored(ev.occurred_at), ev.event_id)] = {
            "kind": ev.kind,
            "provider": ev.provider,
            "attempt": ev.attempt,
            "counted": counted,
        }

    async def orphan(self, ev: ProviderEvent) -> None:
        failure = await self.db._before("timeline.orphan")
        self.db.orphans[(ev.provider, ev.occurred_at.date(), ev.event_id)] = ev.raw_event
        self.db._after(failure)


class FakeWebhookTokens(Tokens):
    """Twin of :class:`services.webhooks.webhook_tokens.WebhookTokens`."""

    def __init__(self, db: FakeCassandra) -> None:
        self.db = db

    async def accept_once(self, token: str, body_hash: bytes) -> bool:
        failure = await self.db._before("tokens.accept_once")
        first = self.db.tokens.setdefault(token, body_hash)
        self.db._after(failure)
        return first == body_hash


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
