"""The scheduler: hands each scheduled batch on when its ``send_at`` comes.

One scheduler works per namespace at a time (the holder of ``shared.delivery.schedule_store``'s
lease); every consumer process runs one, and the others wait for the lease. A pass reads the
minutes that came due since the cursor (``ScheduleStore.due``), moves each batch whose second
has come from ``scheduled`` to ``accepted`` (a lightweight transaction: a cancellation
either wins or comes too late) and publishes ``batch.<uuid>`` with confirms; only then is
the cursor moved past the minutes finished. Dying at any await leaves the batch to the next
pass or the next holder: the transition is kept (``accepted`` is published again) and the
splitter and the senders make a repeated publish harmless. A broker or database down stops
the pass, not the loop.

A batch still ``pending`` (its request, without an Idempotency-Key, has not committed it
yet: ``shared.delivery.acceptance``) is looked at again on the next pass, and its minute is kept
open until it is decided (the outbox relay cancels it if its request never does). A batch
found cancelled is settled (``Acceptance.settle``: its stats and quota), in case the cancel
that applied failed before doing so and its client never retried.

A pass costs a few partition reads. While a pass finds work (a batch handed on, one
undecided) the next follows :data:`PASS_EVERY` seconds later; an idle holder waits instead
for its own next due time: the earliest ``send_at`` it read that has not come, the next
minute's start (when a new minute's batches become readable), or the lease's renewal
(a third of :data:`LEASE_SECONDS`), whichever is first, and the API nudges every scheduler
when it stores a scheduled batch (``shared.infra.leases.wake``), so a batch due within seconds is
read at once. Batches go out within about :data:`PASS_EVERY` of their time; one whose nudge
was lost (the holder was cut off from RabbitMQ when it was scheduled) within the renewal
period, 5 s. A scheduler without the lease asks for it again after :data:`ASK_EVERY`
(the holder's renewal period, 5 s: its lease cannot lapse sooner) or when woken, not every
pass period: a dead holder's lease is taken over within 20 s (its 15 s, then at most 5 s).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final

from shared.core.lanes import BUCKET, bucket_of
from shared.core.models import BatchJob
from shared.delivery.batchstore import Batches
from shared.delivery.schedule_store import Schedules, finished_through
from shared.infra.broker import Broker
from shared.infra.leases import SCHEDULER_WAKE, Lease, LeasedLoop
from shared.infra.topology import batch_key

log = logging.getLogger(__name__)

#: Seconds between two passes.
PASS_EVERY: Final = 1.0
#: Seconds a lease lasts without renewal (a dead scheduler's successor waits this long).
LEASE_SECONDS: Final = 15
#: Seconds a process without the lease waits before asking again (unless woken): the holder
#: renews every third of :data:`LEASE_SECONDS`, so its lease cannot lapse sooner than that
#: after a refusal; a dead holder's is taken over within LEASE_SECONDS + ASK_EVERY, 20 s.
ASK_EVERY: Final = LEASE_SECONDS / 3
#: The name its wake-ups carry (``shared.infra.leases.wake``).
WAKE: Final = SCHEDULER_WAKE


def next_wait(
    now: datetime, next_due: datetime | None, renew_in: float, *, busy: bool, held: bool = True
) -> float:
    """Seconds until the next pass (pure): :data:`ASK_EVERY` without the lease;
    :data:`PASS_EVERY` while there is work, else until
    the first of the earliest ``send_at`` read and not come, the next minute's start and the
    lease's renewal (``renew_in``)."""
    if not held:
        return ASK_EVERY
    if busy:
        return PASS_EVERY
    waits = [renew_in, (bucket_of(now) + BUCKET - now).total_seconds()]
    if next_due is not None:
        waits.append((next_due - now).total_seconds())
    return max(0.0, min(waits))


def _now() -> datetime:
    return datetime.now(UTC)


