"""A per-process cache of one value per user read from the store, and the broadcast that drops
users' values from every process's cache when they change.

What a request reads of its user's configuration (the sending domains it verified, say) rarely
changes, yet reading it for every request is one Cassandra round trip per request.
:class:`UserCache` keeps each user's value for at most ``ttl`` seconds counted from the moment
its read was sent; concurrent misses of one user share one read. Every writer of such a value
writes the store first, then hands the user to :class:`UserChanges`, which drops the user from
its own process's cache at once and announces the user's id on the live-settings fanout
exchange under the cache's wake name (``shared.infra.leases.woken``); every process drops the user
on receipt (:meth:`UserCache.hear`). A change is seen at once by the process that made it, by the
others within the broadcast (milliseconds), and by every process within ``ttl`` without it
(the broker down, the announcement lost). A read in flight across a drop is answered to its
callers but not kept: it may hold the value as it was before the change.

:class:`KeyedCache` is the same cache over keys that each belong to an owner (a user's list
per contact list, say), bounded by a weight per value as well as their number, keeping only
the answers it is told to; dropping an owner drops all of the owner's keys.
``shared.audience.suppression_cache`` keeps users' suppression lists in one, with the same
announcements; ``services.api.keycache`` keeps API-key rows in one, each key its own owner.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Hashable, Iterable
from dataclasses import dataclass
from typing import Final, Generic, Protocol, TypeVar

import orjson

from shared.core.errors import DependencyUnavailable
from shared.infra.leases import Announcer, woken

log = logging.getLogger(__name__)

#: Values (users', for a UserCache) one process keeps.
MAX_USERS: Final = 10_000

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")
U = TypeVar("U", bound=Hashable)


@dataclass(frozen=True, slots=True)
class _Held(Generic[T]):
    value: T
    read_at: float
    """The monotonic time its read was sent."""
    weight: int


def _always(value: object) -> bool:
    return True


class KeyedCache(Generic[K, T, U]):
    """Each key's value as ``read`` answered it, for at most ``ttl`` seconds, when ``keep``
    says so (another answer is read again at the next ask); a key belongs to one owner
    (``user_of``: a user, for announcements under ``wake`` naming users), and dropping the
    owner drops all of its keys. At most ``max_entries`` values and ``max_weight`` of their
    ``weigh`` are held, the least recently used leaving first (the one just read never)."""

    def __init__(
        self,
        read: Callable[[K], Awaitable[T]],
        *,
        user_of: Callable[[K], U],
        wake: str = "",
        ttl: float,
        max_entries: int = MAX_USERS,
        max_weight: float = math.inf,
        weigh: Callable[[T], int] = lambda value: 1,
        keep: Callable[[T], bool] = _always,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read
        self._user_of = user_of
        self.wake = wake
        self.ttl = ttl
        self.max_entries = max_entries
        self.max_weight = max_weight
        self._weigh = weigh
        self._keeps = keep
        self._clock = clock
        self._held: OrderedDict[K, _Held[T]] = OrderedDict()
        """Least recently used first."""
        self._keys: dict[U, set[K]] = {}
        """The keys held, by owner."""
        self.weight = 0
        """The held values' weights."""
        self._reading: dict[K, tuple[asyncio.Future[T], float]] = {}
        """Reads in flight, each with the monotonic time it was sent."""
        self._forgotten = 0
        """How many drops so far: a read in flight across a drop is not kept (it may hold the
        value as it was before the change)."""
        self.reads = 0
        """Values read from the store (misses), for tests and measurements."""

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, key: object) -> bool:
        """Whether a value of ``key`` is held (fresh or not)."""
        return key in self._held

    def users(self) -> Collection[U]:
        """The owners with a value held (fresh or not)."""
        return self._keys.keys()

    async def get(self, key: K) -> T:
        """The key's value: kept when read less than ``ttl`` seconds ago, else read (once for
        all who ask meanwhile). Raises what the read raises (nothing is kept then)."""
        started = self._clock()
        held = self._held.get(key)
        if held is not None:
            if started - held.read_at < self.ttl:
                self._held.move_to_end(key)
                return held.value
            self._drop(key)
        in_flight = self._reading.get(key)
        if in_flight is not None and started - in_flight[1] < self.ttl:
            reading = in_flight[0]
        else:
            # A read sent ``ttl`` ago or more is not joined: its answer may be as old as a
            # kept value may never be (a revoked key accepted past the TTL when the broadcast
            # was lost and the store was slow). The generation is taken now, not when the
            # read's task first runs: a drop in between must stop it being kept.
            reading = asyncio.ensure_future(self._read_and_keep(key, started, self._forgotten))
            self._reading[key] = (reading, started)
            reading.add_done_callback(lambda done: self._done(key, done))
        # Shielded: one caller cancelled (its request ended) leaves the others' read.
        return await asyncio.shield(reading)

    async def _read_and_keep(self, key: K, started: float, forgotten: int) -> T:
        try:
            value = await self._read(key)
        finally:
            # Off the table as it answers, not a turn of the loop later: an answer that is not
            # kept is not handed to an ask made after it either.
            in_flight = self._reading.get(key)
            if in_flight is not None and in_flight[0] is asyncio.current_task():
                del self._reading[key]
        self.reads += 1
        held = self._held.get(key)
        newer = held is not None and held.read_at > started  # a later read answered first
        if forgotten == self._forgotten and self.ttl > 0 and self._keeps(value) and not newer:
            self._keep(key, _Held(value, started, self._weigh(value)))
        return value

    def _keep(self, key: K, held: _Held[T]) -> None:
        self._drop(key)
        self._held[key] = held
        self._keys.setdefault(self._user_of(key), set()).add(key)
        self.weight += held.weight
        while len(self._held) > self.max_entries or (
            self.weight > self.max_weight and len(self._held) > 1
        ):
            self._drop(next(iter(self._held)))

    def _drop(self, key: K) -> None:
        held = self._held.pop(key, None)
        if held is None:
            return
        self.weight -= held.weight
        user = self._user_of(key)
        keys = self._keys[user]
        keys.discard(key)
        if not keys:
            del self._keys[user]

    def _done(self, key: K, done: asyncio.Future[T]) -> None:
        in_flight = self._reading.get(key)
        if in_flight is not None and in_flight[0] is done:
            del self._reading[key]
        if not done.cancelled():
            done.exception()  # its callers hear it; none left must not make asyncio warn

    def forget(self, user_ids: Iterable[U]) -> None:
        """Drop these owners' values: their next asks read the store (a read in flight is not
        joined, nor kept)."""
        users = set(user_ids)
        if not users:
            return
        for user in users:
            for key in tuple(self._keys.get(user, ())):
                self._drop(key)
        for key in [k for k in self._reading if self._user_of(k) in users]:
            del self._reading[key]
        self._forgotten += 1

    def hear(self: KeyedCache[K, T, uuid.UUID], body: bytes) -> None:
        """An announcement on the settings exchange: drop the users it names under this
        cache's wake name (any other announcement drops none)."""
        self.forget(changed_in(body, self.wake))


