"""The daily quota charged in process against leases (``shared.accounts.ratelimit.QuotaLedger``):
no batch past the quota across processes, none for a process that dies, refunds given back,
and the round trips a batch costs."""

from __future__ import annotations

import asyncio
import random
import uuid
from datetime import UTC, datetime

import pytest

from shared.accounts.ratelimit import QuotaLedger, kept_of, lease_size
from shared.core.errors import DependencyUnavailable
from tests.fakes.accounts import FakeQuota
from tests.fakes.cassandra import FakeCassandra

QUOTA_OPS = ("quota.add", "quota.read", "quota.refunded")


def _quota_trips(db: FakeCassandra) -> int:
    return sum(db.calls.count(op) for op in QUOTA_OPS)


def test_a_lease_near_the_limit_is_the_batch_alone() -> None:
    """Within four batches of the limit a process asks for exactly its batch."""
    assert lease_size(100, 9_700, 10_000) == 100


def test_a_lease_far_from_the_limit_holds_at_most_its_most_beyond_the_batch() -> None:
    """Far from the limit a lease is the batch plus at most ``most``."""
    assert lease_size(100, 0, 100_000, most=1000) == 1100


def test_a_lease_over_the_limit_keeps_only_what_fits() -> None:
    """A lease that read back 30 over keeps 30 fewer, when that still covers the batch."""
    assert kept_of(500, 100, 10_030, 10_000) == 470


def test_a_lease_that_cannot_cover_its_batch_keeps_nothing() -> None:
    """A lease whose excess eats into its batch is given back whole."""
    assert kept_of(500, 100, 10_450, 10_000) == 0


async def test_processes_charging_at_once_never_accept_past_the_quota() -> None:
    """Five processes accepting a user's batches at once accept at most the quota, and
    exactly what the day's counter holds once they give their leases back."""
    db, rng = FakeCassandra(), random.Random(34)
    store, user = FakeQuota(db, daily_limit=5_000), uuid.uuid4()
    ledgers = [QuotaLedger(store, most=700) for _ in range(5)]
    accepted = 0

    async def client(ledger: QuotaLedger) -> None:
        nonlocal accepted
        for _ in range(40):
            size = rng.randint(1, 300)
            verdict, _ = await ledger.consume(user, size)
            accepted += size if verdict.allowed else 0

    await asyncio.gather(*(client(ledger) for ledger in ledgers for _ in range(3)))
    for ledger in ledgers:
        await ledger.close()

    assert accepted <= 5_000
    assert await store.used(user, datetime.now(UTC).date()) == accepted


async def test_a_process_that_keeps_dying_gets_no_more_than_the_quota() -> None:
    """A crash loop (each process takes a lease, accepts one batch, dies unreconciled)
    accepts at most the quota: unspent leases stay counted."""
    db, user = FakeCassandra(), uuid.uuid4()
    store = FakeQuota(db, daily_limit=1_000)
    accepted = 0
    for _ in range(50):
        verdict, _ = await QuotaLedger(store).consume(user, 100)
        accepted += 100 if verdict.allowed else 0

    assert accepted <= 1_000
    assert await store.used(user, datetime.now(UTC).date()) >= accepted


async def test_a_batch_its_lease_covers_costs_no_round_trip() -> None:
    """Ten batches of 100 under a quota of 100,000 cost one lease (two round trips), where
    charging each batch costs two."""
    db, user = FakeCassandra(), uuid.uuid4()
    store = FakeQuota(db, daily_limit=100_000)
    ledger = QuotaLedger(store)
    for _ in range(10):
        assert (await ledger.consume(user, 100))[0].allowed
    leased = _quota_trips(db)
    for _ in range(10):
        assert (await store.consume(user, 100))[0].allowed

    assert (leased, _quota_trips(db) - leased) == (2, 20)


async def test_a_refund_makes_room_for_another_process() -> None:
    """Recipients a process refunds can be accepted by another process the same day."""
    db, user = FakeCassandra(), uuid.uuid4()
    store = FakeQuota(db, daily_limit=300)
    first, second = QuotaLedger(store), QuotaLedger(store)
    now = datetime.now(UTC)
    batch_id = uuid.uuid1()
    assert (await first.consume(user, 300, now=now))[0].allowed
    refused, _ = await second.consume(user, 100)

    await first.refund(user, batch_id, 300)

    assert (refused.allowed, (await second.consume(user, 300))[0].allowed) == (False, True)


async def test_an_idle_lease_goes_back_for_other_processes() -> None:
    """A lease unspent for its idle time is given back, and another process may spend it."""
    clock = [0.0]
    db, user = FakeCassandra(), uuid.uuid4()
    store = FakeQuota(db, daily_limit=1_000)
    holder, other = QuotaLedger(store, clock=lambda: clock[0]), QuotaLedger(store)
    assert (await holder.consume(user, 100))[0].allowed
    before, _ = await other.consume(user, 900)

    clock[0] += 10
    returned = await holder.reconcile()

    assert (before.allowed, returned > 0, (await other.consume(user, 900))[0].allowed) == (
        False,
        True,
        True,
    )


@pytest.mark.parametrize("applied", [False, True])
async def test_a_lease_whose_write_times_out_accepts_nothing(applied: bool) -> None:
    """A lease's counter update that times out answers 503, accepts nothing, and leaves the
    lease counted if it landed (the day refuses early, never sends more)."""
    db, user = FakeCassandra(), uuid.uuid4()
    store = FakeQuota(db, daily_limit=1_000)
    db.fail("quota.add", DependencyUnavailable("cassandra", "timeout"), applied=applied)

    with pytest.raises(DependencyUnavailable):
        await QuotaLedger(store).consume(user, 100)

    assert (await store.used(user, datetime.now(UTC).date()) >= 100) is applied


async def test_a_give_back_that_fails_stays_counted() -> None:
    """A lease whose give-back fails on shutdown is lost to the day (refusing early), not
    granted twice."""
    db, user = FakeCassandra(), uuid.uuid4()
    store = FakeQuota(db, daily_limit=10_000)
    ledger = QuotaLedger(store)
    assert (await ledger.consume(user, 100))[0].allowed
    db.fail("quota.add", DependencyUnavailable("cassandra", "timeout"))

    await ledger.close()

    assert await store.used(user, datetime.now(UTC).date()) > 100
