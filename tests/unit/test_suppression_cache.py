"""Each API process's cache of its users' suppression lists (shared.audience.suppression_cache) over
the suppression and broker twins: what a hit costs, what a change drops in this process and in
the others, the TTL bound without the broadcast, large lists, and what is held."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.api.managing import Managing
from shared.audience.suppression_cache import (
    TTL,
    Changes,
    SuppressionCache,
    announcement,
    changed_in,
)
from shared.core.errors import DependencyUnavailable
from shared.infra.http import ApiError
from shared.infra.leases import woken
from tests.fakes.audience import FakeSuppressionStore
from tests.fakes.broker import FakeBroker
from tests.fakes.cassandra import FakeCassandra
from tests.fakes.world import World
from tests.unit.sending_desk import A, B, Desk, body_of, new_desk
from tests.unit.webhooks.test_ingest import event

C = "carl@example.com"


class Clock:
    """Monotonic seconds the test moves."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class BrokerDown:
    """A settings exchange that cannot be published to (RabbitMQ away)."""

    async def announce(self, body: bytes) -> None:
        raise DependencyUnavailable("rabbitmq", "not connected")


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store() -> FakeSuppressionStore:
    return FakeSuppressionStore(FakeCassandra())


def reads(store: FakeSuppressionStore) -> dict[str, int]:
    """The store's suppression reads so far, by kind."""
    calls = store.db.calls
    return {op: calls.count(f"suppressions.{op}") for op in ("listed", "suppressed")}


def managing(store: FakeSuppressionStore, changes: Changes) -> Managing:
    return Managing(store.db, store, changes=changes)  # type: ignore[arg-type]


async def test_a_cached_list_answers_without_a_read(
    store: FakeSuppressionStore, clock: Clock
) -> None:
    """Within the TTL, a user's batches after the first read nothing, and are answered as the
    store answers."""
    user = uuid.uuid4()
    await store.add(user, A, reason="bounce", source="sg")
    cache = SuppressionCache(store, clock=clock)

    first = await cache.suppressed(user, [A, B])
    clock.t += TTL - 0.01
    again = await cache.suppressed(user, [A.upper(), B, C])

    assert first == again == {A: "bounce"}
    assert reads(store) == {"listed": 1, "suppressed": 0}


async def test_an_empty_list_is_kept_too(store: FakeSuppressionStore, clock: Clock) -> None:
    """A user with no suppression (most users) costs one read per TTL, not one per batch."""
    user, cache = uuid.uuid4(), SuppressionCache(store, clock=clock)

    for _ in range(5):
        assert await cache.suppressed(user, [A]) == {}

    assert reads(store) == {"listed": 1, "suppressed": 0}
    assert user in cache


async def test_without_the_broadcast_a_change_is_seen_once_the_read_is_ttl_old(
    store: FakeSuppressionStore, clock: Clock
) -> None:
    """A process that missed the broadcast answers from its copy until TTL seconds after it
    read it, then from the store."""
    user, cache = uuid.uuid4(), SuppressionCache(store, clock=clock)
    assert await cache.suppressed(user, [A]) == {}
    await store.add(user, A, reason="bounce", source="sg")

    clock.t += TTL - 0.01
    stale = await cache.suppressed(user, [A])
    clock.t += 0.01
    fresh = await cache.suppressed(user, [A])

    assert (stale, fresh) == ({}, {A: "bounce"})


async def test_a_change_through_one_process_is_seen_by_anothers_cache_on_the_broadcast(
    store: FakeSuppressionStore, clock: Clock
) -> None:
    """After the store's write and the broadcast, both processes' warm caches answer the new
    list at once, with no time passing."""
    broker = FakeBroker()
    first, second = SuppressionCache(store, clock=clock), SuppressionCache(store, clock=clock)
    await broker.listen(first.hear)
    await broker.listen(second.hear)
    user = uuid.uuid4()
    assert await first.suppressed(user, [A]) == await second.suppressed(user, [A]) == {}

    await managing(store, Changes(broker, first)).suppress(user, A, "typo", source="api")

    assert await first.suppressed(user, [A]) == {A: "typo"}
    assert await second.suppressed(user, [A]) == {A: "typo"}


