"""Recipient state: the one module that reads and writes it, with the outcome rows that
mirror it in the stats.

Layout (``deploy/cql/0008``): a batch's partition holds one row per chunk (``log_id`` =
:data:`CHUNK_ROW`) with the chunk's recipient list and the state all its recipients share,
and a row per recipient only once its fate diverges. A write that concerns every recipient of
a chunk (a provider accepted the chunk, a call failed, every provider failed) is one write of
the chunk's row; anything else is written to the recipients' own rows. Readers merge the two
cell by cell by write timestamp (:func:`shared.delivery.precedence.merge`), which is exactly what
one row per recipient would have held, so every reader sees one row per recipient either way.
Batches stored before v2 have recipient rows only, and read as they always did.

Every write carries a timestamp from :mod:`shared.delivery.precedence`, so writes from the consumers
and from the webhook intake merge by last-write-wins however they interleave or repeat. An outcome
is mirrored in the recipient's stat row (``shared.delivery.stats``) at the same timestamp: for one
recipient in the same logged batch as its state; for a chunk, the stat rows first and the
chunk's row last, so a retry (the recipients still look queued) writes both again. Many
recipients' reports at once (a webhook delivery, :meth:`RecipientStore.reported_many`) go the
same way: stat rows first in one unlogged batch per stat partition, then states and timeline
rows in one unlogged batch per batch partition (a report alone is one recipient's: one logged
batch).
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any, Protocol

import orjson
from cassandra.query import BoundStatement, Statement

from shared.core.addresses import address_key
from shared.delivery import precedence
from shared.delivery.stats import Stats, StatsStore, batch_day
from shared.infra.db import Database, Row
from shared.infra.gil import CpuLane

#: Chunks whose log ids a store remembers (reads of a chunk, :meth:`RecipientStore.member`).
MEMBER_CACHE = 32

#: Days recorded as active at once by a delivery's round (each a write unless remembered).
ACTIVITY_WINDOW = 16

#: Bytes of a chunk's stored recipient list above which reading it is done in a worker thread.
LARGE_CHUNK_ROW = 256 * 1024

#: The ``log_id`` of a chunk's own row: time 0, so it sorts before every recipient's.
CHUNK_ROW = uuid.UUID("00000000-0000-1000-8000-000000000000")

#: Kinds of line a recipient's evidence tags name: its chunk's (``c``) or its own (``r``).
CHUNK, OWN = "c", "r"

#: What a read selects: identity, the chunk's list, and every state cell with its stamps.
SELECT = (
    "chunk, log_id, recipients, email, name, substitutions, "
    + ", ".join(precedence.STATE_CELLS)
    + ", "
    + ", ".join(f"WRITETIME({c}) AS {precedence.stamp_column(c)}" for c in precedence.STATE_CELLS)
)


class Addressee(Protocol):
    @property
    def email(self) -> str: ...
    @property
    def name(self) -> str | None: ...
    @property
    def substitutions(self) -> Mapping[str, str]: ...


def log_id_for(batch_id: uuid.UUID, email: str) -> uuid.UUID:
    """The log id of ``email`` in a batch: a time-based UUID with the batch's time and a
    clock sequence and node derived from the address, so it is the same on every read."""
    low = int.from_bytes(hashlib.sha256(batch_id.bytes + address_key(email).encode()).digest()[:8])
    clock_seq, node = (low >> 48) & 0x3FFF, low & 0xFFFFFFFFFFFF
    return uuid.UUID(int=(batch_id.int >> 64 << 64) | ((0x8000 | clock_seq) << 48) | node)


def timeuuid_order(value: uuid.UUID) -> tuple[int, bytes]:
    """Cassandra's order of ``timeuuid`` clustering values: by time, then the clock sequence
    and node compared as signed bytes (Python compares UUIDs as unsigned integers). The logs
    page lists a chunk's recipients in this order, as one row per recipient was listed."""
    return value.time, bytes(b ^ 0x80 for b in value.bytes[8:])


