"""Provider health, shared by every process: scores, circuits and the order they give the chain.

Each consumer process counts its provider calls (calls, provider-side failures, latency) and
adds them every :data:`FLUSH_EVERY` seconds to 5-second windows in Cassandra counters
(``provider_windows``), so the windows hold what every process saw. From the latest windows
each process computes the same scores (pure functions below):

* **health** (0-1): one minus the sum of three exponentially weighted moving averages over the
  windows (newest weighs most), each judged only once enough was seen:

  - the error rate of calls (at least :data:`MIN_CALLS` calls);
  - the share of recipient events its webhooks reported that were its own failures: drops on
    the provider's side count whole, deferrals half (the webhook service adds these to the
    same windows; at least :data:`MIN_EVENTS` events);
  - a latency penalty: nothing up to :data:`SLOW` seconds per call, rising to
    :data:`LATENCY_WEIGHT` at :data:`VERY_SLOW`.
* **circuit**: ``open`` below ``open_below`` (skipped for new work); after ``cool_down``
  seconds ``half_open`` (a small share of new work probes it); ``closed`` again once the
  probes succeed (its health is back above ``demote_below``). These thresholds are live
  settings (:class:`HealthRules`; ``providers.health.*``).
* **order**: the running chain (the operator's order, paused providers out) with open
  circuits left out and unhealthy providers (below ``demote_below``) moved behind the
  healthy ones; a share (``probe_share``) of new work still goes first to a demoted or
  half-open provider, so that its recovery is seen.

Failures that say nothing about the provider (a request refused as invalid, a paused
provider) are not counted.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Final, Literal, Protocol, TypeVar

from shared.core.errors import DependencyUnavailable
from shared.infra.db import Database, utc
from shared.infra.leases import HEALTH_WAKE, Announcer, Notice

log = logging.getLogger(__name__)

WINDOW: Final = 5  # seconds
#: Windows looked at for a score (two minutes).
WINDOWS: Final = 24
FLUSH_EVERY: Final = 1.0
#: Seconds between two refreshes of a consumer's view of health while it may move (calls or
#: reports in the windows looked at, a circuit not closed, a write announced lately).
REFRESH_EVERY: Final = 2.0
ALPHA: Final = 0.4
#: Calls needed in the windows looked at before a provider can be judged unhealthy.
MIN_CALLS: Final = 10
DEMOTE_BELOW: Final = 0.8
OPEN_BELOW: Final = 0.5
COOL_DOWN: Final = 30.0
PROBE_SHARE: Final = 0.1


@dataclass(frozen=True, slots=True)
class HealthRules:
    """The thresholds circuits and ordering use (live settings ``providers.health.*``)."""

    open_below: float = OPEN_BELOW
    demote_below: float = DEMOTE_BELOW
    """Below it a provider goes behind the healthy ones; a half-open one closes at it."""
    cool_down: float = COOL_DOWN
    probe_share: float = PROBE_SHARE


#: Webhook-reported events needed before their failure share counts.
MIN_EVENTS: Final = 20
#: A deferral counts as this much of a provider-side drop (greylisting defers healthy mail).
DEFERRAL_WEIGHT: Final = 0.5
#: Mean seconds per call from which calls count against health, and where the penalty peaks.
SLOW: Final = 3.0
VERY_SLOW: Final = 10.0
LATENCY_WEIGHT: Final = 0.5

Circuit = Literal["closed", "open", "half_open"]


@dataclass(frozen=True, slots=True)
class Window:
    start: datetime
    calls: int
    errors: int
    latency_ms: int
    events: int = 0
    """Recipient events its webhooks reported."""
    drops: int = 0
    """Of them, drops on the provider's side."""
    deferrals: int = 0


@dataclass(frozen=True, slots=True)
class Score:
    health: float
    calls: int
    """Calls in the windows looked at."""
    latency: float | None
    """Mean seconds per call (EWMA), if any call was seen."""
    rate: float
    """Calls per second over the latest full window."""
    reported_failures: float = 0.0
    """EWMA of the share of webhook-reported events that were the provider's own failures."""


