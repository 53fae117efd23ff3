"""The stats roll-up loop of a consumer process: :meth:`shared.delivery.stats.StatsStore.roll_due`
pass after pass while buckets are marked changed, and nothing while none is.

Any process may mark a bucket (the API with a batch's ``queued`` row, the consumers with
outcomes, the webhooks with events), and the marks are in Cassandra, so the writers tell the
roll-ups: a wake-up on the settings fanout at a process's first mark and at most one per
:data:`~shared.delivery.stats.ROLL_EVERY` after it (``shared.delivery.stats.tell_rollups``). A
roll-up passes every ``ROLL_EVERY`` while its last pass found marks or while a wake-up it heard is
less than :data:`LINGER` old (a writer's next wake-up may come ``ROLL_EVERY`` later, and a mark
lands after the wake-up announcing it); otherwise it waits for a wake-up, or :data:`IDLE_EVERY`
should one be lost (the broker unreachable). Idle, it reads nothing: the 8 partitions of a
pass every 10 s were the consumers' largest idle read (issue 34: a quiet idle).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final

from shared.core.errors import DependencyUnavailable
from shared.delivery.stats import ROLL_EVERY, Stats
from shared.infra.leases import STATS_WAKE, Linger, next_period, woken

log = logging.getLogger(__name__)

#: Seconds between passes while there is work.
PASS_EVERY: Final = ROLL_EVERY.total_seconds()
#: Seconds a roll-up keeps passing after a wake-up it heard.
LINGER: Final = 2 * PASS_EVERY
#: Seconds an idle roll-up waits for a wake-up before looking anyway.
IDLE_EVERY: Final = 60.0


def next_wait(now: float, awake_until: float, marks_seen: int) -> float:
    """Seconds until the next pass (pure): :data:`PASS_EVERY` while the last pass found marks
    or a wake-up is recent, else :data:`IDLE_EVERY`."""
    return next_period(
        now, awake_until, busy=bool(marks_seen), busy_every=PASS_EVERY, idle_every=IDLE_EVERY
    )


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class RollUp:
    stats: Stats
    clock: Callable[[], float] = time.monotonic
    """Monotonic seconds, for the wake-ups' linger (tests move it)."""
    now: Callable[[], datetime] = _utcnow
    linger: Linger = field(init=False)
    """How it waits between passes (busy for :data:`LINGER` after a wake-up)."""

    def __post_init__(self) -> None:
        self.linger = Linger(PASS_EVERY, IDLE_EVERY, self.clock)
        # Marks made before it started are found by its first passes.
        self.linger.stay_awake(LINGER)

    def heard(self, body: bytes) -> None:
        """An announcement: a writer's wake-up keeps the passes coming, and ends an idle
        wait (a busy one is not cut short: the passes stay ``PASS_EVERY`` apart)."""
        if woken(body) == STATS_WAKE:
            self.linger.stay_awake(LINGER)

    def next_in(self) -> float:
        return self.linger.next_in(busy=bool(self.stats.marks_seen))

    async def pass_once(self) -> int:
        """One pass; the buckets it recounted (an outage stops the pass, not the loop)."""
        try:
            return await self.stats.roll_due(self.now())
        except DependencyUnavailable as exc:
            log.warning("stats roll-up pass failed: %s", exc)
            return 0

    async def run(self) -> None:
        """Pass after pass until cancelled. Idempotent (every consumer process runs one)."""
        while True:
            await self.pass_once()
            await self.linger.wait(busy=bool(self.stats.marks_seen))
