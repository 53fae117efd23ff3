"""The users' webhook stores' contract, asserted identically of the in-memory twins
(``tests/fakes/outbound.py``) and of the real stores on Cassandra: what the delivery worker and
the emitter rely on. An endpoint's events are pending in the order they were queued (across
hour buckets) until done; one worker holds an endpoint's lease until it releases it or lets
it lapse, and only the holder moves the cursor, by a conditional write that one of two
concurrent moves wins; one replay of a message waits at a time, and a repeated replay request
gets the first one's answer; the delivery log reads newest first."""

from __future__ import annotations

import asyncio
import inspect
import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cassandra.util import uuid_from_time

from shared.infra.db import Database
from shared.outbound.hook_queue import ENQUEUE_SLICE, Cursor, Delivery, HookQueue, Queued, hour_of
from shared.outbound.hook_store import PREVIOUS_SECRET_FOR, HookStore
from shared.outbound.outbound_retry import Health
from tests.contracts.conftest import IMPLEMENTATIONS
from tests.fakes.cassandra import Clock, ms
from tests.fakes.outbound import FakeHookQueue, FakeHookStore

URL = "https://hooks.example.com/in"


@dataclass
class Side:
    """The stores under contract, and what a test does to server time."""

    store: Any
    queue: Any
    clock: Clock | None

    async def wait(self, seconds: float) -> None:
        """Let server time pass (instantly for the twins)."""
        if self.clock is not None:
            self.clock.advance(seconds)
        else:
            await asyncio.sleep(seconds)

    async def queue_at(self, *events: tuple[datetime, Queued]) -> list[uuid.UUID]:
        """Queue events as if each was numbered at its time (``enqueue`` numbers them by the
        client's clock, now): the store's own slice write, given the ``seq`` of each."""
        numbered = [(uuid_from_time(at.timestamp()), row) for at, row in events]
        await self.queue._enqueue(numbered)
        return [seq for seq, _ in numbered]


@pytest.fixture(params=IMPLEMENTATIONS)
def side(request: pytest.FixtureRequest) -> Side:
    if request.param == "fake":
        clock = Clock()
        return Side(FakeHookStore(clock.now), FakeHookQueue(clock.now), clock)
    db: Database = request.getfixturevalue("db")
    return Side(HookStore(db), HookQueue(db), None)


def _event(endpoint_id: uuid.UUID, n: int, *, replay: bool = False) -> Queued:
    return Queued(endpoint_id, f"msg_{n}", "recipient.sent", b'{"n": %d}' % n, replay=replay)


def _operations(cls: type) -> dict[str, list[str]]:
    return {
        name: list(inspect.signature(member).parameters)
        for name, member in vars(cls).items()
        if callable(member) and not name.startswith("_")
    }


@pytest.mark.parametrize(("twin", "real"), [(FakeHookStore, HookStore), (FakeHookQueue, HookQueue)])
def test_a_twin_offers_every_operation_of_its_store_with_its_parameters(
    twin: type, real: type
) -> None:
    assert _operations(twin) == _operations(real)


# ---------------------------------------------------------------------- endpoints


async def test_a_created_endpoint_reads_back_as_it_was_created(side: Side) -> None:
    """Enabled, without failures, its creation time to the millisecond."""
    user, now = uuid.uuid4(), datetime.now(UTC)

    created = await side.store.create(user, URL, frozenset({"recipient.sent"}), now)
    found = await side.store.endpoint(user, created.endpoint_id)

    assert found == replace(created, created_at=ms(now))
    assert (found.enabled, found.health, found.collecting) == (True, Health(), True)
    assert await side.store.endpoints(user) == [found]


async def test_a_users_endpoints_are_listed_oldest_first_and_only_hers(side: Side) -> None:
    user, other, now = uuid.uuid4(), uuid.uuid4(), datetime.now(UTC)
    later = await side.store.create(user, URL + "/b", frozenset(), now)
    first = await side.store.create(user, URL + "/a", frozenset(), now - timedelta(minutes=1))
    await side.store.create(other, URL, frozenset(), now)

    found = await side.store.endpoints(user)

    assert [e.endpoint_id for e in found] == [first.endpoint_id, later.endpoint_id]
    assert await side.store.endpoint(other, first.endpoint_id) is None
    assert await side.store.endpoints(uuid.uuid4()) == []


