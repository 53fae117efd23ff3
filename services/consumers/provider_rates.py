"""Client-side rate limits per provider, shared by every consumer process.

A provider's limit (requests per second, a live setting) holds for all processes together:
each call first takes a slot in the current :data:`SLICE`-second slice's counter in Cassandra
(``provider_slices``), then reads the slices of the last second back. The window counts every
slice that overlaps the second ending now, the oldest one whole (:func:`in_window`), so the
estimate errs high and a steady flood gets within one slice's share (10 %) of the limit. A
slot is moved to the current slice when the counts come back after its slice ended (a call
counted earlier than it is made would leave the window too soon) and judged on counts read
again after the move, and a margin
(:data:`MARGIN`) is kept for the time between the slot and the request's arrival. Measured
with three real processes and the provider in a process of its own: without both, SendGrid
saw 26 calls in a second at a limit of 20; with them, 19 to 22.

Over the limit, the call is not made: the caller spills the work over to the next provider,
or, when every provider is full, lets it wait in a delay queue. A provider's ``429`` with
``Retry-After`` / ``X-RateLimit-Reset`` blocks it for every process for that long
(``provider_blocks``).

Taking a slot is increment-then-read, and a slot refused is given back: while it is counted,
others may be refused too (the estimate errs on the safe side: fewer calls, never more). The
limiter never raises: when Cassandra cannot be asked the call goes ahead (the provider's own
429 still protects us).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

from shared.core.errors import DependencyUnavailable
from shared.infra.db import Database, utc

log = logging.getLogger(__name__)

#: Seconds per counter slice (a tenth of the window: the estimate's granularity).
SLICE = 0.1
#: Share of the limit kept free for the time between taking a slot and the request reaching
#: the provider (event-loop and network jitter bunch requests that were taken apart).
MARGIN = 0.05
#: Times a slot is moved to the current slice before it is judged anyway.
MAX_RESTAMPS = 3
_SLICE = timedelta(seconds=SLICE)
_WINDOW = timedelta(seconds=1)


def slice_start(at: datetime) -> datetime:
    """The start of the slice ``at`` falls in."""
    return at.replace(microsecond=at.microsecond // 100_000 * 100_000)


def in_window(slices: Mapping[datetime, int], now: datetime) -> int:
    """Calls in the slices that overlap the second ending ``now`` (the oldest whole)."""
    return sum(calls for start, calls in slices.items() if start + _SLICE > now - _WINDOW)


def wait_for_room(slices: Mapping[datetime, int], now: datetime, limit: float) -> float:
    """Seconds until the window has room for one more call if nothing else is sent: until
    enough of the oldest slices have left it."""
    total = in_window(slices, now)
    for start in sorted(s for s in slices if s + _SLICE > now - _WINDOW):
        if total + 1 <= limit:
            break
        total -= slices[start]
        leaves = start + _SLICE + _WINDOW
        if total + 1 <= limit:
            return max(0.05, (leaves - now).total_seconds())
    return 0.05


@dataclass
class ProviderLimiter:
    """The shared limits of this deployment (``scope``: its exchange name)."""

    db: Database | None
    scope: str
    _blocked: dict[str, tuple[datetime, datetime]] = field(default_factory=dict)
    """Per provider: (blocked until, when this process last read it)."""
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    """The time a slot is stamped and judged at (the caller's ``now`` may be stale by then)."""

    async def acquire(self, provider: str, now: datetime, limit: float) -> float | None:
        """Take a slot for one call now under ``limit`` requests per second (the live
        setting in force; 0: no limit): None when granted, else seconds to wait."""
        try:
            until = await self._blocked_until(provider, now)
            if until is not None and until > now:
                return max(0.05, (until - now).total_seconds())
            if limit <= 0 or self.db is None:
                return None
            return await self._take(provider, limit)
        except DependencyUnavailable as exc:
            log.warning("rate limit of %s not checked (sending anyway): %s", provider, exc)
            return None

    async def _take(self, provider: str, limit: float) -> float | None:
        """Count a slot in the current slice, read the window and judge it.

        A call must be counted in the slice it is made in: one counted earlier would leave
        the window while the call is still in it, and let others over-fill it (measured: a
        busy process granted slots 180 ms after counting them). So when the counts come back
        after the slot's slice has ended, the slot is moved to the current one (counted there
        before it leaves the old one, so that others always see it) and the counts are read
        again. A slot is judged only on counts read after it reached its slice, over the
        window ending with that slice: of any callers whose slots share a second, the last to
        read sees every other's, so together they never take more than the limit. (Judged on
        the counts read before a move, a caller paused past a second granted a slot that
        another, which no longer saw its old one, had just taken: measured with three
        processes on a loaded machine, 11 slots in a second at a limit of 8.)
        """
        mine = slice_start(self.clock())
        await self._count(provider, mine, +1)
        for moves in range(MAX_RESTAMPS + 1):
            slices = await self._read(provider, mine)
            now = self.clock()
            if now < mine + _SLICE or moves == MAX_RESTAMPS:
                break
            stale, mine = mine, slice_start(now)
            await self._count(provider, mine, +1)
            await self._count(provider, stale, -1)
        # Ours, whatever the read saw; the calls before ours must leave room for it.
        slices[mine] = max(1, slices.get(mine, 0)) - 1
        room = max(1.0, limit * (1 - MARGIN))
        if in_window(slices, mine) + 1 <= room:
            return None
        await self._give_back(provider, mine)
        return wait_for_room(slices, now, room)

    async def _read(self, provider: str, mine: datetime) -> dict[datetime, int]:
        """The counts of the slices from the window's oldest (for a slot in ``mine``) on."""
        db = self.db
        assert db is not None  # noqa: S101 - acquire checks it
        oldest = slice_start(mine - _WINDOW)
        rows = await db.rows(
            "SELECT slice, calls FROM provider_slices WHERE scope = ? AND provider = ? "
            "AND day IN ? AND slice >= ?",
            (self.scope, provider, sorted({oldest.date(), mine.date()}), oldest),
        )
        return {utc(r["slice"]): int(r["calls"] or 0) for r in rows}

    async def _count(self, provider: str, at: datetime, delta: int) -> None:
        await self.db.execute(  # type: ignore[union-attr]
            "UPDATE provider_slices SET calls = calls + ? "
            "WHERE scope = ? AND provider = ? AND day = ? AND slice = ?",
            (delta, self.scope, provider, at.date(), at),
        )

    async def _give_back(self, provider: str, mine: datetime) -> None:
        """Return a slot refused: the counters count calls made, so that callers kept waiting
        do not keep the window full by asking."""
        try:
            await self._count(provider, mine, -1)
        except DependencyUnavailable as exc:
            log.warning("a refused slot of %s was not given back: %s", provider, exc)

    async def forget(self, provider: str, day: date) -> None:
        """Drop a past day's slices (only the last second is ever read)."""
        if self.db is not None:
            await self.db.execute(
                "DELETE FROM provider_slices WHERE scope = ? AND provider = ? AND day = ?",
                (self.scope, provider, day),
                idempotent=True,
            )

    async def block(self, provider: str, now: datetime, seconds: float) -> None:
        """The provider said it is full for ``seconds``: every process holds off."""
        until = now + timedelta(seconds=min(seconds, 3600))
        self._blocked[provider] = (until, now)
        if self.db is None:
            return
        try:
            await self.db.execute(
                "INSERT INTO provider_blocks (scope, provider, until) VALUES (?, ?, ?) USING TTL ?",
                (self.scope, provider, until, int(seconds) + 60),
                idempotent=True,
            )
        except DependencyUnavailable as exc:
            log.warning("could not share %s's block: %s", provider, exc)

    async def _blocked_until(self, provider: str, now: datetime) -> datetime | None:
        """The provider's block, read at most once a second per process."""
        cached = self._blocked.get(provider)
        if cached is not None and (now - cached[1]).total_seconds() < 1.0:
            return cached[0]
        if self.db is None:
            return cached[0] if cached else None
        row = await self.db.one(
            "SELECT until FROM provider_blocks WHERE scope = ? AND provider = ?",
            (self.scope, provider),
        )
        until = utc(row["until"]) if row and row["until"] else datetime.min.replace(tzinfo=UTC)
        self._blocked[provider] = (until, now)
        return until
