"""The shared rate limiter (``services.consumers.provider_rates``) against real Cassandra, with
the interleavings a loaded machine makes: a caller whose read of the counters comes back late
moves its slot to the slice it is in and judges it on counts read after that move, so two
callers never both take the last slot of a second (as CI once measured: 11 slots granted in a
second at a limit of 8, three consumer processes on a loaded machine)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from services.consumers.provider_rates import SLICE, ProviderLimiter, in_window, slice_start
from shared.infra.db import Database, Row, utc
from tests.conftest import unique


class HeldAfterFirstRead(Database):
    """The real database, except that its first read of the counters is held, answered, until
    the test lets it go: the caller's process paused between the answer and its judgement."""

    def __init__(self, db: Database) -> None:
        super().__init__(db.cluster, db.session, db.keyspace)
        self.answered = asyncio.Event()
        self.go_on = asyncio.Event()
        self._held = False

    async def rows(self, query: Any, params: Any = None, **kw: Any) -> list[Row]:
        answer = await super().rows(query, params, **kw)
        if not self._held and "provider_slices" in str(query):
            self._held = True
            self.answered.set()
            await self.go_on.wait()
        return answer


async def _counted(db: Database, scope: str, at: datetime) -> dict[datetime, int]:
    rows = await db.rows(
        "SELECT slice, calls FROM provider_slices WHERE scope = ? AND provider = ? AND day = ?",
        (scope, "sg", at.date()),
    )
    return {utc(r["slice"]): int(r["calls"] or 0) for r in rows}


async def test_a_caller_whose_counts_came_back_late_sees_the_slots_taken_meanwhile(
    db: Database,
) -> None:
    """One call a second allowed. Caller Y counts its slot, reads, and is paused 1.2 s before
    it judges; meanwhile X takes a slot in the slice Y will move to, reading counts in which
    Y's old slot is already out of X's second. Exactly one of the two is granted."""
    scope = unique("rates")
    start = slice_start(datetime.now(UTC)) - timedelta(seconds=5)
    late = start + timedelta(seconds=1.25)
    y_now, x_now = [start + timedelta(seconds=0.05)], [late]
    held = HeldAfterFirstRead(db)
    y = ProviderLimiter(held, scope, clock=lambda: y_now[0])
    x = ProviderLimiter(db, scope, clock=lambda: x_now[0])

    y_asks = asyncio.create_task(y.acquire("sg", y_now[0], 1))
    await asyncio.wait_for(held.answered.wait(), 30)
    x_answer = await x.acquire("sg", x_now[0], 1)
    y_now[0] = late
    held.go_on.set()
    y_answer = await y_asks

    granted = [who for who, answer in (("x", x_answer), ("y", y_answer)) if answer is None]
    assert len(granted) == 1, f"granted: {granted}"
    counted = await _counted(db, scope, start)
    assert in_window(counted, late + timedelta(seconds=SLICE)) == 1