async def test_an_update_changes_what_is_given_and_enabling_clears_the_failures(
    side: Side,
) -> None:
    """An endpoint disabled by its failures, enabled again: no failures, no reason."""
    user, now = uuid.uuid4(), datetime.now(UTC)
    created = await side.store.create(user, URL, frozenset({"recipient.sent"}), now)
    await side.store.set_health(created, Health(now - timedelta(days=1), 30))
    assert await side.store.disable(created, "30 deliveries in a row failed", now)
    disabled = await side.store.endpoint(user, created.endpoint_id)

    moved = await side.store.update(disabled, url=URL + "/new", events=frozenset())
    enabled = await side.store.update(moved, enabled=True)
    found = await side.store.endpoint(user, created.endpoint_id)

    assert disabled.health == Health(ms(now - timedelta(days=1)), 30)
    assert (disabled.enabled, disabled.disabled_at) == (False, ms(now))
    assert disabled.disabled_reason == "30 deliveries in a row failed"
    assert disabled.collecting
    assert (found.url, found.events, found.enabled) == (URL + "/new", frozenset(), True)
    assert (found.disabled_at, found.disabled_reason, found.health) == (None, None, Health())
    assert found == replace(enabled, created_at=ms(now))


async def test_a_rotated_secret_keeps_the_previous_one_signing_for_a_day(side: Side) -> None:
    user, now = uuid.uuid4(), datetime.now(UTC)
    created = await side.store.create(user, URL, frozenset(), now)

    rotated = await side.store.rotate(created, now)
    found = await side.store.endpoint(user, created.endpoint_id)

    assert (found.secret, found.previous_secret) == (rotated.secret, created.secret)
    assert found.previous_until == ms(now + PREVIOUS_SECRET_FOR)
    assert found.secrets_in_force(now) == [rotated.secret, created.secret]
    assert found.secrets_in_force(now + PREVIOUS_SECRET_FOR) == [rotated.secret]


async def test_one_of_two_concurrent_disables_disables_the_endpoint(side: Side) -> None:
    """Two workers find it failing at once: one of them tells the user."""
    user, now = uuid.uuid4(), datetime.now(UTC)
    created = await side.store.create(user, URL, frozenset(), now)

    told = await asyncio.gather(
        side.store.disable(created, "first", now), side.store.disable(created, "second", now)
    )
    again = await side.store.disable(created, "third", now)
    found = await side.store.endpoint(user, created.endpoint_id)

    assert sorted(told) == [False, True]
    assert not again
    assert not found.enabled
    assert found.disabled_reason == ("first" if told[0] else "second")


async def test_a_deleted_endpoint_is_gone(side: Side) -> None:
    user, now = uuid.uuid4(), datetime.now(UTC)
    created = await side.store.create(user, URL, frozenset(), now)

    await side.store.delete(created)

    assert await side.store.endpoint(user, created.endpoint_id) is None
    assert await side.store.endpoints(user) == []
    assert not await side.store.disable(created, "failing", now)


async def test_an_endpoint_deleted_during_its_delivery_stays_deleted(side: Side) -> None:
    """The worker records the health of a delivery that was under way when the user deleted
    the endpoint (and a PATCH races the DELETE): the cells those UPDATEs write back are no
    endpoint, and the user's others are still listed (regression: the row came back with no
    ``created_at``, and listing the user's endpoints failed sorting it)."""
    user, now = uuid.uuid4(), datetime.now(UTC)
    deleted = await side.store.create(user, URL + "/gone", frozenset(), now)
    kept = await side.store.create(user, URL + "/kept", frozenset(), now)
    await side.store.delete(deleted)

    await side.store.set_health(deleted, Health(now, 1))
    await side.store.update(deleted, url=URL + "/patched")

    assert [e.endpoint_id for e in await side.store.endpoints(user)] == [kept.endpoint_id]
    assert await side.store.endpoint(user, deleted.endpoint_id) is None


async def test_the_sweep_finds_every_enabled_endpoint(side: Side) -> None:
    users, now = [uuid.uuid4(), uuid.uuid4()], datetime.now(UTC)
    a = await side.store.create(users[0], URL, frozenset(), now)
    b = await side.store.create(users[0], URL, frozenset(), now)
    c = await side.store.create(users[1], URL, frozenset(), now)
    await side.store.update(b, enabled=False)

    found = [pair async for pair in side.store.every_endpoint() if pair[0] in users]

    assert sorted(found) == sorted([(users[0], a.endpoint_id), (users[1], c.endpoint_id)])