def ewma(values: Sequence[float]) -> float:
    """The exponentially weighted moving average of ``values`` (oldest first), unbiased while
    there are few of them."""
    average = 0.0
    for value in values:
        average = ALPHA * value + (1 - ALPHA) * average
    return average / (1 - (1 - ALPHA) ** len(values)) if values else 0.0


def latency_penalty(seconds: float | None) -> float:
    if seconds is None or seconds <= SLOW:
        return 0.0
    return LATENCY_WEIGHT * min(1.0, (seconds - SLOW) / (VERY_SLOW - SLOW))


def score(windows: Sequence[Window], now: datetime) -> Score:
    """The score of one provider from its windows (any order)."""
    ordered = sorted(windows, key=lambda w: w.start)
    called = [w for w in ordered if w.calls > 0]
    reported = [w for w in ordered if w.events > 0]
    calls = sum(w.calls for w in called)
    error_rate = ewma([min(w.errors, w.calls) / w.calls for w in called])
    latency = ewma([w.latency_ms / w.calls / 1000 for w in called]) if called else None
    failures = ewma(
        [min(1.0, (w.drops + DEFERRAL_WEIGHT * w.deferrals) / w.events) for w in reported]
    )
    unhealthy = 0.0
    if calls >= MIN_CALLS:
        unhealthy += error_rate + latency_penalty(latency)
    if sum(w.events for w in reported) >= MIN_EVENTS:
        unhealthy += failures
    health = max(0.0, min(1.0, 1.0 - unhealthy))
    last_full = window_start(now) - timedelta(seconds=WINDOW)
    rate = sum(w.calls for w in windows if w.start == last_full) / WINDOW
    return Score(round(health, 3), calls, latency, rate, round(failures, 3))


def failures_in_last_minute(windows: Sequence[Window], now: datetime) -> int:
    """Failed calls and provider-side drops in the windows of the last minute."""
    since = now - timedelta(seconds=60)
    return sum(w.errors + w.drops for w in windows if w.start >= since)


def window_start(at: datetime) -> datetime:
    """The start of the window ``at`` falls in."""
    seconds = int(at.timestamp()) // WINDOW * WINDOW
    return datetime.fromtimestamp(seconds, UTC)


@dataclass(frozen=True, slots=True)
class CircuitState:
    state: Circuit = "closed"
    since: datetime | None = None


def seen_since(windows: Sequence[Window], since: datetime | None) -> int:
    """Calls and reported events in the windows that began after ``since`` (the evidence a
    half-open circuit's probes brought; a window ``since`` falls in may hold older calls)."""
    if since is None:
        return 0
    return sum(w.calls + w.events for w in windows if w.start > since)


def next_circuit(
    current: CircuitState,
    health: float,
    now: datetime,
    rules: HealthRules = HealthRules(),
    *,
    probed: int = 0,
) -> CircuitState:
    """The circuit after a new score (a pure state machine). ``probed``: what
    :func:`seen_since` counts since the circuit went half-open. Without it the score is the
    one that opened the circuit, so it cannot open it again: a probe share is drawn per
    refresh, and with a cool-down of a few seconds a quiet spell would otherwise flip the
    circuit open and half-open until the bad windows aged out of the score."""
    if current.state == "closed":
        return CircuitState("open", now) if health < rules.open_below else current
    if current.state == "open":
        cooled = current.since is None or (now - current.since).total_seconds() >= rules.cool_down
        return CircuitState("half_open", now) if cooled else current
    if health >= rules.demote_below:
        return CircuitState("closed", now)
    probed_long_enough = (
        current.since is not None and (now - current.since).total_seconds() >= rules.cool_down
    )
    if health < rules.open_below and probed_long_enough and probed > 0:
        return CircuitState("open", now)  # the probes failed too
    return current