def encode_recipients(recipients: Iterable[Addressee]) -> bytes:
    """A chunk's recipient list as stored in its row: ``[email, name?, substitutions?]``."""
    out: list[list[Any]] = []
    for r in recipients:
        if r.substitutions:
            out.append([r.email, r.name, dict(r.substitutions)])
        elif r.name is not None:
            out.append([r.email, r.name])
        else:
            out.append([r.email])
    return orjson.dumps(out)


def decode_recipients(raw: bytes) -> list[tuple[str, str | None, dict[str, str]]]:
    out = []
    for item in orjson.loads(raw):
        out.append((item[0], item[1] if len(item) > 1 else None, item[2] if len(item) > 2 else {}))
    return out


def accepted_by_line(row: Row, kind: str) -> bool:
    """Whether a provider is known to have accepted this recipient through a line of ``kind``.

    Rows written before attempts were tagged carry no evidence: any event past ``queued``
    then counts as acceptance by the chunk.
    """
    evidence = row.get("evidence") or ()
    if any(t.startswith(kind + ".") for t in evidence):
        return True
    return kind == CHUNK and not evidence and (row.get("event") or "queued") != "queued"


def merged_chunk(
    batch_id: uuid.UUID,
    chunk: int,
    rows: Sequence[Row],
    log_ids: Sequence[uuid.UUID] | None = None,
) -> list[dict[str, Any]]:
    """Every recipient of one chunk as readers see it, from the chunk's stored rows (pure).

    ``rows`` are the chunk's rows as read (its own row first if it has one). Without a chunk
    row (a batch stored before v2) the recipient rows are the recipients. Each result holds
    the state cells, ``chunk``, ``log_id``, ``email``, ``name``, ``substitutions`` and ``own``
    (whether it has a row of its own). ``log_ids`` are those of the chunk's list, when known
    (:func:`chunk_log_ids`).
    """
    if not rows or rows[0]["log_id"] != CHUNK_ROW:
        return [
            {
                **r,
                "own": True,
                "layout": "rows",
                "substitutions": substitutions_of(r.get("substitutions")),
            }
            for r in rows
            if r["log_id"] is not None
        ]
    shared_row, own = rows[0], {r["log_id"]: r for r in rows[1:]}
    base = precedence.merge(shared_row, None)
    out = []
    listed = decode_recipients(shared_row["recipients"] or b"[]")
    ids = log_ids if log_ids is not None else [log_id_for(batch_id, e) for e, _, _ in listed]
    for (email, name, subs), log_id in zip(listed, ids, strict=True):
        mine = own.get(log_id)
        cells = base if mine is None else precedence.merge(shared_row, mine)
        out.append(
            {
                **cells,
                "chunk": chunk,
                "log_id": log_id,
                "email": email,
                "name": name,
                "substitutions": subs,
                "own": mine is not None,
                "layout": "chunk",
            }
        )
    return out


def merged_one(
    batch_id: uuid.UUID, chunk: int, log_id: uuid.UUID, rows: Iterable[Row]
) -> dict[str, Any] | None:
    """One recipient as readers see it, from its chunk's row and its own (among ``rows``),
    without its address (pure). None when neither exists.

    The log id comes from our own correlation data (a job, a signed event, checked with
    :meth:`RecipientStore.member`): it is not proven against the chunk's list here.
    """
    stored = {r["log_id"]: r for r in rows if r["log_id"] in (CHUNK_ROW, log_id)}
    shared_row, mine = stored.get(CHUNK_ROW), stored.get(log_id)
    if shared_row is None:
        return None if mine is None else merged_chunk(batch_id, chunk, [mine])[0]
    return {
        **precedence.merge(shared_row, mine),
        "chunk": chunk,
        "log_id": log_id,
        "email": None,
        "name": None,
        "substitutions": {},
        "own": mine is not None,
        "layout": "chunk",
    }


