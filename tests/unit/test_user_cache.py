"""The per-process cache of one value per user (``shared.infra.user_cache``): kept for its TTL,
one read for concurrent misses, dropped by an announcement under its own wake name."""

from __future__ import annotations

import asyncio
import uuid

import orjson
import pytest

from shared.core.errors import DependencyUnavailable
from shared.infra.user_cache import KeyedCache, UserCache, UserChanges, announcement, changed_in


class Reads:
    """A store whose answer the test sets, counting reads; ``gate`` holds reads open."""

    def __init__(self) -> None:
        self.value: frozenset[str] = frozenset({"example.com"})
        self.count = 0
        self.gate: asyncio.Event | None = None
        self.error: Exception | None = None

    async def read(self, user_id: uuid.UUID) -> frozenset[str]:
        self.count += 1
        answer, error = self.value, self.error
        if self.gate is not None:
            await self.gate.wait()
        if error is not None:
            raise error
        return answer


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Announcements:
    def __init__(self, *, down: bool = False) -> None:
        self.sent: list[bytes] = []
        self.down = down

    async def announce(self, body: bytes) -> None:
        if self.down:
            raise DependencyUnavailable("rabbitmq", "down")
        self.sent.append(body)


def cache_of(reads: Reads, clock: Clock, **kwargs: object) -> UserCache[frozenset[str]]:
    return UserCache(reads.read, wake="domains", ttl=5.0, clock=clock, **kwargs)  # type: ignore[arg-type]


async def test_a_value_read_less_than_its_ttl_ago_is_answered_without_a_read() -> None:
    """Within the TTL the second ask is answered from memory; past it the store is read."""
    reads, clock = Reads(), Clock()
    cache = cache_of(reads, clock)
    user = uuid.uuid4()

    await cache.get(user)
    clock.now = 4.9
    await cache.get(user)
    after_ttl = reads.count
    clock.now = 5.0
    await cache.get(user)

    assert (after_ttl, reads.count) == (1, 2)


async def test_concurrent_misses_of_one_user_share_one_read() -> None:
    """Sixteen requests of a user arriving together cost the store one read."""
    reads, clock = Reads(), Clock()
    reads.gate = asyncio.Event()
    cache = cache_of(reads, clock)
    user = uuid.uuid4()

    asks = [asyncio.ensure_future(cache.get(user)) for _ in range(16)]
    await asyncio.sleep(0)
    reads.gate.set()
    answers = await asyncio.gather(*asks)

    assert reads.count == 1
    assert set(answers) == {frozenset({"example.com"})}


async def test_an_ask_does_not_join_a_read_sent_a_ttl_or_more_before_it() -> None:
    """A read still in flight a TTL after it was sent is not joined: the ask reads again and
    gets the store as it is now (a value is never answered from a read older than the TTL)."""
    reads, clock = Reads(), Clock()
    reads.gate = asyncio.Event()
    cache = cache_of(reads, clock)
    user = uuid.uuid4()
    slow = asyncio.ensure_future(cache.get(user))
    for _ in range(3):  # the read is sent: it answers the store as it was
        await asyncio.sleep(0)

    reads.value = frozenset({"example.net"})
    clock.now = 5.0
    late = asyncio.ensure_future(cache.get(user))
    await asyncio.sleep(0)
    reads.gate.set()

    assert (await slow, await late) == (frozenset({"example.com"}), frozenset({"example.net"}))
    assert (reads.count, await cache.get(user)) == (2, frozenset({"example.net"}))


async def test_a_read_that_fails_is_not_kept_and_tells_every_waiter() -> None:
    """A failed read raises to all who waited for it, and the next ask reads again."""
    reads, clock = Reads(), Clock()
    reads.gate, reads.error = asyncio.Event(), DependencyUnavailable("cassandra", "down")
    cache = cache_of(reads, clock)
    user = uuid.uuid4()

    asks = [asyncio.ensure_future(cache.get(user)) for _ in range(2)]
    await asyncio.sleep(0)
    reads.gate.set()
    outcomes = await asyncio.gather(*asks, return_exceptions=True)
    reads.gate, reads.error = None, None
    again = await cache.get(user)

    assert all(isinstance(o, DependencyUnavailable) for o in outcomes)
    assert (again, reads.count) == (frozenset({"example.com"}), 2)


async def test_an_announcement_under_its_wake_name_drops_the_users_it_names() -> None:
    """Heard, the named user's next ask reads the store; another user's value stays."""
    reads, clock = Reads(), Clock()
    cache = cache_of(reads, clock)
    changed, other = uuid.uuid4(), uuid.uuid4()
    await cache.get(changed)
    await cache.get(other)
    reads.value = frozenset()

    cache.hear(announcement("domains", [changed]))

    assert await cache.get(changed) == frozenset()
    assert await cache.get(other) == frozenset({"example.com"})


async def test_an_announcement_under_another_wake_name_drops_nothing() -> None:
    """The suppression lists' announcement (or a settings change) leaves this cache alone."""
    reads, clock = Reads(), Clock()
    cache = cache_of(reads, clock)
    user = uuid.uuid4()
    await cache.get(user)

    cache.hear(announcement("suppressions", [user]))
    cache.hear(b'{"settings": 1}')
    cache.hear(b"not json")
    await cache.get(user)

    assert reads.count == 1


