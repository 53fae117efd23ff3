"""In-memory twins of the acceptance side's other tables: the outbox
(:class:`shared.outbox.Outbox`) and the daily recipient quota with its refunds
(:class:`shared.ratelimit.RecipientQuota`).

They share a :class:`~tests.fakes.stores.FakeCassandra` with the batch twin, so a batch's
outbox row can go in the same request as the batch (``Outbox.statement`` answers a
:data:`~tests.fakes.stores.Write`), and its fault points (``outbox.*``, ``quota.*``). The
quota keeps Cassandra's semantics the store relies on: the counter adds up whatever is added
(a repeated increment counts twice), a refund is a row per batch (a repeat rewrites it), and
the day is the UTC day of the instant given (a refund's, its batch's).
``tests/contracts/test_acceptance_stores.py`` runs one suite over these twins and the real
stores.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from datetime import UTC, date, datetime
from functools import partial

from shared.outbox import Outbox
from shared.precedence import accepted_at
from shared.ratelimit import Verdict, over_limit, seconds_until_midnight
from tests.fakes.stores import FakeCassandra, Write


class FakeOutbox:
    """Twin of :class:`shared.outbox.Outbox`: rows by (namespace, minute, shard)."""

    def __init__(self, db: FakeCassandra, namespace: str = "ns") -> None:
        self.db = db
        self.namespace = namespace
        self.rows: dict[tuple[str, datetime, int], dict[uuid.UUID, bool]] = defaultdict(dict)
        """(namespace, minute, shard) -> batch -> published."""

    bucket = staticmethod(Outbox.bucket)

    def _put(self, batch_id: uuid.UUID, published: bool) -> None:
        self.rows[(self.namespace, *Outbox.bucket(batch_id))][batch_id] = published

    async def statement(self, batch_id: uuid.UUID, user_id: uuid.UUID) -> Write:
        return partial(self._put, batch_id, False)

    async def add(self, batch_id: uuid.UUID, user_id: uuid.UUID) -> None:
        failure = await self.db._before("outbox.add")
        self._put(batch_id, False)
        self.db._after(failure)

    async def done(self, batch_id: uuid.UUID) -> None:
        failure = await self.db._before("outbox.done")
        self._put(batch_id, True)
        self.db._after(failure)

    async def unpublished(self, minute: datetime, shard: int) -> list[uuid.UUID]:
        self.db._after(await self.db._before("outbox.unpublished"))
        rows = self.rows.get((self.namespace, minute, shard), {})
        return sorted((b for b, published in rows.items() if not published), key=_time_order)

    def pending(self) -> set[uuid.UUID]:
        """Every batch whose row is not marked published (what the relay still looks at)."""
        return {b for rows in self.rows.values() for b, published in rows.items() if not published}


def _time_order(batch_id: uuid.UUID) -> tuple[int, bytes]:
    return batch_id.time, batch_id.bytes


class FakeQuota:
    """Twin of :class:`shared.ratelimit.RecipientQuota`: the counter per (user, day) and the
    refund rows per (user, day, batch)."""

    def __init__(self, db: FakeCassandra, daily_limit: int = 1000) -> None:
        self.db = db
        self.daily_limit = daily_limit
        self.counters: dict[tuple[uuid.UUID, date], int] = defaultdict(int)
        self.refunds: dict[tuple[uuid.UUID, date], dict[uuid.UUID, int]] = defaultdict(dict)

    async def consume(
        self, user_id: uuid.UUID, recipients: int, *, now: datetime | None = None
    ) -> tuple[Verdict, date]:
        now = self.db.now() if now is None else now
        day = now.astimezone(UTC).date()
        wait = seconds_until_midnight(now)
        if recipients > self.daily_limit:
            return Verdict(False, wait), day
        failure = await self.db._before("quota.consume")
        self.counters[(user_id, day)] += recipients
        used = self.counters[(user_id, day)]
        if over_limit(used, self.daily_limit) and over_limit(
            used - self._refunded(user_id, day), self.daily_limit
        ):
            self.counters[(user_id, day)] -= recipients
            self.db._after(failure)
            return Verdict(False, wait), day
        self.db._after(failure)
        return Verdict(True), day

    async def refund(self, user_id: uuid.UUID, batch_id: uuid.UUID, recipients: int) -> None:
        failure = await self.db._before("quota.refund")
        self.refunds[(user_id, accepted_at(batch_id).date())][batch_id] = recipients
        self.db._after(failure)

    async def used(self, user_id: uuid.UUID, day: date) -> int:
        self.db._after(await self.db._before("quota.used"))
        return self.counters[(user_id, day)] - self._refunded(user_id, day)

    def _refunded(self, user_id: uuid.UUID, day: date) -> int:
        return sum(self.refunds.get((user_id, day), {}).values())
