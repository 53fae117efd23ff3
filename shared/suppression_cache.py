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

The announcement is a wake-up (``shared.leases.woken``), so the settings watchers of the
consumers and webhooks, which reload their settings on any other announcement, let it pass.
At most :attr:`~SuppressionCache.max_users` users' lists and about
:attr:`~SuppressionCache.max_addresses` addresses are held, the least recently used user
leaving first.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Protocol

from shared import user_cache
from shared.addresses import address_key
from shared.user_cache import UserChanges

log = logging.getLogger(__name__)

#: Entries a list may have to be kept whole (longer: each batch looks its addresses up).
SMALL: Final = 2_000
#: Seconds a list is used after its read was sent: how late a change is seen by a process
#: that missed its broadcast.
TTL: Final = 5.0
#: Users whose lists one process keeps.
MAX_USERS: Final = 10_000
#: Addresses one process keeps across those lists (each about 150 bytes).
MAX_ADDRESSES: Final = 50_000
#: The wake-up an announcement of changed lists is (``shared.leases.woken``).
WAKE: Final = "suppressions"

#: A user's list as read: address key -> reason, or None when it is large.
Listed = Mapping[str, str] | None


class Lists(Protocol):
    """What the cache reads (``shared.suppressions.SuppressionStore``)."""

    async def listed(
        self, user_id: uuid.UUID, most: int, scope: str | None = None
    ) -> dict[str, str] | None: ...

    async def suppressed(
        self, user_id: uuid.UUID, emails: Iterable[str], scope: str | None = None
    ) -> dict[str, str]: ...


@dataclass(frozen=True, slots=True)
class _Entry:
    listed: Listed
    read_at: float
    """The monotonic time its read was sent."""

    @property
    def weight(self) -> int:
        return 1 + (len(self.listed) if self.listed is not None else 0)


class SuppressionCache:
    """Users' suppression lists read from the store, each for at most ``ttl`` seconds."""

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
        self.ttl = ttl
        self.max_users = max_users
        self.max_addresses = max_addresses
        self._clock = clock
        self._users: OrderedDict[uuid.UUID, dict[str | None, _Entry]] = OrderedDict()
        """Per user, its lists by scope (None: the whole list), least recently used first."""
        self._held = 0
        """The entries' weights: one per list, one per address."""
        self._forgotten = 0
        """How many drops so far: a read in flight across a drop is not kept (it may hold the
        list as it was before the change)."""
        self.reads = 0
        """Lists read from the store (cache misses), for tests and measurements."""
        self.lookups = 0
        """Batches of a large list's user looked up in the store."""

    def __len__(self) -> int:
        return len(self._users)

    def __contains__(self, user_id: object) -> bool:
        """Whether any list of ``user_id`` is held (fresh or not)."""
        return user_id in self._users

    async def suppressed(
        self, user_id: uuid.UUID, emails: Iterable[str], scope: str | None = None
    ) -> dict[str, str]:
        """What ``SuppressionStore.suppressed`` answers (the subset of ``emails`` on the
        user's list, or on ``scope``'s, with their reasons), from the lists kept here."""
        scopes: tuple[str | None, ...] = (None,) if scope is None else (None, scope)
        whole, *own = await asyncio.gather(*(self._list(user_id, s) for s in scopes))
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

    async def _list(self, user_id: uuid.UUID, scope: str | None) -> Listed:
        """The user's list (or ``scope``'s): kept when read less than ``ttl`` seconds ago."""
        started = self._clock()
        lists = self._users.get(user_id)
        entry = lists.get(scope) if lists is not None else None
        if lists is not None and entry is not None:
            if started - entry.read_at < self.ttl:
                self._users.move_to_end(user_id)
                return entry.listed
            del lists[scope]
            self._held -= entry.weight
        forgotten = self._forgotten
        listed = await self.store.listed(user_id, self.small, scope)
        self.reads += 1
        if forgotten == self._forgotten:
            self._keep(user_id, scope, _Entry(listed, started))
        return listed

    def _keep(self, user_id: uuid.UUID, scope: str | None, entry: _Entry) -> None:
        lists = self._users.setdefault(user_id, {})
        earlier = lists.get(scope)
        if earlier is not None:
            self._held -= earlier.weight
        lists[scope] = entry
        self._held += entry.weight
        self._users.move_to_end(user_id)
        while len(self._users) > self.max_users or (
            self._held > self.max_addresses and len(self._users) > 1
        ):
            _, gone = self._users.popitem(last=False)
            self._held -= sum(e.weight for e in gone.values())

    def forget(self, user_ids: Iterable[uuid.UUID]) -> None:
        """Drop these users' lists: their next batch reads the store."""
        for user_id in user_ids:
            gone = self._users.pop(user_id, None)
            if gone is not None:
                self._held -= sum(e.weight for e in gone.values())
            self._forgotten += 1

    def hear(self, body: bytes) -> None:
        """An announcement on the settings exchange: drop the users whose lists it says
        changed (any other announcement drops none)."""
        self.forget(changed_in(body))


def announcement(user_ids: Iterable[uuid.UUID]) -> bytes:
    """The announcement that these users' suppressions changed (their ids only)."""
    return user_cache.announcement(WAKE, user_ids)


def changed_in(body: bytes) -> tuple[uuid.UUID, ...]:
    """The users an announcement says changed; none for any other announcement."""
    return user_cache.changed_in(body, WAKE)


@dataclass(frozen=True, slots=True)
class Changes(UserChanges):
    """Tells every API process (this one's cache at once) that users' suppressions changed in
    the store (:meth:`~shared.user_cache.UserChanges.announce`)."""

    wake: str = WAKE