#: Settles a cancelled batch: (user id, batch id, recipients mailed).
Settle = Callable[[uuid.UUID, uuid.UUID, int], Awaitable[None]]


@dataclass
class Scheduler:
    store: Schedules
    batches: Batches
    broker: Broker
    settle: Settle | None = None
    """What a cancelled batch owes (None: left to whoever cancelled it)."""
    owner: uuid.UUID = field(default_factory=uuid.uuid4)
    clock: Callable[[], datetime] = _now
    handed: dict[datetime, set[uuid.UUID]] = field(default_factory=dict)
    """Batches of minutes not yet finished that this scheduler handed on already."""
    next_due: datetime | None = None
    """The earliest ``send_at`` the last pass read that had not come."""
    busy: bool = True
    """Whether the last pass found work: the next follows soon."""
    held: bool = True
    """Whether the last pass held the lease (without it, the next asks after ASK_EVERY)."""
    _finished: datetime | None = None

    def __post_init__(self) -> None:
        self.lease = Lease(self.store, LEASE_SECONDS, self.owner)
        # Run it with ``loop.run()``; a wake-up heard by ``loop.heard`` (a batch was
        # scheduled) rings ``loop.alarm``; once stopped, it wakes
        # the others to take the lease at once.
        self.loop = LeasedLoop(
            "scheduler",
            WAKE,
            self.lease,
            PASS_EVERY,
            self.pass_once,
            self.next_in,
            announcer=self.broker,
        )

    def next_in(self) -> float:
        """Seconds until the next pass is due (see :func:`next_wait`)."""
        return next_wait(
            self.clock(), self.next_due, self.lease.renew_in(), busy=self.busy, held=self.held
        )

    async def pass_once(self) -> int:
        """One pass; how many batches it handed on (0 without the lease)."""
        self.busy = True
        self.held = await self.lease.held()
        if not self.held:
            self.handed.clear()  # another holds it: what it hands on is its business
            self._finished = None
            return 0
        now = self.clock()
        found, last = await self.store.due(now)
        handed = 0
        undecided: datetime | None = None
        self.next_due = None
        for due in found:
            if due.send_at > now:
                # Its second has not come: a later pass (its minute stays open).
                self.next_due = min(self.next_due or due.send_at, due.send_at)
                continue
            seen = self.handed.setdefault(due.minute, set())
            if due.batch_id in seen:
                continue
            status = await self.hand_on(due.batch_id)
            if status == "pending":
                undecided = due.minute if undecided is None else min(undecided, due.minute)
                continue
            if status == "accepted":
                handed += 1
            seen.add(due.batch_id)
        through = finished_through(last, now)
        if through is not None and undecided is not None:
            through = min(through, undecided - BUCKET)
        if through is not None and through != self._finished:
            if not await self.store.finish(self.owner, through):
                self.lease.lost()
                return handed
            self._finished = through
            self.handed = {m: s for m, s in self.handed.items() if m > through}
        self.busy = handed > 0 or undecided is not None
        return handed

    async def hand_on(self, batch_id: uuid.UUID) -> str | None:
        """Start a batch whose time came; its status after: ``accepted`` once handed on,
        ``pending`` while its request may still decide it, ``cancelled`` (settled), None
        when it is gone."""
        status = await self.batches.start_scheduled(batch_id)
        if status == "cancelled":
            await self._settle(batch_id)
        if status != "accepted":
            # Cancelled, undecided, or started and split already (a pass that died after
            # publishing shows it accepted, and is published again: harmless).
            return status
        await self.broker.publish(
            batch_key(batch_id), BatchJob(batch_id=batch_id).encode(), message_id=str(batch_id)
        )
        log.info("scheduled batch %s handed on", batch_id)
        return status

    async def _settle(self, batch_id: uuid.UUID) -> None:
        header = await self.batches.header(batch_id) if self.settle else None
        if self.settle is not None and header is not None:
            await self.settle(header.user_id, batch_id, header.mailed)
