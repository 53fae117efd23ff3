"""In-memory twins of the Cassandra stores the consumers and the webhook service use.

They keep Cassandra's semantics where our correctness depends on them: every cell is
last-write-wins by write timestamp (a tie goes to the larger value, a deletion wins a tie),
set and map columns merge element by element, ``IF NOT EXISTS`` and ``IF col = ?`` apply
only when their condition holds. ``tests/contracts`` runs the same suite over each twin and
the real store, so the twins cannot drift from what they stand in for.

Faults: ``FakeCassandra.fail(operation, error, applied=...)`` makes the next call of a store
operation raise ``error`` before (or, with ``applied=True``, after) it takes effect — a write
whose outcome is unknown.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

import orjson

from shared import precedence
from shared.attempts import COLUMNS, Attempt, from_row
from shared.batchstore import BatchHeader, NewBatch
from shared.stats import OUTCOMES, batch_day
from shared.webhook_events import ProviderEvent

Key = tuple[uuid.UUID, int, uuid.UUID]


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
    """Cassandra's reconciliation of two cells: later timestamp, then the larger value."""
    if old is None or new[0] != old[0]:
        return old is None or new[0] > old[0]
    return bool(_serialized(new[1]) > _serialized(old[1]))


def timeuuid_order(value: uuid.UUID) -> tuple[int, bytes]:
    """Cassandra's order of ``timeuuid`` clustering values: by time, then the clock sequence
    and node compared as signed bytes (Python compares UUIDs as unsigned integers)."""
    return value.time, bytes(b ^ 0x80 for b in value.bytes[8:])


def _clustering(key: Key) -> tuple[int, tuple[int, bytes]]:
    return key[1], timeuuid_order(key[2])


@dataclass
class _Cells:
    """One row's cells: plain columns, map entries and set elements, each with its stamp."""

    plain: dict[str, tuple[int, Any]] = field(default_factory=dict)
    maps: dict[str, dict[str, tuple[int, Any]]] = field(default_factory=lambda: defaultdict(dict))
    sets: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(dict))

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

    def as_map(self, column: str) -> dict[str, Any] | None:
        entries = self.maps.get(column)
        return {k: v for k, (_, v) in sorted(entries.items())} if entries else None

    def as_set(self, column: str) -> frozenset[str] | None:
        elements = self.sets.get(column)
        return frozenset(elements) if elements else None


@dataclass
class _Failure:
    error: BaseException
    applied: bool


#: The operations a fault can be injected into (each store operation that does I/O).
OPERATIONS = frozenset(
    {
        "attempts.create",
        "attempts.line",
        "attempts.transition",
        "batches.header",
        "batches.index",
        "batches.locate",
        "batches.owner",
        "batches.set_status",
        "batches.write",
        "recipients.accepted",
        "recipients.batch_rows",
        "recipients.call_failed",
        "recipients.chunk_rows",
        "recipients.give_up",
        "recipients.one",
        "recipients.reported",
        "recipients.supersede",
        "stats.mark",
        "stats.outcome",
        "suppressions.add",
        "timeline.orphan",
        "timeline.record",
        "tokens.accept_once",
    }
)


