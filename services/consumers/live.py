"""Applying the live settings (``shared.ops.livesettings``) and the providers' health
(``shared.providers.provider_health``) to a running consumer process.

* The chain's order decides where new chunks go (the splitter's first provider) and where
  failover goes next. What live settings and health decide is one
  ``services.consumers.running.Running``, replaced whole in one cell: every decision reads
  the one in force when it is made.
* A paused provider is not called: a job that reaches its queue is recorded as a rejected
  attempt ("paused by an operator") and passed to the next running provider, through the
  attempt protocol like any failure, so nothing is lost or sent twice.
* When every provider is paused, the provider queues (both lanes and the re-sends) are not
  consumed at all: work waits in the broker, not in memory, until one is resumed.
* ``max_attempts`` bounds the decisions made from now on.
* The providers' rate limits apply to the next call, and the sending domains' capacity rules
  (``shared.delivery.domain_capacity``) to the next chunk (its admission and the release of a
  refused call under the same rules); a chunk held at its domain's capacity raises the
  ``capacity`` alert (:func:`capacity_alert`, wired when the dispatcher is built).
* Health orders the running chain (:func:`shared.providers.provider_health.order`): a refresh adds
  this process's calls to the shared windows, reads every provider's windows back, moves
  each circuit and re-orders the chain. Refreshes come every :data:`REFRESH_EVERY` seconds
  while health may move (:func:`next_refresh`): this process has calls to add, a window
  looked at holds calls or reports, a circuit is not closed, or a writer's wake-up is less
  than :data:`LINGER` old. Every writer of the windows announces it (a wake-up on the
  settings fanout at its first write and at most one per ``REFRESH_EVERY`` after it:
  ``shared.providers.provider_health.tell_refreshers``), and a process's own first call wakes its
  loop, so otherwise the loop waits for a wake-up, or :data:`IDLE_REFRESH_EVERY` should one
  be lost (issue 34: a quiet idle; it read every provider's windows every 2 s).

The values in force are on ``/metrics`` (``safedelivr_provider_paused``,
``safedelivr_provider_chain_position``, ``safedelivr_provider_health``,
``safedelivr_provider_circuit``, ``safedelivr_settings_applied``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from prometheus_client import CollectorRegistry, Gauge

from services.consumers.dispatch import Dispatcher
from services.consumers.running import Running
from shared.core.catalog import CATALOG, CODES
from shared.core.errors import DependencyUnavailable
from shared.delivery.domain_capacity import Capacity, OnHeld
from shared.infra.broker import Broker
from shared.infra.current import Current
from shared.infra.leases import HEALTH_WAKE, Linger, next_period, woken
from shared.infra.settle import Handler
from shared.ops.alerts import Alert, AlertConfig, Alerter, alert_config
from shared.ops.livesettings import LiveSettings
from shared.providers.provider_health import (
    REFRESH_EVERY,
    Circuit,
    CircuitState,
    HealthRules,
    HealthWindows,
    Window,
    draw,
    failures_in_last_minute,
    next_circuit,
    order,
    score,
    seen_since,
)

log = logging.getLogger(__name__)


#: Seconds a refresh loop keeps refreshing after a wake-up it heard (a write lands after the
#: wake-up announcing it, and a writer's next wake-up may come ``REFRESH_EVERY`` later).
LINGER: Final = 2 * REFRESH_EVERY
#: Seconds an idle refresh loop waits for a wake-up before refreshing anyway.
IDLE_REFRESH_EVERY: Final = 60.0


def next_refresh(now: float, awake_until: float, *, moving: bool) -> float:
    """Seconds until the next health refresh (pure): :data:`REFRESH_EVERY` while health may
    move or a wake-up is recent, else :data:`IDLE_REFRESH_EVERY`."""
    return next_period(
        now, awake_until, busy=moving, busy_every=REFRESH_EVERY, idle_every=IDLE_REFRESH_EVERY
    )


def moving(
    windows: Mapping[str, Sequence[Window]], circuits: Mapping[str, Circuit], unshared: bool
) -> bool:
    """Whether health may change without a new write (pure): calls not yet shared, a window
    looked at that holds calls or reports (its weight changes as it ages out), or a circuit
    not closed (its cool-down is timed)."""
    held = any(w.calls or w.events for found in windows.values() for w in found)
    return unshared or held or any(c != "closed" for c in circuits.values())


def capacity_alert(alerter: Alerter | None) -> OnHeld:
    """What a chunk held at its domain's capacity does: raise the ``capacity`` alert (once
    per cool-off; nothing without an alerter)."""

    async def held(domain: str, cap: Capacity, sent: int) -> None:
        if alerter is None:
            return
        text = (
            f"{domain} reached today's sending capacity ({sent:,} of {cap.limit:,} recipients, "
            f"{cap.state}: {cap.why}); its mail is held until capacity allows"
        )
        await alerter.send(Alert("capacity", domain, text))

    return held


#: Re-sends (one recipient each) in flight per provider.
RESEND_PREFETCH = 32


@dataclass(frozen=True)
class LiveMetrics:
    paused: Gauge
    position: Gauge
    applied: Gauge
    health: Gauge
    circuit: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry) -> LiveMetrics:
        return cls(
            Gauge(
                "safedelivr_provider_paused",
                "1 while an operator has paused the provider",
                ["provider"],
                registry=registry,
            ),
            Gauge(
                "safedelivr_provider_chain_position",
                "The provider's place in the running chain (1 = first; 0 = not in it)",
                ["provider"],
                registry=registry,
            ),
            Gauge(
                "safedelivr_settings_applied",
                "Unix time at which this process last applied changed live settings",
                registry=registry,
            ),
            Gauge(
                "safedelivr_provider_health",
                "1 - EWMA of the provider-side error rate over the shared 5 s windows",
                ["provider"],
                registry=registry,
            ),
            Gauge(
                "safedelivr_provider_circuit",
                "1 for the provider's circuit state (closed, open, half_open)",
                ["provider", "state"],
                registry=registry,
            ),
        )


@dataclass
class ConsumerSettings:
    """Applies live settings to this process's dispatcher, splitter and provider queues."""

    dispatcher: Dispatcher
    running: Current[Running]
    """The cell the dispatcher, its hand-off and the splitter read (this is its only writer)."""
    broker: Broker
    handler: Handler
    prefetch: int
    metrics: LiveMetrics
    bulk_prefetch: int = 2
    """Chunks in flight per provider's bulk-lane queue."""
    consuming: bool = True
    alerter: Alerter | None = None
    live: LiveSettings | None = None
    health: dict[str, float] = field(default_factory=dict)
    circuits: dict[str, Circuit] = field(default_factory=dict)
    clock: Callable[[], float] = time.monotonic
    """Monotonic seconds, for the wake-ups' linger (tests move it)."""
    health_moving: bool = True
    """Whether the last refresh saw health that may still move (:func:`moving`)."""
    linger: Linger = field(init=False, repr=False)
    """How the health refresh waits (ended, while idle, by a writer's wake-up or this
    process's first call)."""
    _circuit_states: dict[str, CircuitState] = field(default_factory=dict, repr=False)
    _seen: LiveSettings | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.linger = Linger(REFRESH_EVERY, IDLE_REFRESH_EVERY, self.clock)

    async def __call__(self, live: LiveSettings) -> None:
        configured = tuple(self.dispatcher.providers)
        self.live = live
        if self.dispatcher.ingest is not None:
            # Providers' answers count for their domains as webhook events do.
            self.dispatcher.ingest.count_outcomes = live.capacity.enabled
        self.refresh()
        await self._consume(not live.all_paused(configured))
        for code in CODES:
            self.metrics.paused.labels(code).set(1 if code in live.paused else 0)
        self.metrics.applied.set(time.time())
        if self._seen is not None:
            log.info(
                "live settings applied: chain %s, paused %s, max attempts %d",
                ",".join(live.chain),
                ",".join(sorted(live.paused)) or "none",
                live.max_attempts,
            )
        self._seen = live

    def alert_config(self) -> AlertConfig:
        """Where alerts go and their cool-off, as the live settings say now."""
        return alert_config(self.live)

    def refresh(self) -> None:
        """Order the running chain by health and hand it to everything that picks providers."""
        if self.live is None:
            return
        configured = tuple(self.dispatcher.providers)
        running = self.live.running_chain(configured)
        chain = order(running, self.health, self.circuits, draw(), self.live.health)
        self.running.set(Running.of(self.live, chain, configured))
        for code in CODES:
            place = chain.index(code) + 1 if code in chain and code not in self.live.paused else 0
            self.metrics.position.labels(code).set(place)

    def heard(self, body: bytes) -> None:
        """An announcement: a windows writer's wake-up keeps the refreshes coming, and ends
        an idle wait (a busy one is not cut short: refreshes stay ``REFRESH_EVERY`` apart)."""
        if woken(body) == HEALTH_WAKE:
            self.linger.stay_awake(LINGER)

    def next_refresh_in(self) -> float:
        """Seconds until the next refresh is due (see :func:`next_refresh`)."""
        return self.linger.next_in(busy=self.health_moving)

    async def refresh_health(self, store: HealthWindows) -> None:
        """One refresh: share this process's calls, read everyone's back, move the circuits
        and re-order the chain (an outage keeps the refreshes coming, not the loop)."""
        try:
            await self._share(store)
            windows = await self._score(store)
            unshared = bool(self.dispatcher.tally.counts)
            self.health_moving = moving(windows, self.circuits, unshared)
        except DependencyUnavailable as exc:
            log.warning("provider health not refreshed: %s", exc)
            self.health_moving = True
        self.refresh()

    async def keep_health(self, store: HealthWindows) -> None:
        """Refresh after refresh, :meth:`next_refresh_in` apart or when woken (a writer's
        wake-up heard by :meth:`heard`, this process's first call). Runs until cancelled."""
        self.dispatcher.tally.first = self.linger.nudge_if_idle
        try:
            self._circuit_states.update(await store.circuits())  # as they were left
        except DependencyUnavailable as exc:
            log.warning("circuits not read at start: %s", exc)
        # Writes made before it started are read by its first refreshes.
        self.linger.stay_awake(LINGER)
        while True:
            await self.refresh_health(store)
            await self.linger.wait(busy=self.health_moving)

    async def _share(self, store: HealthWindows) -> None:
        taken = self.dispatcher.tally.take()
        for n, ((provider, start), (calls, errors, ms)) in enumerate(taken.items()):
            try:
                await store.add(provider, start, calls, errors, ms)
            except DependencyUnavailable:
                # Not added: keep them for the next round (a counter add is not idempotent,
                # so one whose outcome is unknown may count twice; health is an estimate).
                for (p, w), counts in list(taken.items())[n:]:
                    entry = self.dispatcher.tally.counts.setdefault((p, w), [0, 0, 0])
                    for i, value in enumerate(counts):
                        entry[i] += value
                raise

    async def _score(self, store: HealthWindows) -> dict[str, list[Window]]:
        now = self.dispatcher.now()
        read: dict[str, list[Window]] = {}
        for code in self.dispatcher.providers:
            windows = read[code] = await store.windows(code, now)
            scored = score(windows, now)
            await self._burst(code, failures_in_last_minute(windows, now))
            before = self.circuits.get(code, "closed")
            rules = self.live.health if self.live else HealthRules()
            current = self._circuit_states.get(code, CircuitState())
            state = next_circuit(
                current, scored.health, now, rules, probed=seen_since(windows, current.since)
            )
            self._circuit_states[code] = state
            self.health[code] = scored.health
            self.circuits[code] = state.state
            if state.state != before:
                await store.set_circuit(code, state, scored.health)
                if state.state == "open" and self.alerter is not None:
                    text = (
                        f"{CATALOG[code].name} circuit opened: health {scored.health:.2f} over "
                        f"{scored.calls} calls; new work goes to the other providers"
                    )
                    await self.alerter.send(Alert("circuit_open", code, text))
                log.warning(
                    "%s circuit %s -> %s (health %.2f over %d calls)",
                    code, before, state.state, scored.health, scored.calls,
                )  # fmt: skip
            self.metrics.health.labels(code).set(scored.health)
            for name in ("closed", "open", "half_open"):
                self.metrics.circuit.labels(code, name).set(1 if name == state.state else 0)
        return read

    async def _burst(self, code: str, failures: int) -> None:
        limit = self.live.alert_error_burst if self.live else 50
        if failures >= limit and self.alerter is not None:
            text = (
                f"{CATALOG[code].name}: {failures} provider-side failures in the last minute "
                f"(alert from {limit}); the work is retried through the chain"
            )
            await self.alerter.send(Alert("error_burst", code, text))

    async def start_provider(self, code: str) -> None:
        """Consume a provider's queues: both lanes, the bulk one with the smaller prefetch so
        transactional chunks always find deliveries free, and the recipients' re-sends."""
        t = self.broker.topology
        await self.broker.consume(t.provider_queue(code), self.handler, prefetch=self.prefetch)
        await self.broker.consume(t.bulk_queue(code), self.handler, prefetch=self.bulk_prefetch)
        await self.broker.consume(t.log_queue(code), self.handler, prefetch=RESEND_PREFETCH)

    async def _consume(self, wanted: bool) -> None:
        if wanted == self.consuming:
            return
        topology = self.broker.topology
        if wanted:
            for code in self.dispatcher.providers:
                await self.start_provider(code)
            log.info("a provider was resumed: consuming the provider queues again")
        else:
            for code in self.dispatcher.providers:
                for queue in topology.sender_queues(code):
                    await self.broker.cancel(queue)
            log.warning("every provider is paused: work waits in the provider queues")
        self.consuming = wanted
