"""In-memory twin of :class:`shared.delivery.schedule_store.ScheduleStore`: the batches waiting in
the minute they are due, and each namespace's lease and cursor.

It keeps what the scheduler depends on: every round trip yields to the event loop; the lease
is a lightweight transaction on a cell with a TTL, so a holder is the only one until it
releases the lease or the TTL passes on the twin's :class:`Clock` (which a test moves); the
cursor moves only under ``IF owner = ?``; rows read back in Cassandra's order (minutes oldest
first, each minute's batches in ``timeuuid`` order) with timestamps at Cassandra's precision
(UTC, milliseconds); a row expires with the table's ``default_time_to_live``.
``tests/contracts/test_schedule_store.py`` runs one suite over this twin and the real store.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Final

from shared.core.lanes import BUCKET, bucket_of
from shared.delivery.recipients import timeuuid_order
from shared.delivery.schedule_store import MAX_MINUTES, Due, Schedules
from tests.fakes.account_stores import Clock
from tests.fakes.stores import Write
from tests.fakes.wire import LOOPBACK, Wire, round_trip

#: ``scheduled_batches``' ``default_time_to_live`` (deploy/cql).
ROW_TTL: Final = timedelta(seconds=3_196_800)


def ms(value: datetime) -> datetime:
    """A timestamp as the store reads it back: aware UTC, millisecond precision."""
    value = value.astimezone(UTC)
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


@dataclass
class _Lease:
    owner: uuid.UUID
    expires: datetime


@dataclass
class ScheduleTables:
    """``scheduled_batches`` and ``scheduler_state``, shared by the twins of one keyspace."""

    clock: Clock = field(default_factory=Clock)
    rows: dict[tuple[str, datetime], dict[uuid.UUID, tuple[datetime, datetime]]] = field(
        default_factory=dict
    )
    """(namespace, minute) -> batch -> (send_at, expires)."""
    leases: dict[str, _Lease] = field(default_factory=dict)
    cursors: dict[str, datetime] = field(default_factory=dict)
    wire: Wire = LOOPBACK
    """How each round trip travels (``tests.fakes.wire``)."""


class FakeSchedule(Schedules):
    """Twin of :class:`shared.delivery.schedule_store.ScheduleStore` (every operation; ``statement``
    gives a :data:`tests.fakes.stores.Write` to apply with the caller's own write)."""

    def __init__(self, namespace: str, tables: ScheduleTables | None = None) -> None:
        self.namespace = namespace
        self.tables = tables or ScheduleTables()

    @property
    def wire(self) -> Wire:
        return self.tables.wire

    def _now(self) -> datetime:
        return self.tables.clock.now()

    @round_trip("schedule.add", "write")
    async def add(self, batch_id: uuid.UUID, at: datetime) -> None:
        self._put(batch_id, at)

    async def statement(self, batch_id: uuid.UUID, at: datetime) -> Write:
        return partial(self._put, batch_id, at)

    def _put(self, batch_id: uuid.UUID, at: datetime) -> None:
        minute = self.tables.rows.setdefault((self.namespace, bucket_of(at)), {})
        minute[batch_id] = (ms(at), self._now() + ROW_TTL)

    def _holder(self) -> uuid.UUID | None:
        lease = self.tables.leases.get(self.namespace)
        return lease.owner if lease and self._now() < lease.expires else None

    async def take_lease(self, owner: uuid.UUID, seconds: int, *, renewing: bool = False) -> bool:
        if renewing:
            # The renewal first, IF owner = owner; a free lease is then taken.
            trip = await self.wire.trip("schedule.renew_lease", "lwt")
            holder = self._holder()
            if holder == owner:
                self._lease(owner, seconds)
            trip.landed()
            if holder is not None:
                return holder == owner
            trip = await self.wire.trip("schedule.take_lease", "lwt")
            holder = self._holder()
            if holder is None:
                self._lease(owner, seconds)
            trip.landed()
            return holder is None
        trip = await self.wire.trip("schedule.take_lease", "lwt")
        holder = self._holder()
        if holder is None:
            self._lease(owner, seconds)
        trip.landed()
        if holder is None or holder != owner:
            return holder is None
        # The renewal is a second transaction, IF owner = owner.
        trip = await self.wire.trip("schedule.renew_lease", "lwt")
        renewed = self._holder() == owner
        if renewed:
            self._lease(owner, seconds)
        trip.landed()
        return renewed

    def _lease(self, owner: uuid.UUID, seconds: int) -> None:
        self.tables.leases[self.namespace] = _Lease(owner, self._now() + timedelta(seconds=seconds))

    @round_trip("schedule.release_lease", "lwt")
    async def release_lease(self, owner: uuid.UUID) -> None:
        if self._holder() == owner:
            del self.tables.leases[self.namespace]

    @round_trip("schedule.done_through", "read")
    async def done_through(self) -> datetime | None:
        return self.tables.cursors.get(self.namespace)

    async def due(self, now: datetime) -> tuple[list[Due], datetime | None]:
        cursor = await self.done_through()
        current = bucket_of(now)
        minute = cursor + BUCKET if cursor else current - (MAX_MINUTES - 1) * BUCKET
        minutes: list[datetime] = []
        while minute <= current and len(minutes) < MAX_MINUTES:
            minutes.append(minute)
            minute += BUCKET
        trip = await self.wire.trip("schedule.due", "read")
        trip.landed()
        found: list[Due] = []
        for at in minutes:
            rows = self.tables.rows.get((self.namespace, at), {})
            for batch_id in sorted(rows, key=timeuuid_order):
                send_at, expires = rows[batch_id]
                if self._now() < expires:
                    found.append(Due(at, batch_id, send_at))
        return found, minutes[-1] if minutes else None

    @round_trip("schedule.finish", "lwt")
    async def finish(self, owner: uuid.UUID, through: datetime) -> bool:
        if self._holder() != owner:
            return False
        self.tables.cursors[self.namespace] = ms(through)
        return True
