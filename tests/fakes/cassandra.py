"""The in-memory Cassandra the twins of ``tests/fakes`` run on (:class:`FakeCassandra`), the
server clock a test moves (:class:`Clock`), and timestamps as Cassandra returns them.

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
from typing import Any, Generic, TypeVar

from cassandra.util import SortedSet

from shared.core.errors import TooLargeToStore
from shared.delivery import precedence
from shared.delivery.recipients import (
    timeuuid_order,
)
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


def _serialized(value: Any) -> Any:
    """What Cassandra compares when two cells tie on timestamp: their serialized bytes, in
    the order of their values for the types we store."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, datetime):
        return as_stored(value)
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
class Cells:
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
        value = as_stored(value) if isinstance(value, datetime) else value
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

    static: Cells = field(default_factory=Cells)
    rows: dict[tuple[uuid.UUID, uuid.UUID], Cells] = field(default_factory=dict)


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


T = TypeVar("T")


@dataclass
class Cell(Generic[T]):
    """A cell that expires on its own (``USING TTL``, a table's ``default_time_to_live``)."""

    value: T
    expires: datetime | None = None

    def alive(self, now: datetime) -> bool:
        return self.value is not None and (self.expires is None or now < self.expires)


@dataclass
class Row:
    """One row's cells (a None value is a deletion) and the marker an INSERT writes, each
    expiring on its own: the row lives as long as any of them does."""

    cells: dict[str, Cell[Any]] = field(default_factory=dict)
    marker: Cell[bool] | None = None

    def write(
        self, values: Mapping[str, Any], expires: datetime | None, *, insert: bool = False
    ) -> None:
        for column, value in values.items():
            self.cells[column] = Cell(value, expires)
        if insert:
            self.marker = Cell(True, expires)

    def read(self, now: datetime) -> dict[str, Any] | None:
        """The row as a SELECT sees it at ``now`` (dead cells left out); None when nothing of
        it lives."""
        live = {c: cell.value for c, cell in self.cells.items() if cell.alive(now)}
        if not live and (self.marker is None or not self.marker.alive(now)):
            return None
        return live


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
        self.headers: dict[uuid.UUID, Cells] = {}
        """``batches``' static columns, by batch."""
        self.batches: dict[uuid.UUID, dict[Clustering, Cells]] = defaultdict(dict)
        """``batches``' clustering rows (chunk rows and recipients' own rows), by batch."""
        self.by_user: dict[tuple[uuid.UUID, str], dict[uuid.UUID, dict[str, Any]]] = defaultdict(
            dict
        )
        self.attempts: dict[tuple[uuid.UUID, str], dict[int, dict[str, Any]]] = defaultdict(dict)
        self.stat_rows: dict[tuple[uuid.UUID, date, int], _StatPartition] = defaultdict(
            _StatPartition
        )
        self.stat_days: dict[tuple[uuid.UUID, date], Cells] = defaultdict(Cells)
        #: ``stat_dirty``: by (marked_on, shard), each mark's cells by (user, day, bucket).
        self.stat_dirty: dict[tuple[date, int], dict[tuple[uuid.UUID, date, int], Cells]] = (
            defaultdict(lambda: defaultdict(Cells))
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
        self.recent: dict[tuple[uuid.UUID, str, str], Row] = {}
        """``recent_mail``: (user, email, scope) -> ``last_at`` and ``batch_id``, with a TTL."""
        self.preferences: dict[uuid.UUID, Any] = {}
        """``user_preferences``: user -> ``shared.accounts.preferences.Preferences``."""
        self.users: dict[uuid.UUID, dict[str, Any]] = {}
        self.users_by_login: dict[str, uuid.UUID] = {}
        self.users_by_github: dict[int, uuid.UUID] = {}
        self.api_keys: dict[str, dict[str, Any]] = {}
        self.api_keys_by_user: dict[uuid.UUID, set[str]] = {}
        self.sessions: dict[str, Row] = {}
        """``sessions``, by the session id's hash; every cell expires."""
        self.idempotency_keys: dict[tuple[uuid.UUID, str], Row] = {}
        """``idempotency_keys``: (user, key) -> claim; every cell expires."""
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

    def row(self, batch_id: uuid.UUID, chunk: int, log_id: uuid.UUID) -> Cells:
        """A ``batches`` row to write (an UPDATE creates it if it is missing, as in Cassandra)."""
        return self.batches[batch_id].setdefault((chunk, log_id), Cells())

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


def _selected(key: Clustering, cells: Cells) -> dict[str, Any]:
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


def millis(value: datetime) -> datetime:
    """``value`` at Cassandra's precision: milliseconds (its zone as it is)."""
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


def as_stored(value: datetime) -> datetime:
    """A timestamp as Cassandra returns it: naive UTC, millisecond precision."""
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return millis(value)


async def interleave() -> None:
    # Concurrent callers interleave at every query, as they do against Cassandra.
    await asyncio.sleep(0)


@dataclass
class Clock:
    """Server time: the wall clock, moved forward by :meth:`advance` (what a test cannot do to
    Cassandra's own clock it does to the twin's)."""

    offset: timedelta = timedelta()

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += timedelta(seconds=seconds)


def ms(value: datetime) -> datetime:
    """A timestamp as the store reads it back: aware UTC, millisecond precision."""
    return millis(value.astimezone(UTC))
