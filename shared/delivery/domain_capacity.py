"""Capacity with penalty per sending domain: how many recipients mail from a domain may reach
today, so a new domain warms up and a domain whose mail bounces or draws complaints slows down
before mailbox providers throttle or block it.

The capacity is a pure function of the domain's last :data:`HISTORY_DAYS` days
(:func:`capacity`): a new domain starts at ``initial`` recipients a day; each day that used at
least :data:`USED_SHARE` of its capacity with hard-bounce and complaint rates under the limits
doubles it (:data:`GROWTH`); each day over a limit halves it (:data:`PENALTY`), down to a tenth
of ``initial``. Today's rates count too once :data:`MIN_SAMPLE` recipients went out: a domain
bouncing heavily now is slowed now, not tomorrow.

The consumers take a chunk's recipients from today's count before calling a provider
(:class:`CapacityGate`); a chunk that would start over the capacity is not sent: it is held
(``shared.core.errors.CapacityHeld``), recorded on its recipients with the reason, and tried again
from a delay queue, never dropped. A chunk that starts under the capacity goes whole (chunks are
not split), so a day may end up to one chunk over. The webhook service adds each delivery, hard
bounce and complaint to the day it was reported (:meth:`DomainVolumes.outcome`).

:class:`DomainVolumes` owns ``domain_volume`` (counters: a chunk taken and then refused by its
provider is given back; one counted by a process that died before calling stays counted: the
estimate errs on the side of sending less). Nothing here raises to the send path: when
Cassandra cannot be asked, the chunk goes ahead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Final, Protocol

from shared.core.errors import DependencyUnavailable
from shared.infra.db import Database

log = logging.getLogger(__name__)

#: Days of history a capacity is derived from (a domain quiet for longer warms up again, as
#: mailbox providers forget a sender's reputation).
HISTORY_DAYS: Final = 30
#: A clean day that used this share of its capacity doubles it.
USED_SHARE: Final = 0.5
GROWTH: Final = 2.0
#: A day over the bounce or complaint limit multiplies the capacity by this.
PENALTY: Final = 0.5
#: Recipients sent before a day's rates are judged.
MIN_SAMPLE: Final = 100
#: Seconds a domain's capacity is reused before it is derived again.
CACHE_SECONDS: Final = 5.0
OUTCOMES: Final = ("delivered", "bounced", "complained")


@dataclass(frozen=True, slots=True)
class CapacityRules:
    """The live settings ``capacity.*``."""

    enabled: bool = False
    initial: int = 1000
    """Recipients a day for a domain without history."""
    max_bounce_rate: float = 0.05
    max_complaint_rate: float = 0.003

    @property
    def floor(self) -> int:
        return max(1, self.initial // 10)


@dataclass(frozen=True, slots=True)
class DayVolume:
    sent: int = 0
    delivered: int = 0
    bounced: int = 0
    complained: int = 0


@dataclass(frozen=True, slots=True)
class Capacity:
    limit: int
    """Recipients the domain may be sent to today."""
    state: str
    """``new``, ``warming_up`` or ``penalised``."""
    why: str


def judge(volume: DayVolume, rules: CapacityRules) -> str | None:
    """Why a day's rates are over the limits (None when they are not, or too few were sent
    to tell)."""
    if volume.sent < MIN_SAMPLE:
        return None
    bounce, complaint = volume.bounced / volume.sent, volume.complained / volume.sent
    if bounce > rules.max_bounce_rate:
        return f"hard-bounce rate {bounce:.1%} over {rules.max_bounce_rate:.1%}"
    if complaint > rules.max_complaint_rate:
        return f"complaint rate {complaint:.2%} over {rules.max_complaint_rate:.2%}"
    return None


def capacity(history: Mapping[date, DayVolume], today: date, rules: CapacityRules) -> Capacity:
    """Today's capacity of a domain whose recent days were ``history`` (today's included)."""
    limit = float(rules.initial)
    state, why = "new", f"a new domain starts at {rules.initial:,} a day"
    start = today - timedelta(days=HISTORY_DAYS)
    for day in sorted(d for d in history if start <= d < today):
        volume = history[day]
        bad = judge(volume, rules)
        if bad is not None:
            limit = max(float(rules.floor), limit * PENALTY)
            state, why = "penalised", f"{bad} on {day.isoformat()}"
        elif volume.sent >= limit * USED_SHARE:
            limit *= GROWTH
            state, why = "warming_up", f"grows with clean delivery (last on {day.isoformat()})"
    bad_today = judge(history.get(today, DayVolume()), rules)
    if bad_today is not None:
        limit = max(float(rules.floor), limit * PENALTY)
        state, why = "penalised", f"{bad_today} today"
    return Capacity(int(limit), state, why)


def renews_in(now: datetime) -> float:
    """Seconds until the next UTC day, when today's count starts again."""
    tomorrow = datetime.combine(now.astimezone(UTC).date() + timedelta(days=1), datetime.min.time())
    return (tomorrow.replace(tzinfo=UTC) - now).total_seconds()


def held_reason(domain: str, sent: int, cap: Capacity) -> str:
    return (
        f"{domain} reached today's sending capacity ({sent:,} of {cap.limit:,} recipients; "
        f"{cap.why}): held, not dropped; it goes out as capacity allows (renews 00:00 UTC)"
    )