async def dropped_while_reading() -> tuple[
    Reads, asyncio.Event, UserCache[frozenset[str]], uuid.UUID, asyncio.Future[frozenset[str]]
]:
    """A cache whose one user is dropped while the user's first read is held open: the
    reads, the gate that lets it answer, the cache, the user, and that first ask."""
    reads, gate = Reads(), asyncio.Event()
    reads.gate = gate
    cache = cache_of(reads, Clock())
    user = uuid.uuid4()
    early = asyncio.ensure_future(cache.get(user))
    await asyncio.sleep(0)
    cache.forget([user])
    return reads, gate, cache, user, early


async def test_a_read_in_flight_across_a_drop_is_answered_but_not_kept() -> None:
    """A read sent before a change may hold the old value: its caller gets it, but the next
    ask reads again instead of using it for the TTL."""
    reads, gate, cache, user, early = await dropped_while_reading()
    gate.set()
    await early
    reads.gate = None
    reads.value = frozenset()
    later = await cache.get(user)

    assert (later, reads.count) == (frozenset(), 2)


async def test_an_ask_after_a_drop_does_not_join_a_read_sent_before_it() -> None:
    """After the drop a new read is sent: the change is seen by every request that began
    after it."""
    reads, gate, cache, user, early = await dropped_while_reading()
    late = asyncio.ensure_future(cache.get(user))
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(early, late)

    assert reads.count == 2


async def test_at_most_max_users_are_held_the_least_recently_used_leaving_first() -> None:
    """A third user evicts the one asked for longest ago."""
    reads, clock = Reads(), Clock()
    cache = cache_of(reads, clock, max_users=2)
    first, second, third = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await cache.get(first)
    await cache.get(second)
    await cache.get(first)

    await cache.get(third)
    await cache.get(first)
    held = reads.count
    await cache.get(second)

    assert (len(cache), held, reads.count) == (2, 3, 4)


async def test_a_ttl_of_zero_reads_the_store_for_every_ask() -> None:
    """``0`` turns the cache off (every batch reads, as before it existed)."""
    reads = Reads()
    cache: UserCache[frozenset[str]] = UserCache(reads.read, wake="domains", ttl=0.0)
    user = uuid.uuid4()

    await cache.get(user)
    await cache.get(user)

    assert (reads.count, len(cache)) == (2, 0)


def keeping_nonempty(reads: Reads) -> KeyedCache[uuid.UUID, frozenset[str], uuid.UUID]:
    """A cache that keeps only the answers with a domain in them."""
    return KeyedCache(reads.read, user_of=lambda user: user, ttl=5.0, keep=bool, clock=Clock())


async def test_an_answer_keep_refuses_is_shared_by_concurrent_asks_and_read_again_after() -> None:
    """Asks arriving while such an answer is read share the read; the next ask reads again."""
    reads = Reads()
    reads.value, reads.gate = frozenset(), asyncio.Event()
    cache = keeping_nonempty(reads)
    user = uuid.uuid4()

    asks = [asyncio.ensure_future(cache.get(user)) for _ in range(4)]
    await asyncio.sleep(0)
    reads.gate.set()
    answers = await asyncio.gather(*asks)
    together, held = reads.count, len(cache)
    reads.gate = None
    await cache.get(user)

    assert answers == [frozenset()] * 4
    assert (together, held, reads.count) == (1, 0, 2)


async def test_an_ask_made_once_a_read_answered_does_not_share_an_answer_not_kept() -> None:
    """An ask that starts after the read answered, before its waiters resume, reads again."""
    reads = Reads()
    reads.value, reads.gate = frozenset(), asyncio.Event()
    cache = keeping_nonempty(reads)
    user = uuid.uuid4()
    first = asyncio.ensure_future(cache.get(user))
    await asyncio.sleep(0)

    reads.gate.set()  # the read resumes and answers before the later ask's first step
    later = asyncio.ensure_future(cache.get(user))
    await asyncio.gather(first, later)

    assert reads.count == 2


def test_an_announcement_names_its_users_and_nothing_else_is_read_from_it() -> None:
    """Ids round-trip; values that are not ids are skipped, not fatal."""
    users = [uuid.uuid4(), uuid.uuid4()]
    body = orjson.dumps({"wake": "domains", "users": [str(users[0]), "nope", 7, str(users[1])]})

    assert set(changed_in(announcement("domains", users), "domains")) == set(users)
    assert set(changed_in(body, "domains")) == set(users)
    assert changed_in(orjson.dumps({"wake": "domains", "users": "x"}), "domains") == ()


@pytest.mark.parametrize("down", [False, True])
async def test_a_change_drops_the_writers_own_copy_whether_or_not_it_is_announced(
    down: bool,
) -> None:
    """The process that made the change sees it at once even with the broker down (then the
    others see it within their TTL, and announce says False)."""
    reads, clock = Reads(), Clock()
    cache = cache_of(reads, clock)
    user = uuid.uuid4()
    await cache.get(user)
    broker = Announcements(down=down)

    told = await UserChanges(broker, cache, "domains").announce([user])

    assert (told, len(cache)) == (not down, 0)
    assert [changed_in(b, "domains") for b in broker.sent] == ([] if down else [(user,)])
