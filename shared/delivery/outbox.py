"""The outbox: batches stored but not yet confirmed by the broker, and the relay that publishes
them.

Acceptance (``shared.delivery.acceptance``) writes an outbox row in the same request as the batch
and marks it ``published`` once the broker confirms ``batch.<uuid>`` (rows are written with
``published = false``, which the relay's reads select on). The marks of one API process are
gathered for :data:`MARK_WINDOW` and written in one request per outbox partition
(:class:`Marks`): a busy process marks tens of rows per request instead of one each. A mark
saves the relay work and nothing else: a row whose mark is lost (a failed write, a process
that died with it gathered) is finished again by the relay, a duplicate publish.

Rows live in time buckets, ``(namespace, minute of acceptance, shard)``, and are never deleted
(they expire after a week): no tombstones, and no queue kept in a table. Every interval the
relay reads its own namespace's minutes from the oldest that still held an unpublished row, up
to the grace period, and finishes each unpublished acceptance (``shared.delivery.acceptance``): if
the batch is accepted it rewrites its indexes and publishes it (a duplicate of a publish that did
succeed is harmless downstream) and marks the row; a cancelled batch is settled and its row
marked; a batch still ``pending`` (a request without an Idempotency-Key that never committed
it) is cancelled once its request can no longer commit it, and never published; a batch not
(yet) stored is left alone, because its write may still land, until :data:`ABANDON_AFTER`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
import zlib
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Protocol

from cassandra.query import BoundStatement

from shared.core.batch_ids import accepted_at
from shared.core.errors import DependencyUnavailable
from shared.infra.db import Database
from shared.infra.leases import OUTBOX_WAKE, Announcer, Linger, Notice, woken

log = logging.getLogger(__name__)

#: Partitions of one namespace's outbox per minute (spreads one minute's writes).
SHARDS = 4
#: An outbox row whose batch is still not stored this long after acceptance belongs to a
#: request that failed (its client got an error, and a retry with the same Idempotency-Key
#: finishes it through the API): the relay stops looking at it.
ABANDON_AFTER = timedelta(hours=1)
_MINUTE = timedelta(minutes=1)
#: Seconds an idle relay waits for a wake-up before looking anyway.
IDLE_EVERY = 30.0
#: Seconds the marks of published rows are gathered before they are written together (far
#: below any relay grace period, so the relay does not finish a row whose mark is on its way).
MARK_WINDOW: Final = 0.05

#: Finishes one batch's acceptance; returns None when the batch is not stored (or not yet
#: decided by its request): the row is looked at again.
Finish = Callable[[uuid.UUID], Awaitable[Any]]


def shard_of(batch_id: uuid.UUID) -> int:
    return zlib.crc32(batch_id.bytes) % SHARDS


def minute_of(when: datetime) -> datetime:
    """The outbox bucket of an instant: its UTC minute."""
    return when.astimezone(UTC).replace(second=0, microsecond=0)


def minutes(start: datetime, end: datetime) -> list[datetime]:
    """Every minute bucket from ``start``'s to ``end``'s, inclusive (pure)."""
    first, last = minute_of(start), minute_of(end)
    return [first + i * _MINUTE for i in range(int((last - first) / _MINUTE) + 1)]


class OutboxRows(Protocol):
    """What callers use of :class:`Outbox` (the store, or its in-memory twin)."""

    written: Callable[[], None]

    @staticmethod
    def bucket(batch_id: uuid.UUID) -> tuple[datetime, int]: ...

    async def add(self, batch_id: uuid.UUID, user_id: uuid.UUID) -> None: ...

    async def statement(self, batch_id: uuid.UUID, user_id: uuid.UUID) -> BoundStatement: ...

    async def done(self, batch_id: uuid.UUID) -> None: ...

    async def done_many(self, batch_ids: Iterable[uuid.UUID]) -> None: ...

    async def unpublished(self, minute: datetime, shard: int) -> list[uuid.UUID]: ...


class Outbox:
    """The outbox rows of one broker namespace (the exchange batches are published to)."""

    def __init__(self, db: Database, namespace: str) -> None:
        self.db = db
        self.namespace = namespace
        #: Called as a row's write is built (the relays are told: :func:`tell_relays`).
        self.written: Callable[[], None] = _unheard

    @staticmethod
    def bucket(batch_id: uuid.UUID) -> tuple[datetime, int]:
        """The (minute, shard) partition a batch's row lives in."""
        return minute_of(accepted_at(batch_id)), shard_of(batch_id)

    def _key(self, batch_id: uuid.UUID) -> tuple[str, datetime, int, uuid.UUID]:
        return (self.namespace, *self.bucket(batch_id), batch_id)

    async def add(self, batch_id: uuid.UUID, user_id: uuid.UUID) -> None:
        await self.db.batch([await self.statement(batch_id, user_id)])

    async def statement(self, batch_id: uuid.UUID, user_id: uuid.UUID) -> BoundStatement:
        """The outbox row's write, for a caller to send with the batch's own."""
        self.written()
        insert = await self.db.prepare(
            "INSERT INTO outbox_minutes (namespace, minute, shard, batch_id, user_id, published) "
            "VALUES (?, ?, ?, ?, ?, false)"
        )
        return insert.bind((*self._key(batch_id), user_id))

    async def done(self, batch_id: uuid.UUID) -> None:
        """The batch was published (or will never be): the relay skips its row from now on."""
        await self.db.execute(_MARK, self._key(batch_id), idempotent=True)

    async def done_many(self, batch_ids: Iterable[uuid.UUID]) -> None:
        """:meth:`done` for many batches: one request per outbox partition, all at once."""
        mark = await self.db.prepare(_MARK)
        parts: dict[tuple[datetime, int], list[uuid.UUID]] = defaultdict(list)
        for batch_id in batch_ids:
            parts[self.bucket(batch_id)].append(batch_id)
        writes = [self.db.batch([mark.bind(self._key(b)) for b in ids]) for ids in parts.values()]
        if len(writes) == 1:
            await writes[0]  # in the caller's task: no task started for one request
            return
        await asyncio.gather(*writes)

    async def unpublished(self, minute: datetime, shard: int) -> list[uuid.UUID]:
        """The batches of one bucket not (yet) marked published, oldest first.

        Filtered by Cassandra within the one partition: a minute of a busy API holds
        thousands of rows, nearly all published, and decoding them all in this process
        every pass stalled its event loop for up to 100 ms under ``make bench``.
        """
        rows = await self.db.all_pages(
            "SELECT batch_id FROM outbox_minutes "
            "WHERE namespace = ? AND minute = ? AND shard = ? AND published = false "
            "ALLOW FILTERING",
            (self.namespace, minute, shard),
        )
        return [row["batch_id"] for row in rows]


