"""The schedule store's contract, asserted identically of the in-memory twin
(``tests/fakes/delivery.py``) and of the real store on Cassandra: a batch is due once
its minute has come (and again until a lease holder moves the cursor past it), the current
minute is never finished, only the lease holder moves the cursor, and one scheduler holds a
namespace's lease at a time until it releases it or lets it lapse."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared.core.lanes import BUCKET, bucket_of
from shared.delivery.schedule_store import OPEN_MINUTES, ScheduleStore, finished_through
from shared.infra.db import Database
from tests.contracts.conftest import IMPLEMENTATIONS
from tests.fakes.cassandra import ms
from tests.fakes.delivery import FakeSchedule, ScheduleTables


@dataclass
class Side:
    """The store under contract (its own namespace), and what a test does to time."""

    store: Any
    db: Database | None
    tables: ScheduleTables | None

    async def apply(self, writes: list[Any]) -> None:
        """Apply statements as the caller's own batch would."""
        if self.db is None:
            for write in writes:
                write()
            return
        await self.db.batch(writes)

    async def wait(self, seconds: float) -> None:
        """Let server time pass (instantly for the twin)."""
        if self.tables is not None:
            self.tables.clock.advance(seconds)
        else:
            await asyncio.sleep(seconds)


@pytest.fixture(params=IMPLEMENTATIONS)
def side(request: pytest.FixtureRequest) -> Side:
    namespace = f"t-{uuid.uuid4().hex[:8]}"
    if request.param == "fake":
        tables = ScheduleTables()
        return Side(FakeSchedule(namespace, tables), None, tables)
    db: Database = request.getfixturevalue("db")
    return Side(ScheduleStore(db, namespace), db, None)


async def test_a_batch_is_due_once_its_minute_has_come(side: Side) -> None:
    """Due: a batch of a past minute; not yet: one five minutes on."""
    now = datetime.now(UTC)
    soon, later = uuid.uuid1(), uuid.uuid1()
    await side.store.add(soon, now - timedelta(minutes=2))
    await side.store.add(later, now + timedelta(minutes=5))

    found, last = await side.store.due(now)

    assert [d.batch_id for d in found] == [soon]
    assert last == bucket_of(now)


async def test_due_batches_come_oldest_minute_first_with_their_second(side: Side) -> None:
    """Each due batch carries its minute and its ``send_at`` (to the millisecond)."""
    now = datetime.now(UTC)
    at = [now - timedelta(minutes=m, microseconds=123) for m in (1, 4, 2)]
    batches = [uuid.uuid1() for _ in at]
    for batch, when in zip(batches, at, strict=True):
        await side.store.add(batch, when)

    found, _ = await side.store.due(now)

    assert [(d.minute, d.batch_id, d.send_at) for d in found] == [
        (bucket_of(at[1]), batches[1], ms(at[1])),
        (bucket_of(at[2]), batches[2], ms(at[2])),
        (bucket_of(at[0]), batches[0], ms(at[0])),
    ]


async def test_a_batch_scheduled_with_its_batchs_write_is_due(side: Side) -> None:
    """``statement`` is the same row as ``add``, written with the caller's batch."""
    now = datetime.now(UTC)
    batch = uuid.uuid1()

    await side.apply([await side.store.statement(batch, now - timedelta(seconds=70))])
    found, _ = await side.store.due(now)

    assert [d.batch_id for d in found] == [batch]


async def test_a_new_namespace_has_no_cursor(side: Side) -> None:
    assert await side.store.done_through() is None


async def test_a_scheduler_that_died_before_its_cursor_moved_hands_the_batch_on_again(
    side: Side,
) -> None:
    """The next holder reads the same batch; once it finished the minute, nobody does."""
    store, now = side.store, datetime.now(UTC)
    batch = uuid.uuid1()
    await store.add(batch, now - timedelta(minutes=3))
    first, second = uuid.uuid4(), uuid.uuid4()
    assert await store.take_lease(first, 30)

    found, _ = await store.due(now)  # ... and the first dies here
    await store.release_lease(first)  # (its lease lapses)
    assert await store.take_lease(second, 30)
    again, last = await store.due(now)
    assert await store.finish(second, finished_through(last, now))
    after, _ = await store.due(now)

    assert [d.batch_id for d in found] == [d.batch_id for d in again] == [batch]
    assert after == []