def chunk_log_ids(batch_id: uuid.UUID, chunk_row: Row) -> tuple[uuid.UUID, ...]:
    """The log ids of a chunk row's list, in its order."""
    return tuple(
        log_id_for(batch_id, email)
        for email, _, _ in decode_recipients(chunk_row["recipients"] or b"[]")
    )


def listed(chunk_row: Row) -> int:
    """How many recipients a chunk's row lists."""
    return len(orjson.loads(chunk_row["recipients"] or b"[]"))


def substitutions_of(raw: Any) -> dict[str, str]:
    """Substitutions as stored: a v1 row's JSON text, or already a mapping."""
    if not raw:
        return {}
    value = orjson.loads(raw) if isinstance(raw, str | bytes) else raw
    return dict(value)


def by_chunk(rows: Iterable[Row]) -> dict[int, list[Row]]:
    """Stored rows grouped by chunk, in stored order (the header's static-only row left out)."""
    out: dict[int, list[Row]] = {}
    for r in rows:
        if r["chunk"] is not None:
            out.setdefault(r["chunk"], []).append(r)
    return out


@dataclass(frozen=True, slots=True)
class Selection:
    """The recipients of one chunk a write is for."""

    chunk: int
    log_ids: tuple[uuid.UUID, ...]
    whole: bool = False
    """Every recipient of a chunk that has a row of its own: written once, to that row."""

    @classmethod
    def of(cls, chunk: int, everyone: Sequence[Row], chosen: Sequence[Row]) -> Selection:
        """``chosen`` among the chunk's recipients (``everyone``, as read) (pure)."""
        whole = (
            bool(chosen)
            and len(chosen) == len(everyone)
            and all(r.get("layout") == "chunk" for r in everyone)
        )
        return cls(chunk, tuple(r["log_id"] for r in chosen), whole)

    @classmethod
    def one(cls, chunk: int, log_id: uuid.UUID) -> Selection:
        return cls(chunk, (log_id,))


@dataclass(frozen=True, slots=True)
class Report:
    """One provider report on one recipient (:meth:`RecipientStore.reported`,
    :meth:`RecipientStore.reported_many`)."""

    batch_id: uuid.UUID
    user_id: uuid.UUID
    chunk: int
    log_id: uuid.UUID
    provider: str
    provider_result: str
    message_id: str | None
    stage_rank: int
    rank: int
    when: datetime
    event: str | None
    state: str | None
    reason: str | None
    evidence: str | None
    metrics: Sequence[str] = ()
    also: Sequence[Any] = field(default=())
    """Writes of the batch's partition to send with the state (its timeline row)."""


def by_partition(statements: Iterable[BoundStatement]) -> list[list[BoundStatement]]:
    """Statements grouped by the partition they write (their routing key), each group once
    per distinct write: an unlogged batch of one group is one mutation, atomic and cheap."""
    groups: dict[object, dict[tuple[str, tuple[object, ...]], BoundStatement]] = {}
    for i, stmt in enumerate(statements):
        key: object = stmt.routing_key if stmt.routing_key is not None else ("alone", i)
        same = (stmt.prepared_statement.query_string, tuple(stmt.values))
        groups.setdefault(key, {})[same] = stmt
    return [list(g.values()) for g in groups.values()]