def order(
    running: Sequence[str],
    health: Mapping[str, float],
    circuits: Mapping[str, Circuit],
    draw: float,
    rules: HealthRules = HealthRules(),
) -> tuple[str, ...]:
    """The chain for new work: healthy closed providers in the operator's order, then the
    demoted and half-open ones; open circuits left out (unless every one is open). With
    ``draw`` (uniform 0-1) below the probe share, a demoted or half-open provider goes
    first."""
    usable = [c for c in running if circuits.get(c, "closed") != "open"] or list(running)
    healthy = [
        c for c in usable
        if circuits.get(c, "closed") == "closed" and health.get(c, 1.0) >= rules.demote_below
    ]  # fmt: skip
    rest = [c for c in usable if c not in healthy]
    if rest and draw < rules.probe_share:
        return (rest[0], *healthy, *rest[1:])
    return (*healthy, *rest)


# --------------------------------------------------------------------------- the table


class HealthWindows(Protocol):
    """What callers use of :class:`HealthStore` (the store, or its in-memory twin)."""

    async def add(
        self, provider: str, start: datetime, calls: int, errors: int, ms: int
    ) -> None: ...

    async def add_reported(
        self, provider: str, start: datetime, events: int, drops: int, deferrals: int
    ) -> None: ...

    async def windows(self, provider: str, now: datetime) -> list[Window]: ...

    async def forget(self, provider: str, day: date) -> None: ...

    async def set_circuit(self, provider: str, state: CircuitState, health: float) -> None: ...

    async def circuits(self) -> dict[str, CircuitState]: ...


class HealthStore:
    """The ``provider_windows`` and ``provider_circuits`` tables (their only writer), for one
    deployment's scope."""

    def __init__(self, db: Database, scope: str) -> None:
        self._db = db
        self.scope = scope
        #: Called before each write to the windows (``tell_refreshers``: the consumers'
        #: refresh loops are woken by the writers, not by a poll).
        self.written: Callable[[], None] = _nothing

    async def add(self, provider: str, start: datetime, calls: int, errors: int, ms: int) -> None:
        self.written()
        await self._db.execute(
            "UPDATE provider_windows SET calls = calls + ?, errors = errors + ?, "
            "latency_ms = latency_ms + ? WHERE scope = ? AND provider = ? AND day = ? "
            "AND window = ?",
            (calls, errors, ms, self.scope, provider, start.date(), start),
        )

    async def add_reported(
        self, provider: str, start: datetime, events: int, drops: int, deferrals: int
    ) -> None:
        """Add what the provider's webhooks reported in a window (the webhook service)."""
        self.written()
        await self._db.execute(
            "UPDATE provider_windows SET events = events + ?, drops = drops + ?, "
            "deferrals = deferrals + ? WHERE scope = ? AND provider = ? AND day = ? "
            "AND window = ?",
            (events, drops, deferrals, self.scope, provider, start.date(), start),
        )

    async def windows(self, provider: str, now: datetime) -> list[Window]:
        """The windows of the last two minutes (two days' partitions around midnight)."""
        since = window_start(now) - timedelta(seconds=WINDOW * WINDOWS)
        days: list[date] = sorted({since.date(), now.date()})
        found: list[Window] = []
        for day in days:
            rows = await self._db.rows(
                "SELECT window, calls, errors, latency_ms, events, drops, deferrals "
                "FROM provider_windows "
                "WHERE scope = ? AND provider = ? AND day = ? AND window > ?",
                (self.scope, provider, day, since),
            )
            found += [
                Window(
                    utc(r["window"]),
                    *(int(r[c] or 0) for c in ("calls", "errors", "latency_ms", "events",
                                               "drops", "deferrals")),
                )
                for r in rows
            ]  # fmt: skip
        return found

    async def forget(self, provider: str, day: date) -> None:
        """Drop a past day's windows (only the last two minutes are ever read)."""
        await self._db.execute(
            "DELETE FROM provider_windows WHERE scope = ? AND provider = ? AND day = ?",
            (self.scope, provider, day),
            idempotent=True,
        )

    async def set_circuit(self, provider: str, state: CircuitState, health: float) -> None:
        await self._db.execute(
            "INSERT INTO provider_circuits (scope, provider, state, since, health) "
            "VALUES (?, ?, ?, ?, ?)",
            (self.scope, provider, state.state, state.since, health),
            idempotent=True,
        )

    async def circuits(self) -> dict[str, CircuitState]:
        rows = await self._db.rows(
            "SELECT provider, state, since FROM provider_circuits WHERE scope = ?", (self.scope,)
        )
        found: dict[str, CircuitState] = {}
        for r in rows:
            state = r["state"]
            if state in ("closed", "open", "half_open"):
                found[str(r["provider"])] = CircuitState(state, utc(r["since"]))
        return found