async def test_the_current_minute_stays_due_after_a_finish(side: Side) -> None:
    """A batch added to the current minute after a pass finished what it could is still
    read (the cursor stops short of the current minute)."""
    store, owner, now = side.store, uuid.uuid4(), datetime.now(UTC)
    early = uuid.uuid1()
    await store.add(early, now - timedelta(minutes=5))
    assert await store.take_lease(owner, 30)
    _, last = await store.due(now)
    through = finished_through(last, now)
    assert await store.finish(owner, through)

    late = uuid.uuid1()
    await store.add(late, now)
    found, last_again = await store.due(now)

    assert through == bucket_of(now) - OPEN_MINUTES * BUCKET
    assert await store.done_through() == through
    assert [d.batch_id for d in found] == [late]
    assert last_again == bucket_of(now)


async def test_only_the_lease_holder_moves_the_cursor(side: Side) -> None:
    store, holder, other = side.store, uuid.uuid4(), uuid.uuid4()
    through = bucket_of(datetime.now(UTC)) - BUCKET
    assert await store.take_lease(holder, 30)

    refused = await store.finish(other, through)
    unmoved = await store.done_through()
    moved = await store.finish(holder, through)

    assert not refused
    assert unmoved is None
    assert moved
    assert await store.done_through() == through


async def test_one_scheduler_holds_the_lease_until_it_releases_it(side: Side) -> None:
    """The holder renews its lease; another is refused until the holder lets go."""
    store, first, second = side.store, uuid.uuid4(), uuid.uuid4()

    taken = await store.take_lease(first, 30)
    refused = await store.take_lease(second, 30)
    renewed = await store.take_lease(first, 30)
    await store.release_lease(second)  # not its lease: nothing happens
    still_refused = await store.take_lease(second, 30)
    await store.release_lease(first)
    handed = await store.take_lease(second, 30)

    assert (taken, refused, renewed, still_refused, handed) == (True, False, True, False, True)
    assert not await store.finish(first, bucket_of(datetime.now(UTC)) - BUCKET)


async def test_concurrent_schedulers_one_takes_the_lease(side: Side) -> None:
    owners = [uuid.uuid4() for _ in range(4)]

    taken = await asyncio.gather(*(side.store.take_lease(o, 30) for o in owners))

    assert sorted(taken) == [False, False, False, True]


async def test_a_lapsed_lease_can_be_taken(side: Side) -> None:
    """A holder that stops renewing loses the lease to the next, and its cursor moves fail."""
    store, dead, next_one = side.store, uuid.uuid4(), uuid.uuid4()
    assert await store.take_lease(dead, 1)

    await side.wait(2.1)
    taken = await store.take_lease(next_one, 30)

    assert taken
    assert not await store.finish(dead, bucket_of(datetime.now(UTC)) - BUCKET)


async def test_a_holder_renewing_first_keeps_its_lease_and_takes_a_free_one(side: Side) -> None:
    """``renewing`` asks for the renewal first: the holder keeps its lease, a caller whose
    lease another took is refused, and one whose lease was let go takes it again."""
    store, first, second = side.store, uuid.uuid4(), uuid.uuid4()
    assert await store.take_lease(first, 30)

    renewed = await store.take_lease(first, 30, renewing=True)
    refused = await store.take_lease(second, 30, renewing=True)
    await store.release_lease(first)
    retaken = await store.take_lease(second, 30, renewing=True)
    lost = await store.take_lease(first, 30, renewing=True)

    assert (renewed, refused, retaken, lost) == (True, False, True, False)