class Recipients(Protocol):
    """What callers use of :class:`RecipientStore` (the store, or its in-memory twin)."""

    stats: Stats

    async def batch_rows(self, batch_id: uuid.UUID) -> list[dict[str, Any]]: ...

    async def chunk_rows(self, batch_id: uuid.UUID, chunk: int) -> list[dict[str, Any]]: ...

    async def stored_chunk(self, batch_id: uuid.UUID, chunk: int) -> list[Row]: ...

    async def one(
        self, batch_id: uuid.UUID, chunk: int, log_id: uuid.UUID, *, addresses: bool = False
    ) -> dict[str, Any] | None: ...

    async def member(self, batch_id: uuid.UUID, chunk: int, log_id: uuid.UUID) -> bool: ...

    async def locate(self, batch_id: uuid.UUID, email: str) -> tuple[int, uuid.UUID] | None: ...

    async def accepted(
        self,
        batch_id: uuid.UUID,
        chosen: Selection,
        *,
        provider: str,
        tag: str,
        when: datetime,
        message_id: str | None,
    ) -> None: ...

    async def call_failed(
        self, batch_id: uuid.UUID, chosen: Selection, *, provider: str, result: str, when: datetime
    ) -> None: ...

    async def give_up(
        self,
        batch_id: uuid.UUID,
        user_id: uuid.UUID,
        chosen: Selection,
        *,
        reason: str,
        when: datetime,
    ) -> None: ...

    async def suppressed(
        self,
        batch_id: uuid.UUID,
        user_id: uuid.UUID,
        chunk: int,
        reasons: Mapping[uuid.UUID, str],
        *,
        when: datetime,
    ) -> None: ...

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
    ) -> None: ...

    async def reported(self, report: Report) -> None: ...

    async def reported_many(self, reports: Sequence[Report]) -> None: ...


