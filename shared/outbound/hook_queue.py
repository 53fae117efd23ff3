"""What is queued for users' webhook endpoints and how it went, in Cassandra: the only
module that writes these tables of ``deploy/cql/0023_user_webhooks.cql``:

* ``user_webhook_queue`` + ``user_webhook_hours``: each endpoint's ordered queue in hour
  buckets; rows are marked ``done``, never deleted (they expire after :data:`QUEUE_DAYS`), so
  reading is never slowed by tombstones and no partition grows without bound.
* ``user_webhook_cursors``: per endpoint, the worker lease (the ``owner`` column, written with
  a TTL by lightweight transactions: two workers never hold it at once, and a dead worker's
  lease lapses), the low-water mark ``since`` and the head event's failed attempts.
* ``user_webhook_messages``: each message's body by webhook-id, for replay, and the replay
  waiting to be delivered (one at a time per message).
* ``user_webhook_replays``: replay requests by Idempotency-Key, for a day.
* ``user_webhook_deliveries``: the delivery log, newest first, :data:`LOG_DAYS` days.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any, Final, Protocol

from cassandra.util import min_uuid_from_time, unix_time_from_uuid1

from shared.infra.db import Database, slices, utc

#: Events queued per logged batch (each is about 1 kB with its message row).
ENQUEUE_SLICE = 25
#: Body bytes one logged batch carries at most (a body is written twice, in its queue row and
#: its message row; a longer one goes alone): a slice of events with long reasons or click
#: URLs (up to 1,000 characters each) stays under Cassandra's ``batch_size_fail_threshold``
#: even at its upstream default (50 KiB), which refuses the whole slice.
ENQUEUE_BYTES = 32 * 1024
#: Slices written at once.
ENQUEUE_WINDOW = 8

#: Days of delivery log kept (and read back at most).
LOG_DAYS: Final = 30
#: Days a queued event is kept (the retries last about a day; an endpoint disabled longer
#: than this loses the oldest of what waited, and the user replays from the log).
QUEUE_DAYS: Final = 8
#: Seconds a waiting replay's mark lives (a request that failed half-way does not block
#: replays for longer than the retries of one delivery last).
REPLAY_MARK_SECONDS: Final = 86_400


@dataclass(frozen=True, slots=True)
class Queued:
    """An event to queue for one endpoint."""

    endpoint_id: uuid.UUID
    msg_id: str
    type: str
    body: bytes
    replay: bool = False


def enqueued(rows: Sequence[Queued]) -> list[range]:
    """The slices :meth:`HookQueue.enqueue` writes ``rows`` in, each one logged batch: at
    most :data:`ENQUEUE_SLICE` events and :data:`ENQUEUE_BYTES` of bodies (pure)."""
    sizes = [len(row.body) * (1 if row.replay else 2) for row in rows]
    return slices(sizes, ENQUEUE_BYTES, count=ENQUEUE_SLICE)


@dataclass(frozen=True, slots=True)
class Pending:
    """A queued event not yet done, as the worker reads it."""

    hour: datetime
    seq: uuid.UUID
    msg_id: str
    type: str
    body: bytes
    replay: bool

    @property
    def at(self) -> datetime:
        return datetime.fromtimestamp(unix_time_from_uuid1(self.seq), UTC)


@dataclass(frozen=True, slots=True)
class Cursor:
    since: datetime | None = None
    attempts: int = 0
    next_try: datetime | None = None


@dataclass(frozen=True, slots=True)
class Delivery:
    """One line of the delivery log."""

    at: datetime
    msg_id: str
    type: str
    attempt: int
    status: int | None
    error: str | None
    duration_ms: int


def hour_of(when: datetime) -> datetime:
    return when.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


class Deliveries(Protocol):
    """What callers use of :class:`HookQueue` (the store, or its in-memory twin)."""

    async def enqueue(self, rows: Sequence[Queued]) -> None: ...

    async def pending(
        self, endpoint_id: uuid.UUID, since: datetime, *, limit: int = 100
    ) -> list[Pending]: ...

    async def done(self, endpoint_id: uuid.UUID, item: Pending) -> None: ...

    async def start(self, endpoint_id: uuid.UUID, now: datetime) -> None: ...

    async def reset(self, endpoint_id: uuid.UUID) -> None: ...

    async def take_lease(self, endpoint_id: uuid.UUID, owner: uuid.UUID, ttl: int) -> bool: ...

    async def renew_lease(self, endpoint_id: uuid.UUID, owner: uuid.UUID, ttl: int) -> bool: ...

    async def release_lease(self, endpoint_id: uuid.UUID, owner: uuid.UUID) -> None: ...

    async def cursor(self, endpoint_id: uuid.UUID) -> Cursor: ...

    async def move(self, endpoint_id: uuid.UUID, owner: uuid.UUID, cursor: Cursor) -> bool: ...

    async def message(self, endpoint_id: uuid.UUID, msg_id: str) -> Queued | None: ...

    async def claim_replay(
        self, endpoint_id: uuid.UUID, msg_id: str, replay_id: uuid.UUID
    ) -> uuid.UUID: ...

    async def replay_request(
        self, endpoint_id: uuid.UUID, msg_id: str, key: str, replay_id: uuid.UUID
    ) -> tuple[uuid.UUID, bool] | None: ...

    async def replay_answered(
        self, endpoint_id: uuid.UUID, msg_id: str, key: str, replay_id: uuid.UUID, queued: bool
    ) -> None: ...

    async def replay_done(self, endpoint_id: uuid.UUID, msg_id: str) -> None: ...

    async def log(self, endpoint_id: uuid.UUID, entry: Delivery) -> None: ...

    async def deliveries(
        self, endpoint_id: uuid.UUID, today: date, *, limit: int = 100
    ) -> list[Delivery]: ...


class HookQueue:
    """Every read and write of the endpoints' queues, leases, cursors, messages and log."""

    def __init__(self, db: Database) -> None:
        self.db = db

    # ------------------------------------------------------------------ queue

    async def enqueue(self, rows: Sequence[Queued]) -> None:
        """Queue events, in the order given (their ``seq``, taken here in that order): each
        slice of at most :data:`ENQUEUE_SLICE` events and :data:`ENQUEUE_BYTES` of bodies
        atomically (a logged batch), up to :data:`ENQUEUE_WINDOW` slices at once, so a
        chunk's thousand events neither make one huge batch nor wait on each other (the
        order is the ``seq``'s, and the worker reads them in that order). A failure part-way
        leaves some slices queued; the caller's retry queues them again (same
        ``webhook-id``s: at least once)."""
        numbered = [(uuid.uuid1(), row) for row in rows]  # increasing within this process
        window = asyncio.Semaphore(ENQUEUE_WINDOW)

        async def one(part: Sequence[tuple[uuid.UUID, Queued]]) -> None:
            async with window:
                await self._enqueue(part)

        await asyncio.gather(*(one(numbered[run.start : run.stop]) for run in enqueued(rows)))

    async def _enqueue(self, rows: Sequence[tuple[uuid.UUID, Queued]]) -> None:
        if not rows:
            return
        insert = await self.db.prepare(
            "INSERT INTO user_webhook_queue (endpoint_id, hour, seq, msg_id, type, body, "
            "replay, done) VALUES (?, ?, ?, ?, ?, ?, ?, false)"
        )
        hours = await self.db.prepare(
            "INSERT INTO user_webhook_hours (endpoint_id, hour) VALUES (?, ?)"
        )
        message = await self.db.prepare(
            "INSERT INTO user_webhook_messages (endpoint_id, msg_id, type, body) "
            "VALUES (?, ?, ?, ?)"
        )
        statements: list[Any] = []
        seen_hours: set[tuple[uuid.UUID, datetime]] = set()
        for seq, row in rows:
            hour = hour_of(datetime.fromtimestamp(unix_time_from_uuid1(seq), UTC))
            statements.append(
                insert.bind(
                    (row.endpoint_id, hour, seq, row.msg_id, row.type, row.body, row.replay)
                )
            )
            if (row.endpoint_id, hour) not in seen_hours:
                seen_hours.add((row.endpoint_id, hour))
                statements.append(hours.bind((row.endpoint_id, hour)))
            if not row.replay:
                statements.append(message.bind((row.endpoint_id, row.msg_id, row.type, row.body)))
        await self.db.batch(statements, logged=True)

    async def pending(
        self, endpoint_id: uuid.UUID, since: datetime, *, limit: int = 100
    ) -> list[Pending]:
        """Up to ``limit`` events of the endpoint queued at or after ``since`` and not done,
        oldest first."""
        hour_rows = await self.db.rows(
            "SELECT hour FROM user_webhook_hours WHERE endpoint_id = ? AND hour >= ?",
            (endpoint_id, hour_of(since)),
        )
        found: list[Pending] = []
        for hour_row in hour_rows:
            hour = utc(hour_row["hour"])
            # LIMIT: a pass reads what it may send, not the whole backlog of the hour.
            rows = await self.db.all_pages(
                "SELECT seq, msg_id, type, body, replay FROM user_webhook_queue "
                "WHERE endpoint_id = ? AND hour = ? AND seq >= ? AND done = false "
                "LIMIT ? ALLOW FILTERING",
                (endpoint_id, hour, min_uuid_from_time(since.timestamp()), limit - len(found)),
            )
            for r in rows:
                found.append(
                    Pending(hour, r["seq"], r["msg_id"], r["type"], r["body"], bool(r["replay"]))
                )
                if len(found) >= limit:
                    return found
        return found

    async def done(self, endpoint_id: uuid.UUID, item: Pending) -> None:
        await self.db.execute(
            "UPDATE user_webhook_queue SET done = true "
            "WHERE endpoint_id = ? AND hour = ? AND seq = ?",
            (endpoint_id, item.hour, item.seq),
            idempotent=True,
        )

    # ------------------------------------------------------------------ lease and cursor

    async def start(self, endpoint_id: uuid.UUID, now: datetime) -> None:
        """A new endpoint starts with what happens from ``now`` on."""
        await self.db.execute(
            "UPDATE user_webhook_cursors SET since = ?, attempts = 0 WHERE endpoint_id = ?",
            (now, endpoint_id),
            idempotent=True,
        )

    async def reset(self, endpoint_id: uuid.UUID) -> None:
        """Forget the waiting retry (an endpoint enabled again is tried at once)."""
        await self.db.execute(
            "UPDATE user_webhook_cursors SET attempts = 0, next_try = null WHERE endpoint_id = ?",
            (endpoint_id,),
            idempotent=True,
        )

    async def take_lease(self, endpoint_id: uuid.UUID, owner: uuid.UUID, ttl: int) -> bool:
        """Hold the endpoint for ``ttl`` seconds unless another worker holds it."""
        row = await self.db.one(
            "UPDATE user_webhook_cursors USING TTL ? SET owner = ? WHERE endpoint_id = ? "
            "IF owner = null",
            (ttl, owner, endpoint_id),
        )
        return bool(row and row["[applied]"])

    async def renew_lease(self, endpoint_id: uuid.UUID, owner: uuid.UUID, ttl: int) -> bool:
        """Keep holding it; False when the lease lapsed (another worker may have it)."""
        row = await self.db.one(
            "UPDATE user_webhook_cursors USING TTL ? SET owner = ? WHERE endpoint_id = ? "
            "IF owner = ?",
            (ttl, owner, endpoint_id, owner),
        )
        return bool(row and row["[applied]"])

    async def release_lease(self, endpoint_id: uuid.UUID, owner: uuid.UUID) -> None:
        await self.db.one(
            "UPDATE user_webhook_cursors SET owner = null WHERE endpoint_id = ? IF owner = ?",
            (endpoint_id, owner),
        )

    async def cursor(self, endpoint_id: uuid.UUID) -> Cursor:
        row = await self.db.one(
            "SELECT since, attempts, next_try FROM user_webhook_cursors WHERE endpoint_id = ?",
            (endpoint_id,),
        )
        if row is None:
            return Cursor()
        return Cursor(utc(row["since"]), row["attempts"] or 0, utc(row["next_try"]))

    async def move(self, endpoint_id: uuid.UUID, owner: uuid.UUID, cursor: Cursor) -> bool:
        """Write the cursor if ``owner`` still holds the lease (False: it does not)."""
        row = await self.db.one(
            "UPDATE user_webhook_cursors SET since = ?, attempts = ?, next_try = ? "
            "WHERE endpoint_id = ? IF owner = ?",
            (cursor.since, cursor.attempts, cursor.next_try, endpoint_id, owner),
        )
        return bool(row and row["[applied]"])

    # ------------------------------------------------------------------ messages and replay

    async def message(self, endpoint_id: uuid.UUID, msg_id: str) -> Queued | None:
        row = await self.db.one(
            "SELECT type, body FROM user_webhook_messages WHERE endpoint_id = ? AND msg_id = ?",
            (endpoint_id, msg_id),
        )
        if row is None or row["body"] is None:
            return None
        return Queued(endpoint_id, msg_id, row["type"], row["body"], replay=True)

    async def claim_replay(
        self, endpoint_id: uuid.UUID, msg_id: str, replay_id: uuid.UUID
    ) -> uuid.UUID:
        """Mark a replay of the message as waiting unless one already is: the replay that
        waits (``replay_id`` when this call claimed it)."""
        row = await self.db.one(
            "UPDATE user_webhook_messages USING TTL ? SET replay_pending = ? "
            "WHERE endpoint_id = ? AND msg_id = ? IF replay_pending = null",
            (REPLAY_MARK_SECONDS, replay_id, endpoint_id, msg_id),
        )
        if row and row["[applied]"]:
            return replay_id
        found: uuid.UUID | None = row.get("replay_pending") if row else None
        return found or replay_id

    async def replay_request(
        self, endpoint_id: uuid.UUID, msg_id: str, key: str, replay_id: uuid.UUID
    ) -> tuple[uuid.UUID, bool] | None:
        """Record the replay request with Idempotency-Key ``key``; None when this is its
        first time, else the (replay id, queued) the first one was answered with (its
        answer may still be on its way: then ``replay_id`` is the one it claimed)."""
        row = await self.db.one(
            "INSERT INTO user_webhook_replays (endpoint_id, msg_id, key, replay_id) "
            "VALUES (?, ?, ?, ?) IF NOT EXISTS",
            (endpoint_id, msg_id, key, replay_id),
        )
        if row is None or row["[applied]"]:
            return None
        return row["replay_id"], bool(row.get("queued"))

    async def replay_answered(
        self, endpoint_id: uuid.UUID, msg_id: str, key: str, replay_id: uuid.UUID, queued: bool
    ) -> None:
        await self.db.execute(
            "UPDATE user_webhook_replays SET replay_id = ?, queued = ? "
            "WHERE endpoint_id = ? AND msg_id = ? AND key = ?",
            (replay_id, queued, endpoint_id, msg_id, key),
            idempotent=True,
        )

    async def replay_done(self, endpoint_id: uuid.UUID, msg_id: str) -> None:
        await self.db.execute(
            "UPDATE user_webhook_messages SET replay_pending = null "
            "WHERE endpoint_id = ? AND msg_id = ?",
            (endpoint_id, msg_id),
            idempotent=True,
        )

    # ------------------------------------------------------------------ delivery log

    async def log(self, endpoint_id: uuid.UUID, entry: Delivery) -> None:
        await self.db.execute(
            "INSERT INTO user_webhook_deliveries (endpoint_id, day, at, msg_id, type, attempt, "
            "status, error, duration_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                endpoint_id,
                entry.at.astimezone(UTC).date(),
                uuid.uuid1(),
                entry.msg_id,
                entry.type,
                entry.attempt,
                entry.status,
                entry.error,
                entry.duration_ms,
            ),
            idempotent=True,
        )

    async def deliveries(
        self, endpoint_id: uuid.UUID, today: date, *, limit: int = 100
    ) -> list[Delivery]:
        """The newest ``limit`` lines of the log, newest first."""
        out: list[Delivery] = []
        for back in range(LOG_DAYS + 1):
            rows = await self.db.rows(
                "SELECT at, msg_id, type, attempt, status, error, duration_ms "
                "FROM user_webhook_deliveries WHERE endpoint_id = ? AND day = ? LIMIT ?",
                (endpoint_id, today - timedelta(days=back), limit - len(out)),
            )
            out.extend(
                Delivery(
                    datetime.fromtimestamp(unix_time_from_uuid1(r["at"]), UTC),
                    r["msg_id"],
                    r["type"],
                    r["attempt"],
                    r["status"],
                    r["error"],
                    r["duration_ms"],
                )
                for r in rows
            )
            if len(out) >= limit:
                break
        return out