class Volumes(Protocol):
    """``domain_volume``: :class:`DomainVolumes`, or its in-memory twin in tests."""

    async def take(self, domain: str, day: date, recipients: int) -> int: ...
    async def give_back(self, domain: str, day: date, recipients: int) -> None: ...
    async def outcome(self, domain: str, day: date, kind: str) -> None: ...
    async def history(self, domain: str, today: date) -> dict[date, DayVolume]: ...


class DomainVolumes:
    """The ``domain_volume`` table (its only writer)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def take(self, domain: str, day: date, recipients: int) -> int:
        """Count ``recipients`` as sent today; the day's count after (others' included)."""
        await self._db.execute(
            "UPDATE domain_volume SET sent = sent + ? WHERE domain = ? AND day = ?",
            (recipients, domain, day),
        )
        row = await self._db.one(
            "SELECT sent FROM domain_volume WHERE domain = ? AND day = ?", (domain, day)
        )
        return int(row["sent"] or 0) if row else recipients

    async def give_back(self, domain: str, day: date, recipients: int) -> None:
        await self._db.execute(
            "UPDATE domain_volume SET sent = sent - ? WHERE domain = ? AND day = ?",
            (recipients, domain, day),
        )

    async def outcome(self, domain: str, day: date, kind: str) -> None:
        """Count one reported ``delivered``, ``bounced`` (hard) or ``complained``."""
        if kind not in OUTCOMES:
            raise ValueError(f"not a counted outcome: {kind}")
        await self._db.execute(
            f"UPDATE domain_volume SET {kind} = {kind} + 1 WHERE domain = ? AND day = ?",  # noqa: S608 - a fixed name
            (domain, day),
        )

    async def history(self, domain: str, today: date) -> dict[date, DayVolume]:
        rows = await self._db.rows(
            "SELECT day, sent, delivered, bounced, complained FROM domain_volume "
            "WHERE domain = ? AND day >= ? AND day <= ?",
            (domain, today - timedelta(days=HISTORY_DAYS), today),
        )
        return {
            _date(r["day"]): DayVolume(
                int(r["sent"] or 0),
                int(r["delivered"] or 0),
                int(r["bounced"] or 0),
                int(r["complained"] or 0),
            )
            for r in rows
        }


def _date(value: object) -> date:
    """A Cassandra ``date`` as the driver returns it (its own Date type, or a date)."""
    if isinstance(value, date):
        return value
    return date.fromisoformat(str(value))


@dataclass(frozen=True, slots=True)
class Held:
    reason: str
    wait: float
    """Seconds until capacity renews."""


OnHeld = Callable[[str, Capacity, int], Awaitable[None]]


async def _nothing(domain: str, cap: Capacity, sent: int) -> None:
    return None


@dataclass
class CapacityGate:
    """Admits chunks against their sending domain's capacity, for one consumer process
    (the rules in force, a live setting, come with each call)."""

    volumes: Volumes | None
    on_held: OnHeld = _nothing
    """Called when a chunk is held (the consumers raise the ``capacity`` alert)."""
    _known: dict[str, tuple[float, date, CapacityRules, Capacity]] = field(
        default_factory=dict, repr=False
    )

    async def admit(
        self, domain: str, recipients: int, now: datetime, rules: CapacityRules
    ) -> Held | None:
        """Take ``recipients`` from ``domain``'s capacity today under ``rules``: None when
        they may go, else why they are held. Never raises."""
        if not rules.enabled or self.volumes is None or recipients <= 0:
            return None
        today = now.astimezone(UTC).date()
        try:
            cap = await self.capacity(domain, today, rules)
            sent = await self.volumes.take(domain, today, recipients)
            before = sent - recipients
            if before < cap.limit:
                return None
            await self.volumes.give_back(domain, today, recipients)
        except DependencyUnavailable as exc:
            log.warning("capacity of %s not checked (the chunk goes): %s", domain, exc)
            return None
        await self.on_held(domain, cap, before)
        return Held(held_reason(domain, before, cap), renews_in(now))

    async def release(
        self, domain: str, recipients: int, now: datetime, rules: CapacityRules
    ) -> None:
        """Give back what :meth:`admit` took for a call the provider refused (``rules``: the
        ones it was admitted under). Never raises."""
        if not rules.enabled or self.volumes is None or recipients <= 0:
            return
        try:
            await self.volumes.give_back(domain, now.astimezone(UTC).date(), recipients)
        except DependencyUnavailable as exc:
            log.warning("capacity of %s not given back: %s", domain, exc)

    async def capacity(self, domain: str, today: date, rules: CapacityRules) -> Capacity:
        """The domain's capacity today under ``rules``, derived at most every CACHE_SECONDS
        per process (and again when the rules changed)."""
        known = self._known.get(domain)
        if (
            known is not None
            and known[1] == today
            and known[2] == rules
            and time.monotonic() - known[0] < CACHE_SECONDS
        ):
            return known[3]
        assert self.volumes is not None  # noqa: S101 - admit checks it first
        cap = capacity(await self.volumes.history(domain, today), today, rules)
        self._known[domain] = (time.monotonic(), today, rules, cap)
        if len(self._known) > 10_000:
            self._known.pop(next(iter(self._known)))
        return cap