class RecipientStore:
    """Reads and writes of recipient state in ``batches`` (and its stat rows)."""

    def __init__(
        self, db: Database, stats: Stats | None = None, cpu: CpuLane | None = None
    ) -> None:
        self.db = db
        self.stats = stats or StatsStore(db)
        self.cpu = cpu or CpuLane()
        self._members: OrderedDict[
            tuple[uuid.UUID, int], tuple[tuple[uuid.UUID, ...], frozenset[int]]
        ] = OrderedDict()

    # -- reads --------------------------------------------------------------------------

    async def batch_rows(self, batch_id: uuid.UUID) -> list[dict[str, Any]]:
        """Every recipient of a batch as readers see it, in stored order."""
        rows = await self.db.all_pages(
            f"SELECT {SELECT} FROM batches WHERE batch_id = ?",  # noqa: S608
            (batch_id,),
            page_size=5000,
        )
        out: list[dict[str, Any]] = []
        for chunk, stored in by_chunk(rows).items():
            out += merged_chunk(batch_id, chunk, stored)
        return out

    async def chunk_rows(self, batch_id: uuid.UUID, chunk: int) -> list[dict[str, Any]]:
        """Every recipient of one chunk as readers see it."""
        rows = await self.stored_chunk(batch_id, chunk)
        if not rows or rows[0]["log_id"] != CHUNK_ROW:
            return merged_chunk(batch_id, chunk, rows)
        if len(rows[0]["recipients"] or b"") <= LARGE_CHUNK_ROW:
            return merged_chunk(batch_id, chunk, rows, self._ids(batch_id, chunk, rows[0])[0])
        # Decoding megabytes of recipients, hashing their log ids and merging their rows is
        # tens of milliseconds of CPU: done on the CPU lane, not on the event loop.
        computed = None
        if (batch_id, chunk) not in self._members:
            computed = await self.cpu.run(chunk_log_ids, batch_id, rows[0])
        ids = self._ids(batch_id, chunk, rows[0], computed)[0]
        return await self.cpu.run(merged_chunk, batch_id, chunk, rows, ids)

    def _ids(
        self,
        batch_id: uuid.UUID,
        chunk: int,
        chunk_row: Row,
        computed: tuple[uuid.UUID, ...] | None = None,
    ) -> tuple[tuple[uuid.UUID, ...], frozenset[int]]:
        """A chunk's log ids (remembered: a chunk is read again and again while it is sent
        and while its events arrive, and its list never changes); ``computed``: those of
        ``chunk_row`` already worked out by the caller."""
        key = (batch_id, chunk)
        known = self._members.get(key)
        if known is None:
            ids = computed if computed is not None else chunk_log_ids(batch_id, chunk_row)
            known = (ids, frozenset(i.int for i in ids))
            self._members[key] = known
            if len(self._members) > MEMBER_CACHE:
                self._members.popitem(last=False)
        else:
            self._members.move_to_end(key)
        return known

    async def stored_chunk(self, batch_id: uuid.UUID, chunk: int) -> list[Row]:
        """A chunk's rows as stored (its own row first), for :func:`merged_chunk`."""
        return await self.db.all_pages(
            f"SELECT {SELECT} FROM batches WHERE batch_id = ? AND chunk = ?",  # noqa: S608
            (batch_id, chunk),
            page_size=5000,
        )

    async def one(
        self, batch_id: uuid.UUID, chunk: int, log_id: uuid.UUID, *, addresses: bool = False
    ) -> dict[str, Any] | None:
        """One recipient as readers see it (None if the chunk has no such recipient).

        Without ``addresses`` its address, name and substitutions may be missing: finding
        them in the chunk's list costs a hash per recipient of the chunk.
        """
        if addresses:
            return next(
                (r for r in await self.chunk_rows(batch_id, chunk) if r["log_id"] == log_id),
                None,
            )
        rows = await self.db.rows(
            f"SELECT {SELECT} FROM batches "  # noqa: S608
            "WHERE batch_id = ? AND chunk = ? AND log_id IN ?",
            (batch_id, chunk, [CHUNK_ROW, log_id]),
        )
        return merged_one(batch_id, chunk, log_id, rows)

    async def member(self, batch_id: uuid.UUID, chunk: int, log_id: uuid.UUID) -> bool:
        """Whether ``log_id`` names a recipient of the chunk (the log ids of recently asked
        chunks are remembered: events come chunk after chunk)."""
        known = self._members.get((batch_id, chunk))
        if known is None:
            rows = await self.db.rows(
                "SELECT log_id, recipients FROM batches "
                "WHERE batch_id = ? AND chunk = ? AND log_id IN ?",
                (batch_id, chunk, [CHUNK_ROW, log_id]),
            )
            listed = next((r for r in rows if r["log_id"] == CHUNK_ROW), None)
            if listed is None:  # stored before v2: one row per recipient
                return any(r["log_id"] == log_id for r in rows)
            known = self._ids(batch_id, chunk, listed)
        else:
            self._members.move_to_end((batch_id, chunk))
        return log_id.int in known[1]

    async def locate(self, batch_id: uuid.UUID, email: str) -> tuple[int, uuid.UUID] | None:
        """The chunk and log id of a batch's recipient, by address (case-insensitive)."""
        wanted = address_key(email)
        rows = await self.db.all_pages(
            "SELECT chunk, log_id, recipients, email FROM batches WHERE batch_id = ?",
            (batch_id,),
            page_size=5000,
        )
        for r in rows:
            if r["log_id"] == CHUNK_ROW:
                for address, _, _ in decode_recipients(r["recipients"] or b"[]"):
                    if address_key(address) == wanted:
                        return r["chunk"], log_id_for(batch_id, address)
            elif r["email"] is not None and address_key(r["email"]) == wanted:
                return r["chunk"], r["log_id"]
        return None

    # -- writes -------------------------------------------------------------------------

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
        """A provider accepted attempt ``tag`` for these recipients (our record or its word)."""
        stamp = precedence.provider_stamp(batch_id, when, 0)
        sets = "evidence = evidence + ?, event = ?, last_update = ?, providers[?] = ?"
        values: list[object] = [{tag}, "sent", when, provider, "sent"]
        if message_id:
            sets += ", message_ids[?] = ?"
            values += [provider, message_id]
        await self.db.batch(await self._updates(batch_id, chosen, stamp, sets, values))

    async def call_failed(
        self,
        batch_id: uuid.UUID,
        chosen: Selection,
        *,
        provider: str,
        result: str,
        when: datetime,
    ) -> None:
        """A provider refused (or failed) a call for these recipients: the providers map only."""
        stamp = precedence.provider_stamp(batch_id, when, 0)
        await self.db.batch(
            await self._updates(
                batch_id, chosen, stamp, "providers[?] = ?", [provider, result[:300]]
            )
        )

    async def give_up(
        self,
        batch_id: uuid.UUID,
        user_id: uuid.UUID,
        chosen: Selection,
        *,
        reason: str,
        when: datetime,
    ) -> None:
        """Every provider and retry failed: these recipients end ``failed`` unless a provider
        says otherwise, now or later (the give-up is outranked by any provider evidence)."""
        if not chosen.log_ids:
            return
        stamp = precedence.give_up_stamp(batch_id)
        state = await self._updates(
            batch_id, chosen, stamp, "gave_up_reason = ?, gave_up_at = ?", [reason[:1000], when]
        )
        if len(chosen.log_ids) == 1:
            outcome = await self.stats.outcome_statements(
                user_id,
                batch_id,
                chosen.log_ids[0],
                outcome="failed",
                stamp=stamp,
                now=datetime.now(UTC),
            )
            await self.db.batch([*state, *outcome], logged=True)
            await self.stats.activity(user_id, batch_id)
            return
        # Too many for one logged batch: the outcome rows first, the state last, so until the
        # state is in the recipients still look queued and a retry writes both again.
        await self.stats.outcomes(user_id, batch_id, chosen.log_ids, "failed", stamp)
        await self.db.batch(state)

    async def suppressed(
        self,
        batch_id: uuid.UUID,
        user_id: uuid.UUID,
        chunk: int,
        reasons: Mapping[uuid.UUID, str],
        *,
        when: datetime,
    ) -> None:
        """These recipients (log id -> why) were found on the suppression list at send time:
        each ends ``dropped`` and ``failed`` on a row of its own, never sent, counted
        ``failed`` once (at :func:`shared.delivery.precedence.suppressed_stamp`, fixed per batch, so
        a rerun writes the same cells and any provider evidence still outranks it)."""
        if not reasons:
            return
        stamp = precedence.suppressed_stamp(batch_id)
        stmt = await self.db.prepare(
            "UPDATE batches USING TIMESTAMP ? SET event = ?, state = ?, reason_detail = ?, "
            "last_update = ? WHERE batch_id = ? AND chunk = ? AND log_id = ?"
        )
        state = [
            stmt.bind((stamp, "dropped", "failed", why[:1000], when, batch_id, chunk, log_id))
            for log_id, why in reasons.items()
        ]
        if len(reasons) == 1:
            (log_id,) = reasons
            outcome = await self.stats.outcome_statements(
                user_id, batch_id, log_id, outcome="failed", stamp=stamp, now=datetime.now(UTC)
            )
            await self.db.batch([*state, *outcome], logged=True)
            await self.stats.activity(user_id, batch_id)
            return
        # As a give-up: the outcome rows first, the states last (one partition: one
        # mutation), so until the states are in the recipients still look queued and a rerun
        # writes both again.
        await self.stats.outcomes(user_id, batch_id, list(reasons), "failed", stamp)
        await self.db.batch(state)

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
        """Attempt ``tag`` was handed over to another provider: its later failures no longer
        decide this recipient's fate."""
        stamp = precedence.provider_stamp(batch_id, when, 0)
        await self.db.batch(
            await self._updates(
                batch_id,
                Selection.one(chunk, log_id),
                stamp,
                "superseded = superseded + ?, providers[?] = ?",
                [{tag}, provider, result[:300]],
            )
        )

    async def reported(self, report: Report) -> None:
        """A provider reported on one recipient (a normalised webhook event), or our own
        tracking endpoint did (``provider_result`` empty: no provider entry is written).

        The provider's own map entries merge by the event's stage (``stage_rank``); the
        recipient-wide columns (event, state) by ``rank``, which lets a re-send's events win
        over the failure that caused it. An outcome (``state``) and the metrics the event
        earns go to the recipient's stat row in the same logged batch, with the writes
        ``also`` of the batch's partition (the event's timeline row).
        """
        stmts, counted = await self._report(report, datetime.now(UTC))
        await self.db.batch([*report.also, *stmts, *counted], logged=bool(counted))
        if counted:
            await self.stats.activity(report.user_id, report.batch_id)

    async def reported_many(self, reports: Sequence[Report]) -> None:
        """Many reports at once (a webhook delivery's events, at most one per recipient: a
        recipient's second report must be decided after its first is written).

        One report is :meth:`reported`: one logged batch, one request, where the groups
        below would cost three requests in two steps (issue 34: a one-event delivery, a
        Mailgun post, fell from 668 to 396 events/s that way). For more, the stat rows go
        first, one unlogged batch per stat partition, then the states with their ``also``
        writes, one unlogged batch per batch partition: each batch is one mutation (atomic),
        so a failure between or within them leaves some stat rows without their states, never
        a state without its stat row, and the provider's retry of the delivery writes the same
        cells again (fixed stamps, boolean marks), counted once.
        """
        if len(reports) == 1:
            await self.reported(reports[0])
            return
        now = datetime.now(UTC)
        counted: list[BoundStatement] = []
        states: dict[uuid.UUID, list[Statement]] = {}
        active: dict[tuple[uuid.UUID, date], uuid.UUID] = {}
        for report in reports:
            stmts, stats = await self._report(report, now)
            states.setdefault(report.batch_id, []).extend([*report.also, *stmts])
            if stats:
                counted += stats
                active.setdefault((report.user_id, batch_day(report.batch_id)), report.batch_id)
        await asyncio.gather(*(self.db.batch(group) for group in by_partition(counted)))
        window = asyncio.Semaphore(ACTIVITY_WINDOW)

        async def activity(user_id: uuid.UUID, batch_id: uuid.UUID) -> None:
            async with window:
                await self.stats.activity(user_id, batch_id)

        await asyncio.gather(*(activity(user, batch) for (user, _), batch in active.items()))
        await asyncio.gather(*(self.db.batch(group) for group in states.values()))

    async def _report(
        self, r: Report, now: datetime
    ) -> tuple[list[BoundStatement], list[BoundStatement]]:
        """The writes of one report: the recipient's state, and its stat row's."""
        one = Selection.one(r.chunk, r.log_id)
        stage = precedence.provider_stamp(r.batch_id, r.when, r.stage_rank)
        stmts: list[BoundStatement] = []
        if r.provider_result:  # our own tracking endpoint is no provider: no entry of its own
            sets = "providers[?] = ?"
            values: list[object] = [r.provider, r.provider_result[:300]]
            if r.message_id:
                sets += ", message_ids[?] = ?"
                values += [r.provider, r.message_id]
            if r.evidence is not None:
                sets += ", evidence = evidence + ?"
                values.append({r.evidence})
            stmts = await self._updates(r.batch_id, one, stage, sets, values)
        stamp = precedence.provider_stamp(r.batch_id, r.when, r.rank)
        if r.event is not None:
            sets = "event = ?, last_update = ?"
            values = [r.event, r.when]
            if r.state is not None:
                sets += ", state = ?"
                values.append(r.state)
            if r.state == "failed" and r.reason:
                sets += ", reason_detail = ?"
                values.append(r.reason[:1000])
            stmts += await self._updates(r.batch_id, one, stamp, sets, values)
        outcome = r.state if r.state in ("success", "failed") else None
        counted = await self.stats.outcome_statements(
            r.user_id,
            r.batch_id,
            r.log_id,
            outcome=outcome,
            stamp=stamp,
            metrics=r.metrics,
            now=now,
        )
        return stmts, counted

    async def _updates(
        self,
        batch_id: uuid.UUID,
        chosen: Selection,
        stamp: int,
        sets: str,
        values: Sequence[object],
    ) -> list[BoundStatement]:
        """The same update at ``stamp`` of the chunk's row (``whole``) or of each recipient's
        own row: fixed timestamps, so a retry writes the same cells."""
        stmt = await self.db.prepare(
            f"UPDATE batches USING TIMESTAMP ? SET {sets} "  # noqa: S608 - fixed columns
            "WHERE batch_id = ? AND chunk = ? AND log_id = ?"
        )
        targets = (CHUNK_ROW,) if chosen.whole else chosen.log_ids
        return [stmt.bind((stamp, *values, batch_id, chosen.chunk, t)) for t in targets]
