"""The acceptance side's store contract, asserted identically of the twins and of the real
stores on Cassandra: a batch's status moves only by lightweight transactions, which no plain
write stamped by a clock ahead of Cassandra's can shadow; the outbox; and the daily quota,
whose refunds count once however often they are given; recent mail for the cooldown; and the
users' preferences."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from services.api.cooldown import RecentMail
from shared.accounts.preferences import Preferences, PreferenceStore
from shared.accounts.ratelimit import QuotaLedger, RecipientQuota
from shared.core.batch_ids import accepted_at
from shared.delivery.batchstore import BatchStore, NewBatch, new_batch_id
from shared.delivery.outbox import Outbox, minute_of, shard_of
from shared.infra.db import Database
from tests.conftest import unique
from tests.contracts.conftest import IMPLEMENTATIONS, Stores
from tests.fakes.accounts import FakePreferences, FakeQuota
from tests.fakes.api import FakeRecentMail
from tests.fakes.cassandra import FakeCassandra
from tests.fakes.delivery import FakeBatches, FakeOutbox
from tests.fakes.world import new_batch

A, B = "a@example.org", "b@example.org"
#: How far ahead of Cassandra's clock the API that accepted a batch ran.
AHEAD = timedelta(hours=1)


def _ahead(*, send_at: datetime | None = None, pending: bool = False) -> NewBatch:
    """A batch accepted by an API whose clock runs :data:`AHEAD` of Cassandra's: its id,
    and so its header's write timestamp, an hour from now."""
    batch_id = new_batch_id((datetime.now(UTC) + AHEAD).timestamp())
    return replace(new_batch(A, B, batch_id=batch_id), send_at=send_at, pending=pending)


Move = Callable[[Any, uuid.UUID], Awaitable[str | None]]

MOVES: dict[str, tuple[bool, bool, Move, str]] = {
    # name: (scheduled, pending, transition, status after)
    "start": (True, False, lambda b, i: b.start_scheduled(i), "accepted"),
    "cancel-scheduled": (True, False, lambda b, i: b.cancel_scheduled(i), "cancelled"),
    "commit": (False, True, lambda b, i: b.commit(i, "accepted"), "accepted"),
    "commit-scheduled": (True, True, lambda b, i: b.commit(i, "scheduled"), "scheduled"),
    "cancel-pending": (False, True, lambda b, i: b.cancel(i), "cancelled"),
}


@pytest.mark.parametrize("move", sorted(MOVES))
async def test_a_transition_shows_however_far_ahead_the_apis_clock_ran(
    stores: Stores, move: str
) -> None:
    """Cassandra stamps a transaction with its own clock, an hour behind the batch's own
    write: the transition applies and reads back all the same."""
    scheduled, pending, transition, after = MOVES[move]
    send_at = datetime.now(UTC) + AHEAD + timedelta(minutes=1) if scheduled else None
    batch = _ahead(send_at=send_at, pending=pending)
    await stores.batches.write(batch)

    assert await transition(stores.batches, batch.batch_id) == after

    header = await stores.batches.header(batch.batch_id)
    assert header is not None and header.status == after
    assert await stores.batches.status(batch.batch_id) == after


async def test_a_plain_write_stamped_ahead_shadows_a_transaction(stores: Stores) -> None:
    """Why the status is never written plainly after the header: a status written USING
    TIMESTAMP an hour ahead (as the header and the cancel were) wins over a transaction that
    applied, which then reads back as never having happened."""
    batch = replace(new_batch(A), send_at=datetime.now(UTC) + timedelta(minutes=1))
    await stores.batches.write(batch)
    ahead = int((datetime.now(UTC) + AHEAD).timestamp() * 1_000_000)
    if isinstance(stores.db, FakeCassandra):
        stores.db.headers[batch.batch_id].put("status", "scheduled", ahead)
    else:
        await stores.db.execute(
            "UPDATE batches USING TIMESTAMP ? SET status = 'scheduled' WHERE batch_id = ?",
            (ahead, batch.batch_id),
        )

    assert await stores.batches.start_scheduled(batch.batch_id) == "accepted"

    assert await stores.batches.status(batch.batch_id) == "scheduled"


async def test_a_commit_repeated_tells_what_was_decided(stores: Stores) -> None:
    """A commit whose outcome was unknown is repeated: the repeat reads the decision (and a
    cancel after it comes too late)."""
    batch = replace(new_batch(A), pending=True)
    await stores.batches.write(batch)
    assert await stores.batches.status(batch.batch_id) == "pending"

    first = await stores.batches.commit(batch.batch_id, "accepted")
    again = await stores.batches.commit(batch.batch_id, "accepted")
    late = await stores.batches.cancel(batch.batch_id)

    assert (first, again, late) == ("accepted", "accepted", "accepted")


