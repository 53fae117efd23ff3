"""Client-side rate limits per provider, shared by every consumer process.

A provider's limit (requests per second, a live setting) holds for all processes together:
each call first takes a slot in the current second's counter in Cassandra
(``provider_rates``), and the estimate of the last second's rate is the sliding-window one:
the previous second's count weighted by the part of it still inside the window, plus the
current second's (:func:`estimate`). Over the limit, the call is not made: the caller spills
the work over to the next provider, or, when every provider is full, lets it wait in a delay
queue. A provider's ``429`` with ``Retry-After`` / ``X-RateLimit-Reset`` blocks it for every
process for that long (``provider_blocks``).

Taking a slot is increment-then-read, and a slot refused is given back: while it is counted,
others may be refused too (the estimate errs on the safe side: fewer calls, never more). The
limiter never raises: when Cassandra cannot be asked the call goes ahead (the provider's own
429 still protects us).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from shared.db import Database, utc
from shared.errors import DependencyUnavailable

log = logging.getLogger(__name__)


def estimate(previous: int, current: int, into: float) -> float:
    """Requests in the sliding second ending now: ``into`` (0-1) is how far the current
    second has run, so ``1 - into`` of the previous second is still inside the window."""
    return previous * (1.0 - into) + current


def wait_for_room(previous: int, current: int, into: float, limit: float) -> float:
    """Seconds until the estimate falls below ``limit`` if nothing else is sent (at least
    the rest of the current second when the current second alone is full)."""
    if current >= limit:
        return max(0.05, 1.0 - into)
    if previous <= 0:
        return 0.05
    # previous * (1 - into - t) + current < limit  =>  t > 1 - into - (limit - current) / previous
    return max(0.05, 1.0 - into - (limit - current) / previous)


@dataclass
class ProviderLimiter:
    """The shared limits of this deployment (``scope``: its exchange name)."""

    db: Database | None
    scope: str
    limits: Mapping[str, float] = field(default_factory=dict)
    """Requests per second by provider code (live settings); absent or 0: no limit."""
    _blocked: dict[str, tuple[datetime, datetime]] = field(default_factory=dict)
    """Per provider: (blocked until, when this process last read it)."""

    async def acquire(self, provider: str, now: datetime) -> float | None:
        """Take a slot for one call now: None when granted, else seconds to wait."""
        limit = self.limits.get(provider) or 0.0
        try:
            until = await self._blocked_until(provider, now)
            if until is not None and until > now:
                return max(0.05, (until - now).total_seconds())
            if limit <= 0 or self.db is None:
                return None
            second = now.replace(microsecond=0)
            before = second - timedelta(seconds=1)
            await self.db.execute(
                "UPDATE provider_rates SET calls = calls + 1 "
                "WHERE scope = ? AND provider = ? AND day = ? AND second = ?",
                (self.scope, provider, second.date(), second),
            )
            rows = await self.db.rows(
                "SELECT second, calls FROM provider_rates WHERE scope = ? AND provider = ? "
                "AND day IN (?, ?) AND second IN (?, ?)",
                (self.scope, provider, before.date(), second.date(), before, second),
            )
        except DependencyUnavailable as exc:
            log.warning("rate limit of %s not checked (sending anyway): %s", provider, exc)
            return None
        counts = {utc(r["second"]): int(r["calls"] or 0) for r in rows}
        current = counts.get(second, 1)
        previous = counts.get(before, 0)
        into = now.microsecond / 1_000_000
        # Our own slot is in ``current``: the calls before it must leave room for it.
        if estimate(previous, current - 1, into) + 1 <= limit:
            return None
        await self._give_back(provider, second)
        return wait_for_room(previous, current - 1, into, limit)

    async def _give_back(self, provider: str, second: datetime) -> None:
        """Return a slot refused: the counters count calls made, so that callers kept waiting
        do not keep the window full by asking."""
        try:
            await self.db.execute(  # type: ignore[union-attr]
                "UPDATE provider_rates SET calls = calls - 1 "
                "WHERE scope = ? AND provider = ? AND day = ? AND second = ?",
                (self.scope, provider, second.date(), second),
            )
        except DependencyUnavailable as exc:
            log.warning("a refused slot of %s was not given back: %s", provider, exc)

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
