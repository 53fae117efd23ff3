"""The scheduler's pass (``services.consumers.scheduler``) over the in-memory twins: a batch
whose time came is handed on once, one whose second has not come waits, a cancelled one is
never handed on (and is settled), one its request has not decided yet keeps its minute open,
a Cassandra clock behind the API's strands nothing, and a scheduler without the namespace's
lease does nothing until the holder's lapses; an idle one waits for its own next due time
(a send_at it read, the next minute, its lease's renewal) or the API's wake-up."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from services.consumers.scheduler import (
    ASK_EVERY,
    LEASE_SECONDS,
    PASS_EVERY,
    Scheduler,
    next_wait,
)
from services.consumers.splitter import Splitter
from shared.core.lanes import BUCKET, bucket_of
from shared.core.models import BatchJob
from shared.delivery.handoff import Routing
from shared.delivery.schedule_store import OPEN_MINUTES, finished_through
from shared.infra.leases import SCHEDULER_WAKE, Alarm, Lease, keep_running, wake
from shared.infra.topology import batch_key, dispatch_key
from tests.fakes.broker import FakeBroker
from tests.fakes.cassandra import FakeCassandra
from tests.fakes.clocks import Ticks
from tests.fakes.delivery import FakeBatches, FakeSchedule, ScheduleTables
from tests.fakes.world import new_batch


@dataclass
class Setting:
    """One namespace's schedule, batches and broker, and the scheduler's clock."""

    now: datetime = field(default_factory=lambda: bucket_of(datetime.now(UTC)))
    tables: ScheduleTables = field(default_factory=ScheduleTables)
    batches: FakeBatches = field(default_factory=lambda: FakeBatches(FakeCassandra()))
    broker: FakeBroker = field(default_factory=FakeBroker)

    def __post_init__(self) -> None:
        self.store = FakeSchedule("ns", self.tables)

    settled: list[tuple[uuid.UUID, uuid.UUID, int]] = field(default_factory=list)

    def scheduler(self) -> Scheduler:
        return Scheduler(
            self.store,
            self.batches,
            self.broker,  # type: ignore[arg-type]
            self.settle,
            clock=lambda: self.now,
        )

    async def settle(self, user_id: uuid.UUID, batch_id: uuid.UUID, mailed: int) -> None:
        self.settled.append((user_id, batch_id, mailed))

    async def scheduled(self, at: datetime, *, pending: bool = False) -> uuid.UUID:
        """A batch stored ``scheduled`` for ``at`` (``pending`` until committed, with
        ``pending``), with its row in the schedule."""
        batch = replace(new_batch("a@example.org"), send_at=at, pending=pending)
        await self.batches.write(batch)
        await self.store.add(batch.batch_id, at)
        return batch.batch_id

    def handed(self) -> list[str]:
        return [m.routing_key for m in self.broker.take()]


async def test_a_batch_whose_time_came_is_handed_on_once() -> None:
    s = Setting()
    scheduler = s.scheduler()
    batch = await s.scheduled(s.now - timedelta(seconds=30))

    first = await scheduler.pass_once()
    second = await scheduler.pass_once()

    assert (first, second) == (1, 0)
    assert s.handed() == [batch_key(batch)]
    assert await s.batches.status(batch) == "accepted"
    assert await s.store.done_through() == s.now - OPEN_MINUTES * BUCKET


async def test_a_batch_whose_second_has_not_come_waits_for_it() -> None:
    s = Setting()
    scheduler = s.scheduler()
    batch = await s.scheduled(s.now + timedelta(seconds=40))
    s.now += timedelta(seconds=10)

    early = await scheduler.pass_once()
    waited = s.handed()
    s.now += timedelta(seconds=31)
    on_time = await scheduler.pass_once()

    assert (early, waited) == (0, [])
    assert on_time == 1
    assert s.handed() == [batch_key(batch)]


async def test_the_next_holder_hands_on_again_what_a_dead_one_left_unfinished() -> None:
    """The current minute is never finished, so the successor reads the batch again and
    publishes it again, under the same message id (the splitter makes that harmless)."""
    s = Setting()
    batch = await s.scheduled(s.now + timedelta(seconds=5))
    s.now += timedelta(seconds=10)
    assert await s.scheduler().pass_once() == 1  # ... and this scheduler dies
    first = s.broker.take()
    s.tables.clock.advance(LEASE_SECONDS + 1)

    again = await s.scheduler().pass_once()
    second = s.broker.take()

    assert again == 1
    assert [(m.routing_key, m.message_id) for m in first + second] == 2 * [
        (batch_key(batch), str(batch))
    ]


async def test_a_cancelled_batch_is_not_handed_on_and_is_settled() -> None:
    """Settled too, in case the cancel failed after its transaction and was never retried."""
    s = Setting()
    batch = await s.scheduled(s.now - timedelta(seconds=30))
    header = await s.batches.header(batch)
    assert header is not None
    assert await s.batches.cancel_scheduled(batch) == "cancelled"

    handed = await s.scheduler().pass_once()

    assert handed == 0
    assert s.handed() == []
    assert s.settled == [(header.user_id, batch, 1)]
    assert await s.store.done_through() == s.now - OPEN_MINUTES * BUCKET


async def test_a_batch_its_request_has_not_decided_keeps_its_minute_open() -> None:
    """Pending (a request without a key, still committing): not handed on, and the cursor
    stays before its minute, so it goes once committed, however late."""
    s = Setting()
    batch = await s.scheduled(s.now - timedelta(minutes=10), pending=True)
    scheduler = s.scheduler()

    held = await scheduler.pass_once()
    cursor = await s.store.done_through()
    assert await s.batches.commit(batch, "scheduled") == "scheduled"
    handed = await scheduler.pass_once()

    assert (held, handed) == (0, 1)
    assert cursor == bucket_of(s.now - timedelta(minutes=10)) - BUCKET
    assert s.handed() == [batch_key(batch)]
    assert await s.store.done_through() == s.now - OPEN_MINUTES * BUCKET


async def test_a_cassandra_clock_behind_the_apis_strands_no_scheduled_batch() -> None:
    """The API stamped the batch an hour ahead of the clock Cassandra stamps transactions
    with: the scheduled-to-accepted transition still shows, and the splitter fans it out."""
    s = Setting()
    s.batches.db.server_offset = -timedelta(hours=1)
    batch = await s.scheduled(s.now - timedelta(seconds=30))

    handed = await s.scheduler().pass_once()
    [job] = s.broker.take()
    splitter = Splitter(s.broker, s.batches, lambda: Routing(("sg",), 1))  # type: ignore[arg-type]
    await splitter.split(BatchJob.decode(job.body))

    assert handed == 1
    assert await s.batches.status(batch) == "dispatched"
    assert [m.routing_key for m in s.broker.take()] == [dispatch_key("sg", batch, 0)]


async def test_a_cassandra_clock_behind_the_apis_still_cancels() -> None:
    """The cancel's transaction shows however far behind Cassandra's clock is, so the
    scheduler never sends a batch its user was told is cancelled."""
    s = Setting()
    s.batches.db.server_offset = -timedelta(hours=1)
    batch = await s.scheduled(s.now - timedelta(seconds=30))

    assert await s.batches.cancel_scheduled(batch) == "cancelled"
    handed = await s.scheduler().pass_once()

    assert handed == 0 and s.handed() == []
    assert await s.batches.status(batch) == "cancelled"


async def test_a_scheduler_without_the_lease_does_nothing() -> None:
    s = Setting()
    holder = uuid.uuid4()
    assert await s.store.take_lease(holder, LEASE_SECONDS)
    batch = await s.scheduled(s.now - timedelta(seconds=30))

    handed = await s.scheduler().pass_once()

    assert handed == 0
    assert s.handed() == []
    assert await s.batches.status(batch) == "scheduled"
    assert await s.store.done_through() is None


async def test_a_lapsed_lease_passes_to_a_waiting_scheduler() -> None:
    s = Setting()
    assert await s.store.take_lease(uuid.uuid4(), LEASE_SECONDS)  # then its holder dies
    batch = await s.scheduled(s.now - timedelta(seconds=30))
    waiting = s.scheduler()
    assert await waiting.pass_once() == 0

    s.tables.clock.advance(LEASE_SECONDS + 1)
    handed = await waiting.pass_once()

    assert handed == 1
    assert s.handed() == [batch_key(batch)]


def test_the_last_minutes_are_never_finished() -> None:
    """A row may still land in the current minute or one just past (a write that arrives
    late, an API clock behind the scheduler's)."""
    now = datetime(2026, 11, 26, 10, 0, 30, tzinfo=UTC)

    assert finished_through(bucket_of(now), now) == bucket_of(now) - OPEN_MINUTES * BUCKET
    assert finished_through(bucket_of(now) - 3 * BUCKET, now) == bucket_of(now) - 3 * BUCKET
    assert finished_through(None, now) is None


# -- waking: an idle scheduler waits for its own next due time or a nudge ----------------------


async def test_an_idle_scheduler_waits_for_the_lease_renewal_not_a_short_poll() -> None:
    """With nothing scheduled, the holder's next pass is its lease's renewal (or the next
    minute's start, if sooner), not a pass a second."""
    s = Setting(now=bucket_of(datetime.now(UTC)) + timedelta(seconds=10))
    scheduler = s.scheduler()

    await scheduler.pass_once()

    assert scheduler.busy is False
    assert scheduler.next_in() > PASS_EVERY
    assert next_wait(s.now, None, LEASE_SECONDS / 3, busy=False) == LEASE_SECONDS / 3


async def test_an_idle_scheduler_wakes_at_the_send_at_it_read() -> None:
    """A batch read whose second has not come sets the next pass at that second."""
    s = Setting(now=bucket_of(datetime.now(UTC)) + timedelta(seconds=10))
    scheduler = s.scheduler()
    await s.scheduled(s.now + timedelta(seconds=2))

    await scheduler.pass_once()

    assert scheduler.next_due == s.now + timedelta(seconds=2)
    assert next_wait(s.now, scheduler.next_due, LEASE_SECONDS / 3, busy=False) == 2.0


def test_an_idle_scheduler_wakes_when_a_new_minute_becomes_readable() -> None:
    """Batches of the next minute are read at its start, not at the renewal after it."""
    now = bucket_of(datetime.now(UTC)) + timedelta(seconds=58)

    assert next_wait(now, None, LEASE_SECONDS / 3, busy=False) == 2.0


async def test_a_scheduler_with_work_passes_again_soon() -> None:
    """A pass that handed a batch on (or found one undecided) is followed within PASS_EVERY."""
    s = Setting()
    scheduler = s.scheduler()
    await s.scheduled(s.now - timedelta(seconds=1))

    await scheduler.pass_once()

    assert scheduler.busy is True
    assert scheduler.next_in() == PASS_EVERY


async def test_a_wake_up_for_the_scheduler_ends_its_wait() -> None:
    """The API's wake-up, heard over the fanout, rings the alarm; a settings change does not."""
    s = Setting()
    scheduler = s.scheduler()
    await s.broker.listen(scheduler.loop.heard)

    await s.broker.announce(b'{"changed": ["providers.chain"]}')
    not_woken = await scheduler.loop.alarm.wait(0)
    await wake(s.broker, SCHEDULER_WAKE)
    woken_up = await scheduler.loop.alarm.wait(3600)

    assert (not_woken, woken_up) == (False, True)


async def test_the_loop_does_nothing_while_idle_and_passes_when_nudged() -> None:
    """keep_running waits as long as its pass asks; a nudge brings the next pass at once."""
    s = Setting()
    passes: list[int] = []
    alarm = Alarm()

    async def step() -> None:
        passes.append(len(passes))

    lease = Lease(s.store, LEASE_SECONDS)
    loop = asyncio.create_task(
        keep_running(step, PASS_EVERY, lease, "test", alarm=alarm, next_in=lambda: 3600.0)
    )
    for _ in range(20):
        await asyncio.sleep(0)
    idle = len(passes)
    alarm.nudge()
    for _ in range(20):
        await asyncio.sleep(0)
    loop.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await loop

    assert (idle, len(passes)) == (1, 2)


# -- without the lease: ask again when the holder's lease could have lapsed --------------------


class _OwnWire(FakeSchedule):
    """A scheduler process's own view of the shared tables, with its own op log."""

    def __init__(self, tables: ScheduleTables) -> None:
        super().__init__("ns", tables)
        self.ops: list[str] = []

    @property
    def wire(self) -> _OwnWire:
        return self

    async def trip(self, op: str, kind: str) -> _OwnWire:
        self.ops.append(op)
        await asyncio.sleep(0)
        return self

    def landed(self) -> None:
        return None


def test_without_the_lease_the_wait_is_the_holders_renewal_period() -> None:
    """A scheduler refused the lease asks again after ASK_EVERY (a third of the lease), busy
    or not (pure)."""
    now = bucket_of(datetime.now(UTC)) + timedelta(seconds=10)

    assert next_wait(now, None, 0.0, busy=True, held=False) == ASK_EVERY == LEASE_SECONDS / 3
    assert next_wait(now, None, 0.0, busy=True) == PASS_EVERY


async def test_an_idle_hour_costs_a_non_holder_one_lease_request_per_renewal_period() -> None:
    """Two idle schedulers over a simulated hour: the one without the lease asks for it 720
    times (every PASS_EVERY it was 3,600) and reads nothing, the holder renews it with one
    lightweight transaction each time; when the holder dies, it takes
    the lease over within LEASE_SECONDS + ASK_EVERY of the holder's last renewal."""
    s, ticks = Setting(now=bucket_of(datetime.now(UTC))), Ticks()
    stores = [_OwnWire(s.tables), _OwnWire(s.tables)]
    holder, waiter = (
        Scheduler(store, s.batches, s.broker, clock=lambda: s.now)  # type: ignore[arg-type]
        for store in stores
    )
    for scheduler in (holder, waiter):
        scheduler.lease.clock = ticks
    due = {id(holder): 0.0, id(waiter): 0.001}
    alive = [holder, waiter]
    elapsed, renewed, took_over = 0.0, 0.0, None

    async def until(end: float) -> None:
        nonlocal elapsed, renewed, took_over
        while True:
            scheduler = min(alive, key=lambda x: due[id(x)])
            if due[id(scheduler)] >= end:
                return
            step = due[id(scheduler)] - elapsed
            elapsed, ticks.now = due[id(scheduler)], ticks.now + step
            s.now += timedelta(seconds=step)
            s.tables.clock.advance(step)
            asked = len(stores[0].ops)
            await scheduler.pass_once()
            if scheduler is holder and "schedule.renew_lease" in stores[0].ops[asked:]:
                renewed = elapsed
            if scheduler is waiter and scheduler.held and took_over is None:
                took_over = elapsed
            due[id(scheduler)] = elapsed + scheduler.next_in()

    await until(3600.0)
    idle_ops = list(stores[1].ops)
    lwts = [op for op in stores[0].ops if op.endswith("_lease")]
    alive.remove(holder)  # it dies
    await until(3600.0 + 2 * LEASE_SECONDS + ASK_EVERY)

    assert (idle_ops.count("schedule.take_lease"), len(idle_ops)) == (720, 720)
    assert len(lwts) == 720  # the holder: one renewal every ASK_EVERY (it asked two: 1,439)
    assert took_over is not None and took_over - renewed <= LEASE_SECONDS + ASK_EVERY


async def test_a_released_lease_is_taken_at_once_by_a_woken_scheduler() -> None:
    """A holder that stops releases its lease and wakes the others: a waiting scheduler's
    alarm rings, and its next pass holds the lease."""
    s = Setting()
    holder, waiter = s.scheduler(), s.scheduler()
    await s.broker.listen(waiter.loop.heard)
    loop = asyncio.create_task(holder.loop.run())
    for _ in range(20):
        await asyncio.sleep(0)
    refused = await waiter.pass_once() == 0 and not waiter.held

    loop.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await loop
    woken_up = await waiter.loop.alarm.wait(0)
    await waiter.pass_once()

    assert (refused, woken_up, waiter.held) == (True, True, True)