# ---------------------------------------------------------------------- queue


async def test_queued_events_are_pending_in_queue_order_across_hours(side: Side) -> None:
    endpoint, now = uuid.uuid4(), datetime.now(UTC)
    times = [now - timedelta(minutes=m) for m in (150, 90, 89, 30)]

    seqs = await side.queue_at(*((t, _event(endpoint, n)) for n, t in enumerate(times)))
    found = await side.queue.pending(endpoint, now - timedelta(hours=3))

    assert [p.seq for p in found] == seqs
    assert [p.msg_id for p in found] == ["msg_0", "msg_1", "msg_2", "msg_3"]
    assert [p.hour for p in found] == [hour_of(t) for t in times]
    assert (found[0].type, found[0].body, found[0].replay) == ("recipient.sent", b'{"n": 0}', False)


async def test_pending_starts_at_since_leaves_out_what_is_done_and_stops_at_the_limit(
    side: Side,
) -> None:
    endpoint, now = uuid.uuid4(), datetime.now(UTC)
    times = [now - timedelta(minutes=m) for m in (100, 70, 65, 61, 20, 10)]
    await side.queue_at(*((t, _event(endpoint, n)) for n, t in enumerate(times)))
    since = now - timedelta(minutes=80)
    before = await side.queue.pending(endpoint, since)

    await side.queue.done(endpoint, before[1])
    await side.queue.done(endpoint, before[1])  # a retried write: the same
    after = await side.queue.pending(endpoint, since)
    some = await side.queue.pending(endpoint, since, limit=3)

    assert [p.msg_id for p in before] == ["msg_1", "msg_2", "msg_3", "msg_4", "msg_5"]
    assert [p.msg_id for p in after] == ["msg_1", "msg_3", "msg_4", "msg_5"]
    assert [p.msg_id for p in some] == ["msg_1", "msg_3", "msg_4"]
    assert await side.queue.pending(endpoint, now) == []


async def test_enqueue_keeps_the_order_given_across_its_slices(side: Side) -> None:
    """More events than a slice: written as several batches at once, read in order."""
    endpoint = uuid.uuid4()
    events = [_event(endpoint, n) for n in range(2 * ENQUEUE_SLICE + 3)]

    await side.queue.enqueue(events)
    found = await side.queue.pending(endpoint, datetime.now(UTC) - timedelta(minutes=1))

    assert [p.msg_id for p in found] == [e.msg_id for e in events]


async def test_a_queued_message_is_kept_for_replay_and_its_replay_is_not(side: Side) -> None:
    endpoint = uuid.uuid4()
    await side.queue.enqueue([_event(endpoint, 1)])
    message = await side.queue.message(endpoint, "msg_1")

    await side.queue.enqueue([message, _event(endpoint, 2, replay=True)])
    found = await side.queue.pending(endpoint, datetime.now(UTC) - timedelta(minutes=1))

    assert message == _event(endpoint, 1, replay=True)
    assert [(p.msg_id, p.replay) for p in found] == [
        ("msg_1", False),
        ("msg_1", True),
        ("msg_2", True),
    ]
    assert await side.queue.message(endpoint, "msg_2") is None
    assert await side.queue.message(uuid.uuid4(), "msg_1") is None


# ---------------------------------------------------------------------- lease and cursor


async def test_a_new_endpoints_cursor_is_empty_and_its_lease_free(side: Side) -> None:
    endpoint = uuid.uuid4()

    assert await side.queue.cursor(endpoint) == Cursor()
    assert await side.queue.take_lease(endpoint, uuid.uuid4(), 30)


async def test_start_sets_the_low_water_mark_and_reset_forgets_the_waiting_retry(
    side: Side,
) -> None:
    endpoint, owner, now = uuid.uuid4(), uuid.uuid4(), datetime.now(UTC)
    await side.queue.start(endpoint, now)
    started = await side.queue.cursor(endpoint)
    assert await side.queue.take_lease(endpoint, owner, 30)
    retry = now + timedelta(seconds=30)
    assert await side.queue.move(endpoint, owner, Cursor(now - timedelta(seconds=5), 3, retry))
    failing = await side.queue.cursor(endpoint)

    await side.queue.reset(endpoint)

    assert started == Cursor(ms(now), 0, None)
    assert failing == Cursor(ms(now - timedelta(seconds=5)), 3, ms(retry))
    assert await side.queue.cursor(endpoint) == Cursor(ms(now - timedelta(seconds=5)), 0, None)


