"""Each API process's cache of its users' suppression lists, and the broadcast that drops a
user's lists from every process's cache when they change.

Accepting a batch leaves out the recipients on its sender's suppression list and reports
them under ``suppressed``; reading the list for every request was one Cassandra round trip
(or more) per batch. :class:`SuppressionCache` keeps a user's whole list, read in one query
of at most :attr:`~SuppressionCache.small` entries (``SAFEDELIVR_API_SUPPRESSION_CACHE_SMALL``,
2,000), for at most :attr:`~SuppressionCache.ttl` seconds counted from the moment the read
was sent (``SAFEDELIVR_API_SUPPRESSION_CACHE_TTL``, 5 s). An empty list is kept like any
other: most users have none, and theirs then costs one read per TTL per process. A batch
naming a contact list also needs that list's own unsubscribes (``list_suppressions``), kept
beside the user's list in the same way.

A list longer than ``small`` is marked large (for the TTL as well), and each batch of its
user looks its own addresses up (``SuppressionStore.suppressed``), as every batch did before.

Every writer of a user's suppressions (``POST``/``DELETE /v1/suppressions`` and the
dashboard's list through ``services.api.managing``, and the webhook ingest's hard bounces,
complaints and unsubscribes, the tracking app's one-click unsubscribes included) writes the
store first, then hands the user to :class:`Changes`: it drops the user's lists from its own
process's cache at once and announces the user's id on the live-settings fanout exchange
(``<exchange>.settings``), and every API process drops them on receipt
(:meth:`SuppressionCache.hear`). The ingest announces once per delivery, for every user it
suppressed an address of. So a change is seen at once by the process that made it, by the
others within the broadcast (milliseconds), and by every process within ``ttl`` of the write
without it (the broker down, or the announcement lost).

The answer is stale by that bound at most, in both directions: an address suppressed a moment
ago may be accepted (the consumers' check at send time leaves it out, and it ends
``dropped``: it is never mailed), and one lifted a moment ago through another process may be
left out of a batch and listed under ``suppressed``.

The announcement is a wake-up (``shared.infra.leases.woken``), so the settings watchers of the
consumers and webhooks, which reload their settings on any other announcement, let it pass.
The lists are kept by ``shared.infra.user_cache.KeyedCache``, one per user and contact list:
concurrent misses of one list share one read, and a read in flight across a drop is answered
to its batches but not kept. At most ``max_users`` lists (:data:`MAX_USERS`) and about
``max_addresses`` addresses (:data:`MAX_ADDRESSES`) are held, the least recently used list
leaving first.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Protocol

from shared.core.addresses import address_key
from shared.infra import user_cache
from shared.infra.user_cache import KeyedCache, UserChanges

log = logging.getLogger(__name__)

#: Entries a list may have to be kept whole (longer: each batch looks its addresses up).
SMALL: Final = 2_000
#: Seconds a list is used after its read was sent: how late a change is seen by a process
#: that missed its broadcast.
TTL: Final = 5.0
#: Lists one process keeps (a user's own, and each contact list's it was asked for).
MAX_USERS: Final = 10_000
#: Addresses one process keeps across those lists (each about 150 bytes).
MAX_ADDRESSES: Final = 50_000
#: The wake-up an announcement of changed lists is (``shared.infra.leases.woken``).
WAKE: Final = "suppressions"

#: A user's list as read: address key -> reason, or None when it is large.
Listed = Mapping[str, str] | None


class Lists(Protocol):
    """What the cache reads (``shared.audience.suppressions.SuppressionStore``)."""

    async def listed(
        self, user_id: uuid.UUID, most: int, scope: str | None = None
    ) -> dict[str, str] | None: ...

    async def suppressed(
        self, user_id: uuid.UUID, emails: Iterable[str], scope: str | None = None
    ) -> dict[str, str]: ...


#: A list's key in the cache: its user, and its contact list (None: the user's whole list).
Key = tuple[uuid.UUID, str | None]


def _user_of(key: Key) -> uuid.UUID:
    return key[0]


def _weight(listed: Listed) -> int:
    """What a list counts towards ``max_addresses``: one, and one per address."""
    return 1 + (len(listed) if listed is not None else 0)


class SuppressionCache:
    """Users' suppression lists read from the store, each for at most ``ttl`` seconds
    (``shared.infra.user_cache.KeyedCache``, a list per user and contact list)."""

    def __init__(
        self,
        store: Lists,
        *,
        small: int = SMALL,
        ttl: float = TTL,
        max_users: int = MAX_USERS,
        max_addresses: int = MAX_ADDRESSES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.small = small
        self._lists: KeyedCache[Key, Listed, uuid.UUID] = KeyedCache(
            self._read,
            user_of=_user_of,
            wake=WAKE,
            ttl=ttl,
            max_entries=max_users,
            max_weight=max_addresses,
            weigh=_weight,
            clock=clock,
        )
        self.lookups = 0
        """Batches of a large list's user looked up in the store."""

    @property
    def ttl(self) -> float:
        """Seconds a list is used after its read was sent."""
        return self._lists.ttl

    @property
    def reads(self) -> int:
        """Lists read from the store (cache misses), for tests and measurements."""
        return self._lists.reads

    def __len__(self) -> int:
        """How many users have a list held."""
        return len(self._lists.users())

    def __contains__(self, user_id: object) -> bool:
        """Whether any list of ``user_id`` is held (fresh or not)."""
        return user_id in self._lists.users()

    async def suppressed(
        self, user_id: uuid.UUID, emails: Iterable[str], scope: str | None = None
    ) -> dict[str, str]:
        """What ``SuppressionStore.suppressed`` answers (the subset of ``emails`` on the
        user's list, or on ``scope``'s, with their reasons), from the lists kept here."""
        scopes: tuple[str | None, ...] = (None,) if scope is None else (None, scope)
        whole, *own = await asyncio.gather(*(self._lists.get((user_id, s)) for s in scopes))
        scoped = own[0] if own else {}
        if whole is None or scoped is None:
            self.lookups += 1
            return await self.store.suppressed(user_id, emails, scope)
        found: dict[str, str] = {}
        for email in emails:
            key = address_key(email)
            if key in whole:
                found[key] = whole[key]
            elif key in scoped:
                found[key] = f"{scoped[key]} ({scope})"
        return found

    async def _read(self, key: Key) -> Listed:
        user_id, scope = key
        return await self.store.listed(user_id, self.small, scope)

    def forget(self, user_ids: Iterable[uuid.UUID]) -> None:
        """Drop these users' lists: their next batch reads the store."""
        self._lists.forget(user_ids)

    def hear(self, body: bytes) -> None:
        """An announcement on the settings exchange: drop the users whose lists it says
        changed (any other announcement drops none)."""
        self._lists.hear(body)


def announcement(user_ids: Iterable[uuid.UUID]) -> bytes:
    """The announcement that these users' suppressions changed (their ids only)."""
    return user_cache.announcement(WAKE, user_ids)


def changed_in(body: bytes) -> tuple[uuid.UUID, ...]:
    """The users an announcement says changed; none for any other announcement."""
    return user_cache.changed_in(body, WAKE)


@dataclass(frozen=True, slots=True)
class Changes(UserChanges):
    """Tells every API process (this one's cache at once) that users' suppressions changed in
    the store (:meth:`~shared.infra.user_cache.UserChanges.announce`)."""

    wake: str = WAKE