def _nothing() -> None:
    return None


class Written(Protocol):
    """A store of the windows whose writes can be announced (the real one and its twin)."""

    written: Callable[[], None]


W = TypeVar("W", bound=Written)


def tell_refreshers(store: W, broker: Announcer, every: float = REFRESH_EVERY) -> W:
    """``store`` (returned) wakes every consumer's health refresh at its first write and at
    most once per ``every`` seconds after it (``shared.infra.leases.Notice``)."""
    store.written = Notice(broker, HEALTH_WAKE, every).touch
    return store


@dataclass
class Tally:
    """This process's calls not yet added to the shared windows."""

    counts: dict[tuple[str, datetime], list[int]] = field(default_factory=dict)
    first: Callable[[], None] = _nothing
    """Called when a call is counted into an empty tally (the refresh loop wakes for it)."""

    def count(self, provider: str, at: datetime, *, error: bool, seconds: float) -> None:
        if not self.counts:
            self.first()
        key = (provider, window_start(at))
        entry = self.counts.setdefault(key, [0, 0, 0])
        entry[0] += 1
        entry[1] += int(error)
        entry[2] += int(seconds * 1000)

    def take(self) -> dict[tuple[str, datetime], list[int]]:
        taken, self.counts = self.counts, {}
        return taken


#: Event kinds that report a recipient's fate at a provider (engagement is not health).
FATE_KINDS: Final = frozenset({"delivered", "bounced", "dropped", "deferred"})


@dataclass
class Reports:
    """What this webhook process was told of each provider, not yet added to the windows."""

    counts: dict[tuple[str, datetime], list[int]] = field(default_factory=dict)
    _counted: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    """Set while something counted waits to be added (the flush loop sleeps until then)."""

    def count(self, provider: str, at: datetime, kind: str, *, provider_side: bool) -> None:
        if kind not in FATE_KINDS:
            return
        entry = self.counts.setdefault((provider, window_start(at)), [0, 0, 0])
        entry[0] += 1
        entry[1] += int(kind == "dropped" and provider_side)
        entry[2] += int(kind == "deferred")
        self._counted.set()

    def take(self) -> dict[tuple[str, datetime], list[int]]:
        taken, self.counts = self.counts, {}
        return taken

    async def keep_adding(self, store: HealthWindows, every: float = FLUSH_EVERY) -> None:
        """Add what was counted to the shared windows ``every`` seconds after the first
        count of a round (what cannot be added now is added with the next round); with
        nothing counted, sleep (issue 34: a quiet idle). Runs until cancelled."""
        while True:
            await self._counted.wait()
            await asyncio.sleep(every)
            self._counted.clear()  # what is counted from here on is the next round's
            taken = self.take()
            for (provider, start), (events, drops, deferrals) in taken.items():
                try:
                    await store.add_reported(provider, start, events, drops, deferrals)
                except DependencyUnavailable as exc:
                    log.warning("provider reports not added: %s", exc)
                    entry = self.counts.setdefault((provider, start), [0, 0, 0])
                    for i, value in enumerate((events, drops, deferrals)):
                        entry[i] += value
                    self._counted.set()


def draw() -> float:
    """A uniform draw for :func:`order`'s probes (not for anything secret)."""
    return random.random()
