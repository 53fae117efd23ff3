"""A per-process cache of one value per user read from the store, and the broadcast that drops
users' values from every process's cache when they change.

What a request reads of its user's configuration (the sending domains it verified, say) rarely
changes, yet reading it for every request is one Cassandra round trip per request.
:class:`UserCache` keeps each user's value for at most ``ttl`` seconds counted from the moment
its read was sent; concurrent misses of one user share one read. Every writer of such a value
writes the store first, then hands the user to :class:`UserChanges`, which drops the user from
its own process's cache at once and announces the user's id on the live-settings fanout
exchange under the cache's wake name (``shared.leases.woken``); every process drops the user on
receipt (:meth:`UserCache.hear`). A change is seen at once by the process that made it, by the
others within the broadcast (milliseconds), and by every process within ``ttl`` without it
(the broker down, the announcement lost). A read in flight across a drop is answered to its
callers but not kept: it may hold the value as it was before the change.

``shared.suppression_cache`` keeps users' suppression lists with the same announcements.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Final, Generic, Protocol, TypeVar

import orjson

from shared.errors import DependencyUnavailable
from shared.leases import Announcer, woken

log = logging.getLogger(__name__)

#: Users whose values one process keeps.
MAX_USERS: Final = 10_000

T = TypeVar("T")


class UserCache(Generic[T]):
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
        self._read = read
        self.wake = wake
        self.ttl = ttl
        self.max_users = max_users
        self._clock = clock
        self._held: OrderedDict[uuid.UUID, tuple[T, float]] = OrderedDict()
        """Per user, its value and the monotonic time its read was sent; least recently used
        first."""
        self._reading: dict[uuid.UUID, asyncio.Future[T]] = {}
        self._forgotten = 0
        self.reads = 0
        """Values read from the store (misses), for tests and measurements."""

    def __len__(self) -> int:
        return len(self._held)

    async def get(self, user_id: uuid.UUID) -> T:
        """The user's value: kept when read less than ``ttl`` seconds ago, else read (once for
        all who ask meanwhile). Raises what the read raises (nothing is kept then)."""
        started = self._clock()
        held = self._held.get(user_id)
        if held is not None:
            if started - held[1] < self.ttl:
                self._held.move_to_end(user_id)
                return held[0]
            del self._held[user_id]
        reading = self._reading.get(user_id)
        if reading is None:
            # The generation is taken now, not when the read's task first runs: a drop in
            # between must stop it being kept.
            reading = asyncio.ensure_future(self._read_and_keep(user_id, started, self._forgotten))
            self._reading[user_id] = reading
            reading.add_done_callback(lambda done: self._done(user_id, done))
        # Shielded: one caller cancelled (its request ended) leaves the others' read.
        return await asyncio.shield(reading)

    async def _read_and_keep(self, user_id: uuid.UUID, started: float, forgotten: int) -> T:
        value = await self._read(user_id)
        self.reads += 1
        if forgotten == self._forgotten and self.ttl > 0:
            self._held[user_id] = (value, started)
            self._held.move_to_end(user_id)
            while len(self._held) > self.max_users:
                self._held.popitem(last=False)
        return value

    def _done(self, user_id: uuid.UUID, done: asyncio.Future[T]) -> None:
        if self._reading.get(user_id) is done:
            del self._reading[user_id]
        if not done.cancelled():
            done.exception()  # its callers hear it; none left must not make asyncio warn

    def forget(self, user_ids: Iterable[uuid.UUID]) -> None:
        """Drop these users' values: their next request reads the store (a read in flight is
        not joined, nor kept)."""
        for user_id in user_ids:
            self._held.pop(user_id, None)
            self._reading.pop(user_id, None)
            self._forgotten += 1

    def hear(self, body: bytes) -> None:
        """An announcement on the settings exchange: drop the users it names under this
        cache's wake name (any other announcement drops none)."""
        self.forget(changed_in(body, self.wake))


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
    """A cache that drops users (:class:`UserCache`, ``shared.suppression_cache``)."""

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
