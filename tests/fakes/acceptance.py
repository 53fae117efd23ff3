"""In-memory twins of what accepting a batch writes besides the batch: the outbox
(:class:`shared.outbox.Outbox`) and the daily recipient quota
(:class:`shared.ratelimit.RecipientQuota`).

They live in the tables of :class:`tests.fakes.stores.FakeCassandra` and make the round trips
the real stores make: an outbox row is written by the batch's own logged batch (its
``statement`` is applied by ``FakeBatches.write``), marked published by one write, and listed
per (minute, shard) partition; the quota is a counter, added to and read back in separate
round trips, so a counter update whose answer is lost stays counted, as in Cassandra.
``tests/contracts/test_acceptance_stores.py`` runs one suite over each twin and its real
store.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, date, datetime
from functools import partial

from shared.outbox import Outbox, minute_of
from shared.ratelimit import Verdict, over_limit, seconds_until_midnight
from tests.fakes.stores import FakeCassandra

Write = Callable[[], None]


class FakeOutbox:
    """Twin of :class:`shared.outbox.Outbox`."""

    def __init__(self, db: FakeCassandra, namespace: str) -> None:
        self.db = db
        self.namespace = namespace

    bucket = staticmethod(Outbox.bucket)

    def _key(self, batch_id: uuid.UUID) -> tuple[str, datetime, int]:
        minute, shard = self.bucket(batch_id)
        return self.namespace, minute, shard

    async def statement(self, batch_id: uuid.UUID, user_id: uuid.UUID) -> Write:
        return partial(self._put, batch_id, user_id)

    def _put(self, batch_id: uuid.UUID, user_id: uuid.UUID) -> None:
        # As the real INSERT: a repeated acceptance marks the row unpublished again.
        self.db.outbox[self._key(batch_id)][batch_id] = {"user_id": user_id, "published": False}

    async def add(self, batch_id: uuid.UUID, user_id: uuid.UUID) -> None:
        done = await self.db._before("outbox.done")
        self._put(batch_id, user_id)
        self.db._after(done)

    async def done(self, batch_id: uuid.UUID) -> None:
        done = await self.db._before("outbox.done")
        self.db.outbox[self._key(batch_id)].setdefault(batch_id, {})["published"] = True
        self.db._after(done)

    async def unpublished(self, minute: datetime, shard: int) -> list[uuid.UUID]:
        self.db._after(await self.db._before("outbox.unpublished"))
        rows = self.db.outbox.get((self.namespace, minute_of(minute), shard), {})
        return [b for b in sorted(rows, key=lambda b: b.bytes) if rows[b].get("published") is False]

    def pending(self) -> list[uuid.UUID]:
        """Every unpublished row of this namespace (for the simulator: no round trip)."""
        return [
            b
            for (namespace, _, _), rows in self.db.outbox.items()
            if namespace == self.namespace
            for b, row in rows.items()
            if row.get("published") is False
        ]


class FakeQuota:
    """Twin of :class:`shared.ratelimit.RecipientQuota`."""

    def __init__(self, db: FakeCassandra, daily_limit: int) -> None:
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
        used = await self.used(user_id, day)
        if not over_limit(used, self.daily_limit):
            return Verdict(True), day
        await self._add(user_id, day, -recipients)
        return Verdict(False, wait), day

    async def refund(self, user_id: uuid.UUID, recipients: int, day: date) -> None:
        await self._add(user_id, day, -recipients)

    async def used(self, user_id: uuid.UUID, day: date) -> int:
        self.db._after(await self.db._before("quota.read"))
        return self.db.quota.get((user_id, day), 0)

    async def _add(self, user_id: uuid.UUID, day: date, delta: int) -> None:
        done = await self.db._before("quota.add")
        self.db.quota[(user_id, day)] += delta
        self.db._after(done)
