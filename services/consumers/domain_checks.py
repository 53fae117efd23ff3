"""The periodic look-ups of verified sending domains' TXT records (``shared.accounts.domain_checks``
decides what each finds means).

One consumer process of many checks at a time (the holder of a lease, as the scheduler's).
A pass scans ``sending_domains`` and looks up, through the DNS-over-HTTPS resolver
(``SAFEDELIVR_API_DNS_URL``), the record of each verified domain whose check is due, a few at
a time; each outcome is written only onto the domain as the pass read it (a conditional
write: a domain its owner verified again, removed or added again meanwhile is left as they
made it). A pass that dies part-way leaves the rest due for the next one; a look-up that
cannot be made (the resolver down) is tried again by the next pass and decides nothing; a
pass that loses the lease stops.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final, Protocol

from shared.accounts import domains
from shared.accounts.domain_checks import CheckRules, Outcome, due, judge
from shared.accounts.domains import Domains, SendingDomain
from shared.core.errors import DependencyUnavailable
from shared.infra.leases import Lease, LeaseRows, keep_running
from shared.infra.user_cache import UserChanges

log = logging.getLogger(__name__)

#: Seconds between two passes (each scans the table; at most this late after a domain's time).
PASS_EVERY: Final = 300.0
#: Seconds a lease lasts without renewal.
LEASE_SECONDS: Final = 60
#: Look-ups in flight at once.
CONCURRENCY: Final = 8


class TxtResolver(Protocol):
    async def txt(self, name: str) -> list[str]: ...


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Tally:
    """What one pass did."""

    looked_up: int = 0
    seen: int = 0
    missing: int = 0
    unverified: int = 0
    unanswered: int = 0


@dataclass
class DomainChecker:
    store: Domains
    resolver: TxtResolver
    rules: CheckRules
    leases: LeaseRows
    """Where the checker's lease is kept."""
    owner: uuid.UUID = field(default_factory=uuid.uuid4)
    clock: Callable[[], datetime] = _now
    changes: UserChanges | None = None
    """Told when a domain is unverified, so no API process keeps it as verified
    (``shared.infra.user_cache``)."""

    def __post_init__(self) -> None:
        self.lease = Lease(self.leases, LEASE_SECONDS, self.owner)

    async def run(self) -> None:
        every = min(PASS_EVERY, self.rules.every.total_seconds())
        await keep_running(self.pass_once, every, self.lease, "domain checks")

    async def pass_once(self) -> Tally:
        """One pass over every domain (nothing without the lease)."""
        tally = Tally()
        if not await self.lease.held():
            return tally
        now = self.clock()
        waiting: list[tuple[uuid.UUID, SendingDomain]] = []
        async for user_id, domain in self.store.every():
            if due(domain, now, self.rules):
                waiting.append((user_id, domain))
            if len(waiting) >= CONCURRENCY:
                await self._check(waiting, now, tally)
                waiting = []
                if not await self.lease.held():
                    return tally  # another checker took over: it does the rest
        await self._check(waiting, now, tally)
        if tally.looked_up:
            log.info("domain checks: %s", tally)
        return tally

    async def _check(
        self, batch: list[tuple[uuid.UUID, SendingDomain]], now: datetime, tally: Tally
    ) -> None:
        found = await asyncio.gather(*(self.check(u, d, now) for u, d in batch))
        for outcome in found:
            tally.looked_up += 1
            if outcome is None:
                tally.unanswered += 1
            else:
                setattr(tally, outcome.kind, getattr(tally, outcome.kind) + 1)

    async def check(
        self, user_id: uuid.UUID, domain: SendingDomain, now: datetime
    ) -> Outcome | None:
        """Look ``domain`` up and record what that decides; None when nothing was decided
        (no answer, or the domain changed meanwhile)."""
        name = domains.record_name(domain.domain)
        try:
            values = await self.resolver.txt(name)
        except DependencyUnavailable as exc:
            log.warning("domain check of %s not made: %s", domain.domain, exc)
            return None
        outcome = judge(domain, domains.proven(values, domain.token), now, self.rules)
        if not await self.store.record(user_id, domain, outcome.cells()):
            return None
        if outcome.kind == "unverified" and self.changes is not None:
            await self.changes.announce([user_id])
        if outcome.kind != "seen":
            log.info("sending domain %s (user %s): %s", domain.domain, user_id, outcome.kind)
        return outcome