async def test_one_worker_holds_the_lease_until_it_releases_it(side: Side) -> None:
    """The holder renews it; another is refused until the holder lets go."""
    endpoint, first, second = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()

    taken = await side.queue.take_lease(endpoint, first, 30)
    refused = await side.queue.take_lease(endpoint, second, 30)
    renewed = await side.queue.renew_lease(endpoint, first, 30)
    not_second = await side.queue.renew_lease(endpoint, second, 30)
    await side.queue.release_lease(endpoint, second)  # not its lease: nothing happens
    still_refused = await side.queue.take_lease(endpoint, second, 30)
    await side.queue.release_lease(endpoint, first)
    handed = await side.queue.take_lease(endpoint, second, 30)
    first_again = await side.queue.renew_lease(endpoint, first, 30)

    assert (taken, refused, renewed, not_second) == (True, False, True, False)
    assert (still_refused, handed, first_again) == (False, True, False)


async def test_concurrent_workers_one_takes_the_lease(side: Side) -> None:
    endpoint, owners = uuid.uuid4(), [uuid.uuid4() for _ in range(4)]

    taken = await asyncio.gather(*(side.queue.take_lease(endpoint, o, 30) for o in owners))

    assert sorted(taken) == [False, False, False, True]


async def test_a_lapsed_lease_is_taken_by_another_and_its_holder_moves_nothing(
    side: Side,
) -> None:
    """A worker that stops renewing (it died, or stalled) loses the endpoint to the next;
    its renewals and cursor moves fail from then on, and the mark it moved stays."""
    endpoint, dead, next_one, now = uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), datetime.now(UTC)
    assert await side.queue.take_lease(endpoint, dead, 1)
    assert await side.queue.move(endpoint, dead, Cursor(now, 0, None))

    await side.wait(2.1)
    taken = await side.queue.take_lease(endpoint, next_one, 30)
    renewed = await side.queue.renew_lease(endpoint, dead, 30)
    moved = await side.queue.move(endpoint, dead, Cursor(now + timedelta(minutes=1), 0, None))

    assert (taken, renewed, moved) == (True, False, False)
    assert await side.queue.cursor(endpoint) == Cursor(ms(now), 0, None)


async def test_only_the_lease_holder_moves_the_cursor(side: Side) -> None:
    endpoint, holder, other, now = uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), datetime.now(UTC)
    await side.queue.start(endpoint, now - timedelta(hours=1))
    assert await side.queue.take_lease(endpoint, holder, 30)

    refused = await side.queue.move(endpoint, other, Cursor(now, 0, None))
    unmoved = await side.queue.cursor(endpoint)
    moved = await side.queue.move(endpoint, holder, Cursor(now, 0, None))
    await side.queue.release_lease(endpoint, holder)
    released = await side.queue.move(endpoint, holder, Cursor(now + timedelta(hours=1), 0))

    assert (refused, moved, released) == (False, True, False)
    assert unmoved == Cursor(ms(now - timedelta(hours=1)), 0, None)
    assert await side.queue.cursor(endpoint) == Cursor(ms(now), 0, None)


async def test_of_two_concurrent_cursor_moves_the_holders_wins(side: Side) -> None:
    endpoint, holder, other, now = uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), datetime.now(UTC)
    assert await side.queue.take_lease(endpoint, holder, 30)

    moved = await asyncio.gather(
        side.queue.move(endpoint, other, Cursor(now - timedelta(hours=1), 2, now)),
        side.queue.move(endpoint, holder, Cursor(now, 0, None)),
    )

    assert list(moved) == [False, True]
    assert await side.queue.cursor(endpoint) == Cursor(ms(now), 0, None)