_MARK = (
    "UPDATE outbox_minutes SET published = true "
    "WHERE namespace = ? AND minute = ? AND shard = ? AND batch_id = ?"
)


class Marked(Protocol):
    """What :class:`Marks` writes through (:class:`Outbox` and its twin)."""

    async def done_many(self, batch_ids: Iterable[uuid.UUID]) -> None: ...


class Marks:
    """Outbox rows to mark published, gathered for ``window`` seconds from the first and
    written together (:meth:`Outbox.done_many`)."""

    def __init__(self, outbox: Marked, window: float = MARK_WINDOW) -> None:
        self.outbox = outbox
        self.window = window
        self._gathered: set[uuid.UUID] = set()
        self._write: asyncio.Future[None] | None = None

    async def mark(self, batch_id: uuid.UUID) -> None:
        """Mark the batch's row published with the others of its window; returns once that
        write was answered (a failed one is logged: the relay finishes those rows again).
        With no window, each is written at once by its caller."""
        if self.window <= 0:
            await self._written({batch_id})
            return
        self._gathered.add(batch_id)
        if self._write is None:
            self._write = asyncio.ensure_future(self._written_later())
            self._write.add_done_callback(_retrieved)
        # Shielded: a caller cancelled (its request's task ended) leaves the others' write.
        await asyncio.shield(self._write)

    async def _written_later(self) -> None:
        await asyncio.sleep(self.window)
        taken, self._gathered, self._write = self._gathered, set(), None
        await self._written(taken)

    async def _written(self, taken: set[uuid.UUID]) -> None:
        try:
            await self.outbox.done_many(taken)
        except DependencyUnavailable as exc:
            log.warning(
                "of %d outbox row(s), some not marked published (%s); the relay finishes them",
                len(taken),
                exc,
            )