async def test_a_cancel_before_the_batch_lands_keeps_it_cancelled(stores: Stores) -> None:
    """A request whose store failed cancels a batch that is not there (yet): its write,
    landing later, stays cancelled and cannot be committed."""
    batch = replace(new_batch(A), pending=True)

    assert await stores.batches.cancel(batch.batch_id) == "cancelled"
    assert await stores.batches.header(batch.batch_id) is None
    await stores.batches.write(batch)

    assert await stores.batches.status(batch.batch_id) == "cancelled"
    assert await stores.batches.commit(batch.batch_id, "accepted") == "cancelled"


async def test_no_transition_applies_to_an_unknown_batch(stores: Stores) -> None:
    unknown = uuid.uuid1()
    assert await stores.batches.start_scheduled(unknown) is None
    assert await stores.batches.cancel_scheduled(unknown) is None
    assert await stores.batches.commit(unknown, "accepted") is None
    assert await stores.batches.header(unknown) is None


async def test_a_transaction_leaves_the_dispatched_mark_alone(stores: Stores) -> None:
    """A scheduled batch started and split: a late cancel does not apply, and it still
    reads dispatched."""
    batch = replace(new_batch(A), send_at=datetime.now(UTC))
    await stores.batches.write(batch)
    assert await stores.batches.start_scheduled(batch.batch_id) == "accepted"
    await stores.batches.mark_dispatched(batch.batch_id)

    assert await stores.batches.cancel_scheduled(batch.batch_id) == "accepted"
    assert await stores.batches.status(batch.batch_id) == "dispatched"


# -- the outbox and the quota --------------------------------------------------------------


@dataclass
class Side:
    outbox: Any
    quota: Any
    batches: Any
    recent: Any
    preferences: Any


@pytest.fixture(params=IMPLEMENTATIONS)
def side(request: pytest.FixtureRequest) -> Side:
    if request.param == "fake":
        fake = FakeCassandra()
        return Side(
            FakeOutbox(fake, unique("ns")),
            FakeQuota(fake, daily_limit=5),
            FakeBatches(fake),
            FakeRecentMail(fake),
            FakePreferences(fake),
        )
    db: Database = request.getfixturevalue("db")
    return Side(
        Outbox(db, unique("ns")),
        RecipientQuota(db, 5),
        BatchStore(db),
        RecentMail(db),
        PreferenceStore(db),
    )


async def test_an_outbox_row_is_unpublished_until_marked_done(side: Side) -> None:
    first, second = uuid.uuid1(), uuid.uuid1()
    for batch_id in (first, second):
        await side.outbox.add(batch_id, uuid.uuid4())

    async def unpublished() -> set[uuid.UUID]:
        buckets = {Outbox.bucket(b) for b in (first, second)}
        return {b for m, shard in buckets for b in await side.outbox.unpublished(m, shard)}

    assert await unpublished() == {first, second}
    await side.outbox.done(first)
    assert await unpublished() == {second}


async def test_marks_written_together_mark_every_row_named_and_no_other(side: Side) -> None:
    """Rows of several outbox partitions marked in one call are all marked published; a row
    not named stays unpublished."""
    batches = [uuid.uuid1() for _ in range(12)]
    for batch_id in batches:
        await side.outbox.add(batch_id, uuid.uuid4())
    buckets = {Outbox.bucket(b) for b in batches}
    assert len(buckets) > 1

    await side.outbox.done_many(batches[1:])

    left = {b for m, shard in buckets for b in await side.outbox.unpublished(m, shard)}
    assert left == {batches[0]}


def _today_batch() -> uuid.UUID:
    return new_batch_id(datetime.now(UTC).timestamp())


async def test_a_refund_given_again_counts_once(side: Side) -> None:
    user, batch_id = uuid.uuid4(), _today_batch()
    verdict, day = await side.quota.consume(user, 3, now=accepted_at(batch_id))
    assert verdict.allowed

    for _ in range(3):
        await side.quota.refund(user, batch_id, 3)

    assert await side.quota.used(user, day) == 0