async def test_a_lapsed_holders_move_loses_to_the_next_holders_at_once(side: Side) -> None:
    """The stalled worker wakes and moves the cursor as the next holder does: only the next
    holder's move lands."""
    endpoint, stalled, next_one, now = uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), datetime.now(UTC)
    assert await side.queue.take_lease(endpoint, stalled, 1)
    await side.wait(2.1)
    assert await side.queue.take_lease(endpoint, next_one, 30)

    moved = await asyncio.gather(
        side.queue.move(endpoint, stalled, Cursor(now - timedelta(hours=1), 4, now)),
        side.queue.move(endpoint, next_one, Cursor(now, 0, None)),
    )

    assert list(moved) == [False, True]
    assert await side.queue.cursor(endpoint) == Cursor(ms(now), 0, None)


# ---------------------------------------------------------------------- replay


async def test_one_replay_of_a_message_waits_at_a_time(side: Side) -> None:
    """A second replay while one waits joins it; once it was delivered, a new one waits."""
    endpoint = uuid.uuid4()
    await side.queue.enqueue([_event(endpoint, 1)])
    first, second, third = uuid.uuid1(), uuid.uuid1(), uuid.uuid1()

    claimed = await side.queue.claim_replay(endpoint, "msg_1", first)
    joined = await side.queue.claim_replay(endpoint, "msg_1", second)
    await side.queue.replay_done(endpoint, "msg_1")
    again = await side.queue.claim_replay(endpoint, "msg_1", third)

    assert (claimed, joined, again) == (first, first, third)
    assert await side.queue.message(endpoint, "msg_1") == _event(endpoint, 1, replay=True)


async def test_concurrent_replays_of_a_message_agree_on_one(side: Side) -> None:
    endpoint, wanted = uuid.uuid4(), [uuid.uuid1(), uuid.uuid1()]
    await side.queue.enqueue([_event(endpoint, 1)])

    got = await asyncio.gather(*(side.queue.claim_replay(endpoint, "msg_1", w) for w in wanted))

    assert got[0] == got[1]
    assert got[0] in wanted


async def test_a_repeated_replay_request_gets_the_first_ones_answer(side: Side) -> None:
    """The same Idempotency-Key: the replay the first request claimed, queued or not once
    it was answered; another key is a request of its own."""
    endpoint, first, later = uuid.uuid4(), uuid.uuid1(), uuid.uuid1()

    new = await side.queue.replay_request(endpoint, "msg_1", "key-1", first)
    in_flight = await side.queue.replay_request(endpoint, "msg_1", "key-1", later)
    await side.queue.replay_answered(endpoint, "msg_1", "key-1", first, True)
    answered = await side.queue.replay_request(endpoint, "msg_1", "key-1", later)
    other_key = await side.queue.replay_request(endpoint, "msg_1", "key-2", later)

    assert (new, in_flight, answered, other_key) == (None, (first, False), (first, True), None)


# ---------------------------------------------------------------------- delivery log


def _entry(at: datetime, n: int, status: int | None = 200) -> Delivery:
    error = None if status == 200 else ("answered 500" if status else "no answer within 10s")
    return Delivery(at, f"msg_{n}", "recipient.sent", n, status, error, 10 * n)


async def test_the_log_reads_newest_first_up_to_the_limit(side: Side) -> None:
    endpoint, now = uuid.uuid4(), datetime.now(UTC)
    entries = [_entry(now, 1), _entry(now, 2, 500), _entry(now, 3, None)]
    for entry in entries:
        await side.queue.log(endpoint, entry)

    found = await side.queue.deliveries(endpoint, now.date(), limit=2)

    assert [replace(d, at=now) for d in found] == [entries[2], entries[1]]
    assert found[0].at >= found[1].at
    assert abs(found[0].at - now) < timedelta(minutes=1)


async def test_the_log_reads_back_over_the_days_before(side: Side) -> None:
    """An attempt is logged in the day it was made; a day's log is read after the later."""
    endpoint, now = uuid.uuid4(), datetime.now(UTC)
    yesterday = now - timedelta(days=1)
    await side.queue.log(endpoint, _entry(yesterday, 1))
    await side.queue.log(endpoint, _entry(now, 2))

    today = await side.queue.deliveries(endpoint, now.date())
    before = await side.queue.deliveries(endpoint, yesterday.date())

    assert [d.msg_id for d in today] == ["msg_2", "msg_1"]
    assert [d.msg_id for d in before] == ["msg_1"]
    assert await side.queue.deliveries(uuid.uuid4(), now.date()) == []
