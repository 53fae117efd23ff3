"""Each API process's cache of API-key lookups, and the broadcast that revokes a key in every
process's cache at once.

Every request presents a key; reading its ``api_keys`` row each time was one Cassandra round
trip per request. :class:`KeyCache` keeps the rows it read (the record and the secret's
digest, never the secret) for at most :data:`TTL` seconds, counted from the moment the read
was sent, so a row changed in the store (revoked, say) is seen by every process within
:data:`TTL` of the write even when no broadcast reaches it. The broadcast makes it sooner: the
process that revokes a key writes the store first, then announces the key's id on the
live-settings fanout exchange (``<exchange>.settings``, :func:`announce_revoked`), and every
API process drops the key from its cache on receipt (:meth:`KeyCache.hear`).

Only keys that exist are cached: an unknown key id is read again at its next use (a key
created a moment ago is never refused for having been unknown), so guessed ids cannot fill
memory; and the cache holds at most :data:`MAX_KEYS` rows, the least recently used leaving
first. The secret is checked on every request, cached or not, by hashing it and comparing
digests in constant time (:func:`shared.accounts.apikeys.verify`), as without the cache.

The rows are kept by ``shared.infra.user_cache.KeyedCache``, each key id its own owner (a
revocation names key ids): concurrent requests with a key not held share one read, and a read
in flight across a revocation is answered to its requests but neither kept nor joined by later
ones. A read that finds no row is shared only by the requests that arrived while it was in
flight.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Protocol

import orjson

from shared.accounts import apikeys
from shared.accounts.accounts import ApiKeyRecord, StoredKey
from shared.core.errors import DependencyUnavailable
from shared.infra.user_cache import KeyedCache

log = logging.getLogger(__name__)

#: Seconds a key's row is used after its read was sent: the bound on how long a revoked key
#: can still be accepted by a process that missed the broadcast (or with the broker down).
TTL: Final = 1.0
#: Key rows one process keeps (each about 1 KB).
MAX_KEYS: Final = 10_000
#: The announcement's field naming revoked key ids (a settings nudge has ``changed``).
_FIELD: Final = "revoked_keys"
#: What a malformed key is compared with, so every path hashes and compares once.
_NO_HASH: Final = b"\0" * 32

Read = Callable[[str], Awaitable[StoredKey | None]]


def _own(key_id: str) -> str:
    return key_id


def _exists(found: StoredKey | None) -> bool:
    return found is not None


class KeyCache:
    """Key rows ``read`` from the store, each for at most ``ttl`` seconds, at most
    ``max_keys``; a key with no row is not kept."""

    def __init__(
        self,
        read: Read,
        *,
        ttl: float = TTL,
        max_keys: int = MAX_KEYS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._rows: KeyedCache[str, StoredKey | None, str] = KeyedCache(
            read, user_of=_own, ttl=ttl, max_entries=max_keys, keep=_exists, clock=clock
        )

    @property
    def ttl(self) -> float:
        """Seconds a row is used after its read was sent."""
        return self._rows.ttl

    @property
    def max_keys(self) -> int:
        """Rows held at most."""
        return self._rows.max_entries

    @property
    def reads(self) -> int:
        """Rows read from the store (cache misses), for tests and measurements."""
        return self._rows.reads

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, key_id: object) -> bool:
        """Whether a row of ``key_id`` is held (fresh or not)."""
        return key_id in self._rows

    async def authenticate(self, presented: str, now: datetime) -> ApiKeyRecord | None:
        """The record of ``presented`` when it is a live key, else None (one answer for every
        way a key can be wrong)."""
        parsed = apikeys.parse(presented)
        key_id, secret = parsed if parsed else ("", presented)
        found = await self.lookup(key_id) if parsed else None
        # Hash and compare even without a row, so every refusal costs about the same.
        if not apikeys.verify(secret, found.secret_hash if found else _NO_HASH) or found is None:
            return None
        return found.record if found.record.live(now) else None

    async def lookup(self, key_id: str) -> StoredKey | None:
        """The row of ``key_id``: cached when read less than ``ttl`` seconds ago, else read
        (once for the requests that ask meanwhile)."""
        return await self._rows.get(key_id)

    def forget(self, key_ids: Iterable[str]) -> None:
        """Drop these keys: their next use reads the store (a read in flight is not joined,
        nor kept)."""
        self._rows.forget(key_ids)

    def hear(self, body: bytes) -> None:
        """An announcement on the settings exchange: drop the keys it revokes (a settings
        nudge revokes none)."""
        self.forget(revoked_in(body))


def revocation(key_ids: Iterable[str]) -> bytes:
    """The announcement that ``key_ids`` were revoked (ids only: never a secret or digest)."""
    return orjson.dumps({_FIELD: sorted(key_ids)})


def revoked_in(body: bytes) -> tuple[str, ...]:
    """The key ids an announcement revokes; none for any other announcement."""
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError:
        return ()
    ids = message.get(_FIELD) if isinstance(message, dict) else None
    if not isinstance(ids, list):
        return ()
    return tuple(i for i in ids if isinstance(i, str))


class Announcer(Protocol):
    """What publishes on the settings fanout exchange (``shared.infra.broker.Broker``)."""

    async def announce(self, body: bytes) -> None: ...


@dataclass(frozen=True, slots=True)
class Revocations:
    """Tells every process (this one's cache at once) that keys were revoked in the store."""

    broker: Announcer
    cache: KeyCache | None = None

    async def announce(self, key_ids: Iterable[str]) -> bool:
        """Call after the store's write. False when the broadcast could not be sent: every
        process still refuses the keys within :data:`TTL` of the write."""
        ids = tuple(key_ids)
        if not ids:
            return True
        if self.cache is not None:
            self.cache.forget(ids)
        try:
            await self.broker.announce(revocation(ids))
        except DependencyUnavailable as exc:
            log.warning(
                "keys revoked but not announced (refused everywhere within %gs): %s", TTL, exc
            )
            return False
        return True