class FakeCassandra:
    """The tables the twins share (as one keyspace is shared by the real stores)."""

    def __init__(self, now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.now = now
        """The clock of server-side times (write timestamps, ``created_at``): the World's."""
        self.headers: dict[uuid.UUID, dict[str, Any]] = {}
        self.recipients: dict[Key, _Cells] = {}
        self.emails: dict[tuple[uuid.UUID, str], tuple[int, uuid.UUID]] = {}
        self.attempts: dict[tuple[uuid.UUID, str], dict[int, dict[str, Any]]] = defaultdict(dict)
        self.marks: dict[tuple[uuid.UUID, date, str], dict[str, tuple[int, bool]]] = defaultdict(
            dict
        )
        self.suppressions: dict[tuple[uuid.UUID, str], dict[str, Any]] = {}
        self.events: dict[tuple[uuid.UUID, uuid.UUID, datetime, str], dict[str, Any]] = {}
        self.orphans: dict[tuple[str, date, str], str] = {}
        self.tokens: dict[str, bytes] = {}
        self._failures: dict[str, list[_Failure]] = defaultdict(list)
        self.calls: list[str] = []

    def fail(self, operation: str, error: BaseException, *, applied: bool = False) -> None:
        """Make the next ``operation`` (e.g. ``"attempts.transition"``) raise ``error``."""
        if operation not in OPERATIONS:
            raise ValueError(f"no fault point {operation!r}; known: {sorted(OPERATIONS)}")
        self._failures[operation].append(_Failure(error, applied))

    async def _before(self, operation: str) -> _Failure | None:
        # Every operation yields to the event loop, as a real round trip does, so concurrent
        # callers interleave here as they would in production.
        await asyncio.sleep(0)
        self.calls.append(operation)
        queue = self._failures.get(operation)
        if not queue:
            return None
        failure = queue.pop(0)
        if not failure.applied:
            raise failure.error
        return failure

    @staticmethod
    def _after(failure: _Failure | None) -> None:
        if failure is not None:
            raise failure.error


class FakeBatches:
    """Twin of :class:`shared.batchstore.BatchStore` (the operations the services use)."""

    def __init__(self, db: FakeCassandra, stats: FakeStats | None = None) -> None:
        self.db = db
        self.stats = stats or FakeStats(db)

    async def write(self, batch: NewBatch) -> None:
        failure = await self.db._before("batches.write")
        queued = precedence.queued_stamp(batch.batch_id)
        created = precedence.accepted_at(batch.batch_id)
        for i, r in enumerate(batch.recipients):
            cells = self.db.recipients.setdefault(
                (batch.batch_id, batch.chunk_of(i), r.log_id), _Cells()
            )
            subs = orjson.dumps(r.substitutions).decode() if r.substitutions else None
            for column, value in (
                ("email", r.email),
                ("name", r.name),
                ("substitutions", subs),
                ("state", "queued"),
                ("event", "queued"),
                ("last_update", created),
            ):
                if value is not None:
                    cells.put(column, value, queued)
        self.db.headers.setdefault(
            batch.batch_id,
            {
                "user_id": batch.user_id,
                "created_at": _stored(created).replace(tzinfo=UTC),
                "message": batch.message,
                "recipient_count": len(batch.recipients),
                "chunk_size": batch.chunk_size,
                "chunk_count": batch.chunk_count,
                "status": "accepted",
                "reason": None,
                "response": batch.response or None,
            },
        )
        self.db._after(failure)

    async def index(self, batch: NewBatch) -> None:
        failure = await self.db._before("batches.index")
        for i, r in enumerate(batch.recipients):
            self.db.emails[(batch.batch_id, r.email.lower())] = (batch.chunk_of(i), r.log_id)
        await self.stats.mark(
            batch.user_id, batch.batch_id, "queued", [r.log_id for r in batch.recipients]
        )
        self.db._after(failure)

    async def header(self, batch_id: uuid.UUID) -> BatchHeader | None:
        self.db._after(await self.db._before("batches.header"))
        h = self.db.headers.get(batch_id)
        if h is None:
            return None
        return BatchHeader(batch_id=batch_id, **h)

    async def owner(self, batch_id: uuid.UUID) -> uuid.UUID | None:
        self.db._after(await self.db._before("batches.owner"))
        h = self.db.headers.get(batch_id)
        return h["user_id"] if h else None

    async def locate(self, batch_id: uuid.UUID, email: str) -> tuple[int, uuid.UUID] | None:
        self.db._after(await self.db._before("batches.locate"))
        return self.db.emails.get((batch_id, email.lower()))

    async def status(self, batch_id: uuid.UUID) -> str | None:
        h = self.db.headers.get(batch_id)
        return h["status"] if h else None

    async def set_status(self, batch_id: uuid.UUID, status: str, reason: str | None = None) -> None:
        failure = await self.db._before("batches.set_status")
        if batch_id in self.db.headers:
            self.db.headers[batch_id].update(status=status, reason=reason)
        self.db._after(failure)


class FakeStats:
    """Twin of :class:`shared.stats.StatsStore`: marks are cells, deletions win ties."""

    def __init__(self, db: FakeCassandra) -> None:
        self.db = db

    def _set(self, user_id: uuid.UUID, batch_id: uuid.UUID, metric: str, key: str,
             stamp: int, alive: bool) -> None:  # fmt: skip
        cells = self.db.marks[(user_id, batch_day(batch_id), metric)]
        old = cells.get(key)
        if old is None or stamp > old[0] or (stamp == old[0] and not alive):
            cells[key] = (stamp, alive)

    async def mark(
        self, user_id: uuid.UUID, batch_id: uuid.UUID, metric: str, keys: Iterable[uuid.UUID]
    ) -> None:
        failure = await self.db._before("stats.mark")
        stamp = int(self.db.now().timestamp() * 1_000_000)
        for key in keys:
            self._set(user_id, batch_id, metric, str(key), stamp, True)
        self.db._after(failure)

    async def outcome(
        self,
        user_id: uuid.UUID,
        batch_id: uuid.UUID,
        log_ids: Iterable[uuid.UUID],
        metric: str,
        stamp: int,
    ) -> None:
        failure = await self.db._before("stats.outcome")
        for log_id in log_ids:
            self._set(user_id, batch_id, metric, str(log_id), stamp, True)
            self._set(user_id, batch_id, OUTCOMES[metric], str(log_id), stamp, False)
        self.db._after(failure)

    async def keys(self, user_id: uuid.UUID, day: date, metric: str) -> set[str]:
        cells = self.db.marks.get((user_id, day, metric), {})
        return {k for k, (_, alive) in cells.items() if alive}

    async def count_day(self, user_id: uuid.UUID, day: date) -> dict[str, int]:
        out: dict[str, int] = {}
        for (user, d, metric), cells in self.db.marks.items():
            n = sum(alive for _, alive in cells.values())
            if user == user_id and d == day and n:
                out[metric] = n
        return out


class FakeRecipients:
    """Twin of :class:`shared.recipients.RecipientStore`."""

    def __init__(self, db: FakeCassandra, stats: FakeStats | None = None) -> None:
        self.db = db
        self.stats = stats or FakeStats(db)

    def _row(self, key: Key) -> dict[str, Any]:
        c = self.db.recipients[key]
        return {
            "chunk": key[1],
            "log_id": key[2],
            **{
                col: c.get(col)
                for col in (
                    "email",
                    "name",
                    "substitutions",
                    "state",
                    "event",
                    "reason_detail",
                    "last_update",
                    "gave_up_reason",
                    "gave_up_at",
                )
            },
            "providers": c.as_map("providers"),
            "message_ids": c.as_map("message_ids"),
            "evidence": c.as_set("evidence"),
            "superseded": c.as_set("superseded"),
        }

    def _cells(self, batch_id: uuid.UUID, chunk: int, log_id: uuid.UUID) -> _Cells:
        # An UPDATE creates the row if it is missing, as in Cassandra.
        return self.db.recipients.setdefault((batch_id, chunk, log_id), _Cells())

    async def batch_rows(self, batch_id: uuid.UUID) -> list[dict[str, Any]]:
        self.db._after(await self.db._before("recipients.batch_rows"))
        keys = sorted((k for k in self.db.recipients if k[0] == batch_id), key=_clustering)
        return [self._row(k) for k in keys]

    async def chunk_rows(self, batch_id: uuid.UUID, chunk: int) -> list[dict[str, Any]]:
        self.db._after(await self.db._before("recipients.chunk_rows"))
        keys = sorted(
            (k for k in self.db.recipients if k[0] == batch_id and k[1] == chunk), key=_clustering
        )
        return [self._row(k) for k in keys]

    async def one(
        self, batch_id: uuid.UUID, chunk: int, log_id: uuid.UUID
    ) -> dict[str, Any] | None:
        self.db._after(await self.db._before("recipients.one"))
        key = (batch_id, chunk, log_id)
        return self._row(key) if key in self.db.recipients else None

    async def accepted(
        self,
        batch_id: uuid.UUID,
        chunk: int,
        log_ids: Sequence[uuid.UUID],
        *,
        provider: str,
        tag: str,
        when: datetime,
        message_id: str | None,
    ) -> None:
        failure = await self.db._before("recipients.accepted")
        stamp = precedence.provider_stamp(batch_id, when, 0)
        for log_id in log_ids:
            c = self._cells(batch_id, chunk, log_id)
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
        chunk: int,
        log_ids: Sequence[uuid.UUID],
        *,
        provider: str,
        result: str,
        when: datetime,
    ) -> None:
        failure = await self.db._before("recipients.call_failed")
        stamp = precedence.provider_stamp(batch_id, when, 0)
        for log_id in log_ids:
            self._cells(batch_id, chunk, log_id).put_entry(
                "providers", provider, result[:300], stamp
            )
        self.db._after(failure)

    async def give_up(
        self,
        batch_id: uuid.UUID,
        user_id: uuid.UUID,
        chunk: int,
        log_ids: Sequence[uuid.UUID],
        *,
        reason: str,
        when: datetime,
    ) -> None:
        if not log_ids:
            return
        failure = await self.db._before("recipients.give_up")
        stamp = precedence.give_up_stamp(batch_id)
        for log_id in log_ids:
            c = self._cells(batch_id, chunk, log_id)
            c.put("gave_up_reason", reason[:1000], stamp)
            c.put("gave_up_at", when, stamp)
        await self.stats.outcome(user_id, batch_id, log_ids, "failed", stamp)
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
        c = self._cells(batch_id, chunk, log_id)
        c.add("superseded", [tag], stamp)
        c.put_entry("providers", provider, result[:300], stamp)
        self.db._after(failure)

    async def reported(
        self,
        batch_id: uuid.UUID,
        user_id: uuid.UUID,
        chunk: int,
        log_id: uuid.UUID,
        *,
        provider: str,
        provider_result: str,
        message_id: str | None,
        stage_rank: int,
        rank: int,
        when: datetime,
        event: str | None,
        state: str | None,
        reason: str | None,
        evidence: str | None,
    ) -> None:
        failure = await self.db._before("recipients.reported")
        c = self._cells(batch_id, chunk, log_id)
        stage = precedence.provider_stamp(batch_id, when, stage_rank)
        c.put_entry("providers", provider, provider_result[:300], stage)
        if message_id:
            c.put_entry("message_ids", provider, message_id, stage)
        if evidence is not None:
            c.add("evidence", [evidence], stage)
        if event is not None:
            stamp = precedence.provider_stamp(batch_id, when, rank)
            c.put("event", event, stamp)
            c.put("last_update", when, stamp)
            if state is not None:
                c.put("state", state, stamp)
            if state == "failed" and reason:
                c.put("reason_detail", reason[:1000], stamp)
            if state in ("success", "failed"):
                await self.stats.outcome(user_id, batch_id, [log_id], state, stamp)
        self.db._after(failure)