async def test_a_removal_is_seen_at_once_by_the_process_that_made_it_even_with_the_broker_down(
    store: FakeSuppressionStore, clock: Clock
) -> None:
    """The announcement fails, yet the next batch in the process that lifted the address is
    judged on the list without it."""
    user, cache = uuid.uuid4(), SuppressionCache(store, clock=clock)
    await store.add(user, A, reason="manual", source="api")
    assert await cache.suppressed(user, [A]) == {A: "manual"}

    lifted = await managing(store, Changes(BrokerDown(), cache)).unsuppress(user, A)

    assert lifted is True
    assert await cache.suppressed(user, [A]) == {}


async def test_a_failed_announcement_says_so() -> None:
    """Changes.announce answers False when the broadcast could not be sent."""
    assert await Changes(BrokerDown()).announce([uuid.uuid4()]) is False
    assert await Changes(BrokerDown()).announce([]) is True


async def test_a_large_list_is_looked_up_per_batch(
    store: FakeSuppressionStore, clock: Clock
) -> None:
    """A list of more than ``small`` entries is not kept: each batch looks its own addresses
    up (and the list is not read again within the TTL)."""
    user, cache = uuid.uuid4(), SuppressionCache(store, small=2, clock=clock)
    for email in (A, B, C):
        await store.add(user, email, reason="bounce", source="sg")

    answers = [await cache.suppressed(user, [A, "dan@example.com"]) for _ in range(3)]

    assert answers == [{A: "bounce"}] * 3
    assert reads(store) == {"listed": 1, "suppressed": 3}


async def test_a_list_shrinking_back_to_small_is_kept_again(
    store: FakeSuppressionStore, clock: Clock
) -> None:
    """A large list whose entries are lifted is kept whole again once its mark is TTL old."""
    user, cache = uuid.uuid4(), SuppressionCache(store, small=1, clock=clock)
    for email in (A, B):
        await store.add(user, email, reason="bounce", source="sg")
    await cache.suppressed(user, [A])
    await store.remove(user, B)

    clock.t += TTL
    for _ in range(3):
        await cache.suppressed(user, [A])

    assert reads(store) == {"listed": 2, "suppressed": 1}


async def test_a_list_read_in_flight_when_a_change_is_heard_is_not_kept(
    store: FakeSuppressionStore, clock: Clock
) -> None:
    """A list read before a change but landing after its broadcast is used by the request
    that read it only: the next batch reads the store again."""
    user = uuid.uuid4()
    cache = SuppressionCache(store, clock=clock)

    class ChangedWhileReading:
        async def listed(self, *args: object) -> dict[str, str] | None:
            before = await store.listed(*args)  # type: ignore[arg-type]
            await store.add(user, A, reason="bounce", source="sg")
            cache.hear(announcement([user]))
            return before

        suppressed = store.suppressed

    cache.store = ChangedWhileReading()
    assert await cache.suppressed(user, [A]) == {}
    cache.store = store

    assert user not in cache
    assert await cache.suppressed(user, [A]) == {A: "bounce"}


async def test_concurrent_misses_of_one_users_list_share_one_read(
    store: FakeSuppressionStore, clock: Clock
) -> None:
    """Two batches of a user arriving together while the list is not held read it once
    between them, and both are judged on it."""
    user, cache = uuid.uuid4(), SuppressionCache(store, clock=clock)
    await store.add(user, A, reason="bounce", source="sg")
    gate = asyncio.Event()

    class Slow:
        async def listed(self, *args: object) -> dict[str, str] | None:
            await gate.wait()
            return await store.listed(*args)  # type: ignore[arg-type]

        suppressed = store.suppressed

    cache.store = Slow()
    batches = [asyncio.ensure_future(cache.suppressed(user, [A, B])) for _ in range(2)]
    await asyncio.sleep(0)
    gate.set()
    answers = await asyncio.gather(*batches)

    assert answers == [{A: "bounce"}] * 2
    assert reads(store) == {"listed": 1, "suppressed": 0}


async def test_the_least_recently_used_user_leaves_first(
    store: FakeSuppressionStore, clock: Clock
) -> None:
    """At most ``max_users`` users' lists are held; a user read again stays."""
    ann, bob, carl = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    cache = SuppressionCache(store, max_users=2, clock=clock)

    for user in (ann, bob, ann, carl):
        await cache.suppressed(user, [A])

    assert (ann in cache, bob in cache, carl in cache) == (True, False, True)