class Relay:
    """Finishes the acceptances the API could not (the broker did not confirm, or the process
    died): one per process, remembering the oldest minute that still held work."""

    def __init__(
        self,
        outbox: OutboxRows,
        finish: Finish,
        *,
        grace: float,
        every: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.outbox = outbox
        self.finish = finish
        self.grace = timedelta(seconds=grace)
        self.since: datetime | None = None
        #: How the loop waits: every interval while rows written (heard of) may still become
        #: due, else :data:`IDLE_EVERY` or until a wake-up.
        self.linger = Linger(every, IDLE_EVERY, clock)
        #: Whether the last pass left work (or none ran yet): the next follows soon.
        self.found = True

    @property
    def every(self) -> float:
        """Seconds between passes while there may be work (``relay_forever`` sets it)."""
        return self.linger.busy_every

    @every.setter
    def every(self, seconds: float) -> None:
        self.linger.busy_every = seconds

    def awake(self) -> None:
        """A row was (or is about to be) written: pass every interval until it is due and
        looked at (a grace period, an interval for the next wake-up and one for the write)."""
        self.linger.stay_awake(self.grace.total_seconds() + 2 * self.every)

    def heard(self, body: bytes) -> None:
        """An announcement: a writer's wake-up keeps the relay awake."""
        if woken(body) == OUTBOX_WAKE:
            self.awake()

    def next_in(self) -> float:
        """Seconds until the next pass: the interval while there may be work, else
        :data:`IDLE_EVERY` (``shared.infra.leases.next_period``)."""
        return self.linger.next_in(busy=self.found)

    async def once(self, now: datetime | None = None) -> int:
        """One pass; returns how many acceptances it finished."""
        now = now or datetime.now(UTC)
        cutoff = now - self.grace
        # From the oldest minute with work, and never later than a grace period before the
        # cutoff: a row written just before a pass may land just after it.
        start = min(self.since or now - ABANDON_AFTER, cutoff - self.grace)
        oldest: datetime | None = None
        finished = 0
        for minute in minutes(start, cutoff):
            for shard in range(SHARDS):
                for batch_id in await self.outbox.unpublished(minute, shard):
                    created = accepted_at(batch_id)
                    if created <= cutoff and await self.finish(batch_id) is not None:
                        finished += 1
                        continue
                    if now - created > ABANDON_AFTER:
                        await self.outbox.done(batch_id)
                        continue
                    oldest = minute if oldest is None else min(oldest, minute)
        self.since = oldest or minute_of(cutoff)
        self.found = oldest is not None
        return finished


async def relay_forever(relay: Relay, *, interval: float) -> None:
    """Pass after pass until cancelled (an outage stops a pass, a bug the loop), ``interval``
    apart while there may be work, else until a wake-up (:meth:`Relay.next_in`)."""
    relay.every = interval
    relay.awake()  # rows written before it started are looked at by its first passes
    while True:
        failed = False
        try:
            count = await relay.once()
            if count:
                log.info("outbox relay finished %d acceptance(s)", count)
        except DependencyUnavailable as exc:
            log.warning("outbox relay: %s", exc)
            failed = True  # the next pass comes an interval later, woken or not
        await relay.linger.wait(busy=failed or relay.found)


def tell_relays(
    outbox: OutboxRows, broker: Announcer, every: float, own: Relay | None = None
) -> OutboxRows:
    """``outbox``, telling every process's relay when it writes a row (a wake-up on the
    settings fanout at its first row and at most one per ``every`` seconds after) and
    ``own``, this process's relay, at every row (whether the broker is reachable or not)."""
    notice = Notice(broker, OUTBOX_WAKE, every)

    def written() -> None:
        if own is not None:
            own.awake()
        notice.touch()

    outbox.written = written
    return outbox


def _unheard() -> None:
    """No relay is told of rows (tools, tests)."""


def _retrieved(write: asyncio.Future[None]) -> None:
    """Its callers hear how a write of marks ended; one left with none (all cancelled) does
    not leave asyncio to report an exception nobody retrieved."""
    if not write.cancelled():
        write.exception()