_ATTEMPT_COLUMNS = [c.strip() for c in COLUMNS.split(",")]


class FakeAttempts:
    """Twin of :class:`shared.attempts.AttemptStore`: every write is conditional."""

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


class FakeSuppressions:
    """Twin of :class:`shared.suppressions.SuppressionStore` (add and lookup)."""

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
    ) -> None:
        failure = await self.db._before("suppressions.add")
        self.db.suppressions[(user_id, email.lower())] = {
            "reason": reason,
            "source": source,
            "event_id": event_id or "",
        }
        self.db._after(failure)

    async def suppressed(self, user_id: uuid.UUID, emails: Iterable[str]) -> dict[str, str]:
        found = ((e, self.db.suppressions.get((user_id, e))) for e in {e.lower() for e in emails})
        return {e: s["reason"] for e, s in found if s is not None}


class FakeTimeline:
    """Twin of :class:`shared.timeline.Timeline`."""

    def __init__(self, db: FakeCassandra) -> None:
        self.db = db

    async def record(
        self, batch_id: uuid.UUID, log_id: uuid.UUID, ev: ProviderEvent, *, counted: bool
    ) -> None:
        failure = await self.db._before("timeline.record")
        self.db.events[(batch_id, log_id, _stored(ev.occurred_at), ev.event_id)] = {
            "kind": ev.kind,
            "provider": ev.provider,
            "attempt": ev.attempt,
            "counted": counted,
        }
        self.db._after(failure)

    async def orphan(self, ev: ProviderEvent) -> None:
        failure = await self.db._before("timeline.orphan")
        self.db.orphans[(ev.provider, ev.occurred_at.date(), ev.event_id)] = ev.raw_event
        self.db._after(failure)


class FakeWebhookTokens:
    """Twin of :class:`shared.webhook_tokens.WebhookTokens`."""

    def __init__(self, db: FakeCassandra) -> None:
        self.db = db

    async def accept_once(self, token: str, body_hash: bytes) -> bool:
        failure = await self.db._before("tokens.accept_once")
        first = self.db.tokens.setdefault(token, body_hash)
        self.db._after(failure)
        return first == body_hash