async def test_the_addresses_held_are_bounded(store: FakeSuppressionStore, clock: Clock) -> None:
    """A newly read list pushes out the least recently used ones while more than
    ``max_addresses`` addresses (and lists) are held."""
    ann, bob = uuid.uuid4(), uuid.uuid4()
    for email in (A, B, C):
        await store.add(ann, email, reason="bounce", source="sg")
        await store.add(bob, email, reason="bounce", source="sg")
    cache = SuppressionCache(store, max_addresses=5, clock=clock)

    await cache.suppressed(ann, [A])
    await cache.suppressed(bob, [A])

    assert (ann in cache, bob in cache, len(cache)) == (False, True, 1)


async def test_a_list_scoped_batch_reads_the_lists_unsubscribes_once_too(
    store: FakeSuppressionStore, clock: Clock
) -> None:
    """A batch naming a contact list is judged on the user's list and that list's own, each
    kept: the user's entry wins, the list's carries its name, as the store answers."""
    user, cache = uuid.uuid4(), SuppressionCache(store, clock=clock)
    await store.add(user, A, reason="bounce", source="sg")
    await store.add(user, A, reason="unsubscribe", source="tracking", scope="news")
    await store.add(user, B, reason="unsubscribe", source="tracking", scope="news")

    answers = [await cache.suppressed(user, [A, B, C], "news") for _ in range(2)]
    other = await cache.suppressed(user, [A, B, C], "deals")

    assert answers == [{A: "bounce", B: "unsubscribe (news)"}] * 2
    assert other == {A: "bounce"}
    assert reads(store) == {"listed": 3, "suppressed": 0}


async def test_a_change_drops_the_users_contact_lists_too(
    store: FakeSuppressionStore, clock: Clock
) -> None:
    """Heard, a user's change drops every list of the user held (its own and each contact
    list's), and no other user's."""
    user, other, cache = uuid.uuid4(), uuid.uuid4(), SuppressionCache(store, clock=clock)
    assert await cache.suppressed(user, [A, B], "news") == {}
    assert await cache.suppressed(other, [A], "news") == {}
    await store.add(user, B, reason="unsubscribe", source="tracking", scope="news")

    cache.hear(announcement([user]))

    assert (user in cache, other in cache) == (False, True)
    assert await cache.suppressed(user, [A, B], "news") == {B: "unsubscribe (news)"}


@settings(max_examples=60, deadline=None)
@given(
    entries=st.lists(
        st.tuples(st.sampled_from([A, B, C, "Dan@Example.com"]), st.sampled_from([None, "news"])),
        max_size=6,
    ),
    wanted=st.lists(st.sampled_from([A, B, C, "dan@example.com", A.upper()]), max_size=5),
    scope=st.sampled_from([None, "news", "deals"]),
    small=st.integers(0, 4),
)
def test_the_cache_answers_what_the_store_answers(
    entries: list[tuple[str, str | None]], wanted: list[str], scope: str | None, small: int
) -> None:
    """Whatever the lists, the addresses asked and the list named, and whether a list is kept
    whole or looked up, the answer is the store's."""

    async def both() -> tuple[dict[str, str], dict[str, str]]:
        store, user = FakeSuppressionStore(FakeCassandra()), uuid.uuid4()
        for email, where in entries:
            await store.add(user, email, reason=f"why {where}", source="sg", scope=where)
        cache = SuppressionCache(store, small=small)
        return await cache.suppressed(user, wanted, scope), await store.suppressed(
            user, wanted, scope
        )

    mine, theirs = asyncio.run(both())

    assert mine == theirs


def test_the_announcement_names_users_only_and_reads_back_as_them() -> None:
    """An announcement carries the users' ids, and is a wake-up: the settings watchers of
    the consumers and webhooks do not reload their settings for it."""
    users = {uuid.uuid4(), uuid.uuid4()}

    body = announcement(users)

    assert set(changed_in(body)) == users
    assert woken(body) == "suppressions"


