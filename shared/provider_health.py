"""Provider health, shared by every process: scores, circuits and the order they give the chain.

Each consumer process counts its provider calls (calls, provider-side failures, latency) and
adds them every :data:`FLUSH_EVERY` seconds to 5-second windows in Cassandra counters
(``provider_windows``), so the windows hold what every process saw. From the latest windows
each process computes the same scores (pure functions below):

* **health** (0-1): one minus an exponentially weighted moving average of the error rate over
  the windows that had calls (newest weighs most); a provider with too few calls to judge
  is healthy.
* **circuit**: ``open`` below :data:`OPEN_BELOW` (skipped for new work); after
  :data:`COOL_DOWN` seconds ``half_open`` (a small share of new work probes it); ``closed``
  again once the probes succeed (its health is back above :data:`DEMOTE_BELOW`).
* **order**: the running chain (the operator's order, paused providers out) with open
  circuits left out and unhealthy providers (below :data:`DEMOTE_BELOW`) moved behind the
  healthy ones; a share (:data:`PROBE_SHARE`) of new work still goes first to a demoted or
  half-open provider, so that its recovery is seen.

Failures that say nothing about the provider (a request refused as invalid, a paused
provider) are not counted.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Final, Literal

from shared.db import Database, utc

log = logging.getLogger(__name__)

WINDOW: Final = 5  # seconds
#: Windows looked at for a score (two minutes).
WINDOWS: Final = 24
FLUSH_EVERY: Final = 1.0
ALPHA: Final = 0.4
#: Calls needed in the windows looked at before a provider can be judged unhealthy.
MIN_CALLS: Final = 10
DEMOTE_BELOW: Final = 0.8
OPEN_BELOW: Final = 0.5
COOL_DOWN: Final = 30.0
PROBE_SHARE: Final = 0.1

Circuit = Literal["closed", "open", "half_open"]


@dataclass(frozen=True, slots=True)
class Window:
    start: datetime
    calls: int
    errors: int
    latency_ms: int


@dataclass(frozen=True, slots=True)
class Score:
    health: float
    calls: int
    """Calls in the windows looked at."""
    latency: float | None
    """Mean seconds per call (EWMA), if any call was seen."""
    rate: float
    """Calls per second over the latest full window."""


def score(windows: Sequence[Window], now: datetime) -> Score:
    """The score of one provider from its windows (any order)."""
    recent = sorted((w for w in windows if w.calls > 0), key=lambda w: w.start)
    calls = sum(w.calls for w in recent)
    error_rate, latency = 0.0, None
    for w in recent:
        error_rate = ALPHA * (min(w.errors, w.calls) / w.calls) + (1 - ALPHA) * error_rate
        mean = w.latency_ms / w.calls / 1000
        latency = mean if latency is None else ALPHA * mean + (1 - ALPHA) * latency
    if recent:
        error_rate /= 1 - (1 - ALPHA) ** len(recent)  # unbiased while few windows exist
    health = 1.0 if calls < MIN_CALLS else max(0.0, min(1.0, 1.0 - error_rate))
    last_full = window_start(now) - timedelta(seconds=WINDOW)
    rate = sum(w.calls for w in windows if w.start == last_full) / WINDOW
    return Score(round(health, 3), calls, latency, rate)


def window_start(at: datetime) -> datetime:
    """The start of the window ``at`` falls in."""
    seconds = int(at.timestamp()) // WINDOW * WINDOW
    return datetime.fromtimestamp(seconds, UTC)


@dataclass(frozen=True, slots=True)
class CircuitState:
    state: Circuit = "closed"
    since: datetime | None = None


def next_circuit(current: CircuitState, health: float, now: datetime) -> CircuitState:
    """The circuit after a new score (a pure state machine)."""
    if current.state == "closed":
        return CircuitState("open", now) if health < OPEN_BELOW else current
    if current.state == "open":
        cooled = current.since is None or (now - current.since).total_seconds() >= COOL_DOWN
        return CircuitState("half_open", now) if cooled else current
    if health >= DEMOTE_BELOW:
        return CircuitState("closed", now)
    probed_long_enough = (
        current.since is not None and (now - current.since).total_seconds() >= COOL_DOWN
    )
    if health < OPEN_BELOW and probed_long_enough:
        return CircuitState("open", now)  # the probes failed too
    return current


def order(
    running: Sequence[str],
    health: Mapping[str, float],
    circuits: Mapping[str, Circuit],
    draw: float,
) -> tuple[str, ...]:
    """The chain for new work: healthy closed providers in the operator's order, then the
    demoted and half-open ones; open circuits left out (unless every one is open). With
    ``draw`` (uniform 0-1) below PROBE_SHARE, a demoted or half-open provider goes first."""
    usable = [c for c in running if circuits.get(c, "closed") != "open"] or list(running)
    healthy = [
        c for c in usable
        if circuits.get(c, "closed") == "closed" and health.get(c, 1.0) >= DEMOTE_BELOW
    ]  # fmt: skip
    rest = [c for c in usable if c not in healthy]
    if rest and draw < PROBE_SHARE:
        return (rest[0], *healthy, *rest[1:])
    return (*healthy, *rest)


# --------------------------------------------------------------------------- the table


class HealthStore:
    """The ``provider_windows`` and ``provider_circuits`` tables (their only writer), for one
    deployment's scope."""

    def __init__(self, db: Database, scope: str) -> None:
        self._db = db
        self.scope = scope

    async def add(self, provider: str, start: datetime, calls: int, errors: int, ms: int) -> None:
        await self._db.execute(
            "UPDATE provider_windows SET calls = calls + ?, errors = errors + ?, "
            "latency_ms = latency_ms + ? WHERE scope = ? AND provider = ? AND day = ? "
            "AND window = ?",
            (calls, errors, ms, self.scope, provider, start.date(), start),
        )

    async def windows(self, provider: str, now: datetime) -> list[Window]:
        """The windows of the last two minutes (two days' partitions around midnight)."""
        since = window_start(now) - timedelta(seconds=WINDOW * WINDOWS)
        days: list[date] = sorted({since.date(), now.date()})
        found: list[Window] = []
        for day in days:
            rows = await self._db.rows(
                "SELECT window, calls, errors, latency_ms FROM provider_windows "
                "WHERE scope = ? AND provider = ? AND day = ? AND window > ?",
                (self.scope, provider, day, since),
            )
            found += [
                Window(utc(r["window"]), int(r["calls"] or 0), int(r["errors"] or 0),
                       int(r["latency_ms"] or 0))
                for r in rows
            ]  # fmt: skip
        return found

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


@dataclass
class Tally:
    """This process's calls not yet added to the shared windows."""

    counts: dict[tuple[str, datetime], list[int]] = field(default_factory=dict)

    def count(self, provider: str, at: datetime, *, error: bool, seconds: float) -> None:
        key = (provider, window_start(at))
        entry = self.counts.setdefault(key, [0, 0, 0])
        entry[0] += 1
        entry[1] += int(error)
        entry[2] += int(seconds * 1000)

    def take(self) -> dict[tuple[str, datetime], list[int]]:
        taken, self.counts = self.counts, {}
        return taken


def draw() -> float:
    """A uniform draw for :func:`order`'s probes (not for anything secret)."""
    return random.random()
