"""In-memory twins of what accepting a batch reads and writes besides the batch: the outbox
(:class:`shared.delivery.outbox.Outbox`), the daily recipient quota with its refunds
(:class:`shared.accounts.ratelimit.RecipientQuota`), the request rate limits' windows
(:class:`shared.accounts.ratelimit.RateWindows`), recent mail for the cooldown
(:class:`services.api.cooldown.RecentMail`) and the users' preferences
(:class:`shared.accounts.preferences.PreferenceStore`).

They live in the tables of :class:`tests.fakes.stores.FakeCassandra` and make the round trips
the real stores make: an outbox row is written by the batch's own logged batch (its
``statement`` is applied by ``FakeBatches.write``), marked published by one write, and listed
per (minute, shard) partition; the quota and a rate window are counters, added to and read
back in separate round trips, so a counter update whose answer is lost stays counted, as in
Cassandra, and a refund is a row per batch (a repeat rewrites it); recent mail rows live for
their cooldown (their TTL). ``tests/contracts/test_acceptance_stores.py`` (the rate windows:
``tests/contracts/test_rate_windows.py``) runs one suite over each twin and its real store.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, date, datetime, timedelta
from functools import partial

from services.api.cooldown import LOOKUP_CHUNK, RecentSends, cooling
from shared.accounts.preferences import CACHE_SECONDS, PreferenceRows, Preferences
from shared.accounts.ratelimit import (
    Grant,
    QuotaStore,
    RateStore,
    Verdict,
    grant_of,
    over_limit,
    seconds_until_midnight,
)
from shared.core.addresses import address_key
from shared.core.batch_ids import accepted_at
from shared.delivery.outbox import Outbox, OutboxRows, minute_of
from tests.fakes.stores import FakeCassandra, Write


class FakeOutbox(OutboxRows):
    """Twin of :class:`shared.delivery.outbox.Outbox`."""

    def __init__(self, db: FakeCassandra, namespace: str = "ns") -> None:
        self.db = db
        self.namespace = namespace
        self.written: Callable[[], None] = lambda: None

    bucket = staticmethod(Outbox.bucket)

    def _key(self, batch_id: uuid.UUID) -> tuple[str, datetime, int]:
        minute, shard = self.bucket(batch_id)
        return self.namespace, minute, shard

    async def statement(self, batch_id: uuid.UUID, user_id: uuid.UUID) -> Write:
        self.written()
        return partial(self._put, batch_id, user_id)

    def _put(self, batch_id: uuid.UUID, user_id: uuid.UUID) -> None:
        # As the real INSERT: a repeated acceptance marks the row unpublished again.
        self.db.outbox[self._key(batch_id)][batch_id] = {"user_id": user_id, "published": False}

    async def add(self, batch_id: uuid.UUID, user_id: uuid.UUID) -> None:
        done = await self.db._before("outbox.add")
        self._put(batch_id, user_id)
        self.db._after(done)

    async def done(self, batch_id: uuid.UUID) -> None:
        done = await self.db._before("outbox.done")
        self._mark(batch_id)
        self.db._after(done)

    async def done_many(self, batch_ids: Iterable[uuid.UUID]) -> None:
        """As the real store: one write per partition (``outbox.done`` each), all at once."""
        parts: dict[tuple[str, datetime, int], list[uuid.UUID]] = {}
        for batch_id in batch_ids:
            parts.setdefault(self._key(batch_id), []).append(batch_id)

        async def one(ids: list[uuid.UUID]) -> None:
            done = await self.db._before("outbox.done")
            for batch_id in ids:
                self._mark(batch_id)
            self.db._after(done)

        if len(parts) == 1:  # as the real store: one partition written in the caller's task
            await one(next(iter(parts.values())))
            return
        results = await asyncio.gather(
            *(one(ids) for ids in parts.values()), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    def _mark(self, batch_id: uuid.UUID) -> None:
        self.db.outbox[self._key(batch_id)].setdefault(batch_id, {})["published"] = True

    async def unpublished(self, minute: datetime, shard: int) -> list[uuid.UUID]:
        self.db._after(await self.db._before("outbox.unpublished"))
        rows = self.db.outbox.get((self.namespace, minute_of(minute), shard), {})
        return [b for b in sorted(rows, key=lambda b: b.bytes) if rows[b].get("published") is False]

    def pending(self) -> set[uuid.UUID]:
        """Every batch whose row is not marked published (what the relay still looks at; no
        round trip: for tests and the simulator)."""
        return {
            b
            for (namespace, _, _), rows in self.db.outbox.items()
            if namespace == self.namespace
            for b, row in rows.items()
            if row.get("published") is False
        }


class FakeQuota(QuotaStore):
    """Twin of :class:`shared.accounts.ratelimit.RecipientQuota`: the counter per (user, day), added
    to and read back in separate round trips (an addition whose answer is lost stays
    counted, as in Cassandra), and the refund rows per (user, day, batch), which a repeat
    rewrites."""

    def __init__(self, db: FakeCassandra, daily_limit: int = 1000) -> None:
        self.db = db
        self.daily_limit = daily_limit

    async def consume(
        self, user_id: uuid.UUID, recipients: int, *, now: datetime | None = None
    ) -> tuple[Verdict, date]:
        now = datetime.now(UTC) if now is None else now
        day = now.astimezone(UTC).date()
        wait = seconds_until_midnight(now)
        if recipients > self.daily_limit:
            return Verdict(False, wait), day
        await self._add(user_id, day, recipients)
        self.db._after(await self.db._before("quota.read"))
        used = self.db.quota.get((user_id, day), 0)
        if not over_limit(used, self.daily_limit):
            return Verdict(True), day
        if not over_limit(used - await self._refunded(user_id, day), self.daily_limit):
            return Verdict(True), day
        await self._add(user_id, day, -recipients)
        return Verdict(False, wait), day

    async def lease(self, user_id: uuid.UUID, day: date, batch: int, want: int) -> Grant:
        await self._add(user_id, day, want)
        self.db._after(await self.db._before("quota.read"))
        used = self.db.quota.get((user_id, day), 0)
        if over_limit(used, self.daily_limit):
            used -= await self._refunded(user_id, day)
        grant = grant_of(want, batch, used, self.daily_limit)
        if grant.kept < want:
            await self._add(user_id, day, grant.kept - want)
        return grant

    async def give_back(self, user_id: uuid.UUID, day: date, recipients: int) -> None:
        await self._add(user_id, day, -recipients)

    async def refund(self, user_id: uuid.UUID, batch_id: uuid.UUID, recipients: int) -> None:
        done = await self.db._before("quota.refund")
        self.db.refunds[(user_id, accepted_at(batch_id).date())][batch_id] = recipients
        self.db._after(done)

    async def used(self, user_id: uuid.UUID, day: date) -> int:
        self.db._after(await self.db._before("quota.read"))
        charged = self.db.quota.get((user_id, day), 0)
        return charged - await self._refunded(user_id, day)

    async def _refunded(self, user_id: uuid.UUID, day: date) -> int:
        self.db._after(await self.db._before("quota.refunded"))
        return sum(self.db.refunds.get((user_id, day), {}).values())

    async def _add(self, user_id: uuid.UUID, day: date, delta: int) -> None:
        done = await self.db._before("quota.add")
        self.db.quota[(user_id, day)] += delta
        self.db._after(done)


class FakeRateWindows(RateStore):
    """Twin of :class:`shared.accounts.ratelimit.RateWindows`: a counter per (key, day, window),
    added to and read back in separate round trips (an addition whose answer is lost stays
    counted, as in Cassandra)."""

    def __init__(self, db: FakeCassandra) -> None:
        self.db = db

    async def take(self, key_id: str, day: date, index: int, slots: int) -> int:
        done = await self.db._before("rate.add")
        self.db.rate_windows[(key_id, day, index)] += slots
        self.db._after(done)
        self.db._after(await self.db._before("rate.read"))
        return max(self.db.rate_windows[(key_id, day, index)], slots)


class FakeRecentMail(RecentSends):
    """Twin of :class:`services.api.cooldown.RecentMail`: when each address was last accepted for,
    per scope, each row living for its cooldown (the real rows' TTL)."""

    def __init__(self, db: FakeCassandra) -> None:
        self.db = db

    async def cooling(
        self,
        user_id: uuid.UUID,
        emails: Iterable[str],
        scopes: Sequence[str],
        seconds: int,
        *,
        exclude: uuid.UUID | None = None,
        now: datetime | None = None,
    ) -> set[str]:
        now = now or datetime.now(UTC)
        wanted = sorted({address_key(e) for e in emails})
        found: set[str] = set()
        for i in range(0, len(wanted), LOOKUP_CHUNK):
            self.db._after(await self.db._before("recent.cooling"))
            for email in wanted[i : i + LOOKUP_CHUNK]:
                for scope in scopes:
                    row = self.db.recent.get((user_id, email, scope))
                    if row is None or row[2] <= self.db.now():
                        continue  # expired: its TTL passed
                    last_at, batch_id, _ = row
                    if batch_id != exclude and cooling(last_at, now, seconds):
                        found.add(email)
        return found

    async def record(
        self,
        user_id: uuid.UUID,
        emails: Iterable[str],
        scopes: Sequence[str],
        seconds: int,
        batch_id: uuid.UUID,
        at: datetime | None = None,
    ) -> None:
        at = at or datetime.now(UTC)
        for email in sorted({address_key(e) for e in emails}):
            for scope in scopes:
                done = await self.db._before("recent.record")
                expires = self.db.now() + timedelta(seconds=seconds)
                self.db.recent[(user_id, email, scope)] = (_ms(at), batch_id, expires)
                self.db._after(done)


class FakePreferences(PreferenceRows):
    """Twin of :class:`shared.accounts.preferences.PreferenceStore` (read through the same short
    per-process cache, so a change applies within its seconds)."""

    def __init__(self, db: FakeCassandra) -> None:
        self.db = db
        self._cache: dict[uuid.UUID, tuple[float, Preferences]] = {}

    async def get(self, user_id: uuid.UUID, *, fresh: bool = False) -> Preferences:
        now = time.monotonic()
        cached = self._cache.get(user_id)
        if cached is not None and not fresh and now - cached[0] < CACHE_SECONDS:
            return cached[1]
        self.db._after(await self.db._before("preferences.get"))
        prefs = self.db.preferences.get(user_id) or Preferences()
        self._cache[user_id] = (now, prefs)
        return prefs

    async def put(self, user_id: uuid.UUID, prefs: Preferences) -> None:
        done = await self.db._before("preferences.put")
        self.db.preferences[user_id] = prefs
        self.db._after(done)
        self._cache[user_id] = (time.monotonic(), prefs)


def _ms(value: datetime) -> datetime:
    """As Cassandra keeps a timestamp: UTC, milliseconds."""
    value = value.astimezone(UTC)
    return value.replace(microsecond=value.microsecond // 1000 * 1000)