@pytest.mark.parametrize(
    "body",
    [
        b'{"changed": ["providers.chain"]}',
        b'{"revoked_keys": ["abc"]}',
        b'{"wake": "scheduler"}',
        b'{"wake": "suppressions", "users": "x"}',
        b"not json",
        b"[1]",
    ],
)
async def test_other_announcements_drop_nothing(
    store: FakeSuppressionStore, clock: Clock, body: bytes
) -> None:
    """A settings nudge, a key revocation, another wake-up or a malformed announcement
    leaves the cached lists in place."""
    user, cache = uuid.uuid4(), SuppressionCache(store, clock=clock)
    await cache.suppressed(user, [A])

    cache.hear(body)

    assert user in cache


def test_unreadable_user_ids_are_skipped() -> None:
    """An id that is not a UUID drops nothing, and the others still go."""
    user = uuid.uuid4()
    body = b'{"wake": "suppressions", "users": ["nope", 3, "%s"]}' % str(user).encode()

    assert changed_in(body) == (user,)


# -- the API's acceptance over the cache -----------------------------------------------------


async def cached(desk: Desk, clock: Clock) -> SuppressionCache:
    """Give the desk's Sending a cache over its suppression twin."""
    cache = SuppressionCache(desk.suppressions, clock=clock)
    desk.sending = dataclasses.replace(desk.sending, suppression_cache=cache)
    desk.quota.daily_limit = 10**6
    return cache


async def test_a_users_batches_after_the_first_make_no_suppression_read(clock: Clock) -> None:
    """Ten batches of one user within the TTL read the suppression list once between them,
    where each read it before."""
    desk = await new_desk(30.0)
    await cached(desk, clock)
    await desk.suppressions.add(desk.user, B, reason="bounce", source="sg")

    answers = [await desk.accept(body_of(A, B), None) for _ in range(10)]

    assert {(a["accepted"], tuple(a["suppressed"])) for a in answers} == {(1, (B,))}
    assert reads(desk.suppressions) == {"listed": 1, "suppressed": 0}


async def test_a_batch_of_only_cached_suppressed_recipients_is_refused(clock: Clock) -> None:
    """Nothing deliverable left by the cached list: 422, as with the store's answer."""
    desk = await new_desk(30.0)
    await cached(desk, clock)
    await desk.suppressions.add(desk.user, A, reason="bounce", source="sg")

    with pytest.raises(ApiError) as refused:
        await desk.accept(body_of(A), None)

    assert refused.value.status == 422
    assert desk.published() == []


# -- the webhook ingest's announcements -----------------------------------------------------


async def test_a_delivery_announces_each_user_it_suppressed_once() -> None:
    """Three suppressing events of one user's batch in one delivery make one announcement
    naming that user; a delivery suppressing no one makes none."""
    w = World()
    heard: list[bytes] = []
    await w.broker.listen(heard.append)
    w.ingest.changes = Changes(w.broker)
    batch = await w.sent(A, B, C)

    await w.ingest.apply_all(
        [event(batch, "bounced", email=e, suppress=True) for e in (A, B, C)]
        + [event(batch, "complained", email=A, suppress=True)]
    )
    bounces = [changed_in(body) for body in heard]
    heard.clear()
    await w.ingest.apply_all([event(batch, "delivered", email=B)])

    assert bounces == [(batch.user_id,)]
    assert heard == []


async def test_a_single_suppressing_event_is_announced() -> None:
    """An event applied on its own (the tracking app's unsubscribe) announces its user."""
    w = World()
    heard: list[bytes] = []
    await w.broker.listen(heard.append)
    w.ingest.changes = Changes(w.broker)
    batch = await w.sent(A)

    await w.ingest.apply(event(batch, "unsubscribed", email=A, suppress=True))

    assert [changed_in(body) for body in heard] == [(batch.user_id,)]


async def test_a_delivery_is_applied_though_its_announcement_cannot_be_sent() -> None:
    """RabbitMQ away: the delivery still applies (its suppressions stored), and the API
    processes see them within their TTL."""
    w = World()
    w.ingest.changes = Changes(BrokerDown())
    batch = await w.sent(A, B)

    result = await w.ingest.apply_all(
        [event(batch, "bounced", email=e, suppress=True) for e in (A, B)]
    )

    assert result == {"applied": 2, "orphans": 0}
    assert await w.suppressions.suppressed(batch.user_id, [A, B]) == {A: "bounced", B: "bounced"}