async def test_refunds_make_room_the_counter_alone_would_refuse(side: Side) -> None:
    """The counter still holds a refunded batch's recipients; the quota does not."""
    user, first = uuid.uuid4(), _today_batch()
    assert (await side.quota.consume(user, 5, now=accepted_at(first)))[0].allowed
    refused, day = await side.quota.consume(user, 5)
    await side.quota.refund(user, first, 5)

    admitted, _ = await side.quota.consume(user, 5)
    over, _ = await side.quota.consume(user, 1)

    assert (refused.allowed, admitted.allowed, over.allowed) == (False, True, False)
    assert await side.quota.used(user, day) == 5


async def test_a_refund_goes_back_to_the_day_its_batch_was_accepted(side: Side) -> None:
    user = uuid.uuid4()
    yesterday = new_batch_id((datetime.now(UTC) - timedelta(days=1)).timestamp())
    _, day = await side.quota.consume(user, 2, now=accepted_at(yesterday))
    _, today = await side.quota.consume(user, 2)

    await side.quota.refund(user, yesterday, 2)

    assert (await side.quota.used(user, day), await side.quota.used(user, today)) == (0, 2)


async def test_a_lease_over_the_quota_keeps_only_what_fits(side: Side) -> None:
    """A lease that reads the counter past the quota gives the excess back and keeps the
    rest when it still covers its batch; otherwise it keeps nothing."""
    user, today = uuid.uuid4(), datetime.now(UTC).date()
    first = await side.quota.lease(user, today, 1, 4)
    second = await side.quota.lease(user, today, 1, 3)
    third = await side.quota.lease(user, today, 1, 1)

    assert (first.kept, second.kept, third.kept) == (4, 1, 0)
    assert await side.quota.used(user, today) == 5


async def test_a_given_back_lease_leaves_the_counter(side: Side) -> None:
    """An unspent lease given back no longer counts against the day."""
    user, today = uuid.uuid4(), datetime.now(UTC).date()
    await side.quota.lease(user, today, 1, 5)

    await side.quota.give_back(user, today, 4)

    assert await side.quota.used(user, today) == 1


async def test_processes_leasing_at_once_never_pass_the_quota(side: Side) -> None:
    """Three processes' ledgers accepting one user's batches at once accept at most the
    quota, and the counter holds exactly that once their leases are given back."""
    user, today = uuid.uuid4(), datetime.now(UTC).date()
    ledgers = [QuotaLedger(side.quota) for _ in range(3)]

    async def accepted(ledger: QuotaLedger) -> int:
        return sum([2 for _ in range(3) if (await ledger.consume(user, 2))[0].allowed])

    total = sum(await asyncio.gather(*(accepted(ledger) for ledger in ledgers)))
    for ledger in ledgers:
        await ledger.close()

    assert total <= 5
    assert await side.quota.used(user, today) == total


async def test_writing_a_batch_again_marks_its_outbox_row_unpublished_again(side: Side) -> None:
    """A retried acceptance writes the same rows: the relay looks at the batch once more."""
    batch = new_batch(A, batch_id=_today_batch())
    minute, shard = minute_of(accepted_at(batch.batch_id)), shard_of(batch.batch_id)
    row = await side.outbox.statement(batch.batch_id, batch.user_id)
    await side.batches.write(batch, also=[row])
    await side.outbox.done(batch.batch_id)
    assert await side.outbox.unpublished(minute, shard) == []

    again = await side.outbox.statement(batch.batch_id, batch.user_id)
    await side.batches.write(batch, also=[again])

    assert await side.outbox.unpublished(minute, shard) == [batch.batch_id]


async def test_recent_mail_cools_an_address_for_other_batches_until_its_cooldown_passes(
    side: Side,
) -> None:
    user, mine, other = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    at = datetime.now(UTC)
    await side.recent.record(user, ["Ann@Example.org"], ("",), 60, mine, at)

    assert await side.recent.cooling(user, ["ann@example.org"], ("",), 60, exclude=other) == {
        "ann@example.org"
    }
    assert await side.recent.cooling(user, ["ann@example.org"], ("",), 60, exclude=mine) == set()
    later = at + timedelta(seconds=61)
    assert await side.recent.cooling(user, ["ann@example.org"], ("",), 60, now=later) == set()
    assert await side.recent.cooling(user, ["ann@example.org"], ("news",), 60) == set()


async def test_preferences_read_back_as_written_and_default_when_never_set(side: Side) -> None:
    user = uuid.uuid4()
    assert await side.preferences.get(user) == Preferences()
    prefs = Preferences(track_opens=True, cooldown_seconds=600, cooldown_per_category=True)
    await side.preferences.put(user, prefs)

    assert await side.preferences.get(user, fresh=True) == prefs