def _same(user_id: uuid.UUID) -> uuid.UUID:
    return user_id


class UserCache(KeyedCache[uuid.UUID, T, uuid.UUID]):
    """Each user's value as ``read`` answered it, for at most ``ttl`` seconds; dropped on an
    announcement under ``wake`` naming the user."""

    def __init__(
        self,
        read: Callable[[uuid.UUID], Awaitable[T]],
        *,
        wake: str,
        ttl: float,
        max_users: int = MAX_USERS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(
            read, user_of=_same, wake=wake, ttl=ttl, max_entries=max_users, clock=clock
        )

    @property
    def max_users(self) -> int:
        """Users whose values are held at most."""
        return self.max_entries


def announcement(wake: str, user_ids: Iterable[uuid.UUID]) -> bytes:
    """The announcement that these users' values under ``wake`` changed (their ids only)."""
    return orjson.dumps({"wake": wake, "users": sorted(str(u) for u in user_ids)})


def changed_in(body: bytes, wake: str) -> tuple[uuid.UUID, ...]:
    """The users an announcement under ``wake`` says changed; none for any other."""
    if woken(body) != wake:
        return ()
    users = orjson.loads(body).get("users")
    if not isinstance(users, list):
        return ()
    found = []
    for text in users:
        try:
            found.append(uuid.UUID(text))
        except (TypeError, ValueError, AttributeError):
            continue
    return tuple(found)


class Forgets(Protocol):
    """A cache that drops users (:class:`UserCache`, ``shared.audience.suppression_cache``)."""

    def forget(self, user_ids: Iterable[uuid.UUID]) -> None: ...


@dataclass(frozen=True, slots=True)
class UserChanges:
    """Tells every process (this one's cache at once) that users' values under ``wake``
    changed in the store."""

    broker: Announcer
    cache: Forgets | None = None
    wake: str = ""

    async def announce(self, user_ids: Iterable[uuid.UUID]) -> bool:
        """Call after the store's write. False when the broadcast could not be sent: every
        process still sees the change within its cache's TTL of the write."""
        users = set(user_ids)
        if not users:
            return True
        if self.cache is not None:
            self.cache.forget(users)
        try:
            await self.broker.announce(announcement(self.wake, users))
        except DependencyUnavailable as exc:
            log.warning("%s changed but not announced (seen within the TTL): %s", self.wake, exc)
            return False
        return True
