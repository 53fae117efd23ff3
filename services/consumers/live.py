"""Applying the live settings (``shared.livesettings``) and the providers' health
(``shared.provider_health``) to a running consumer process.

* The chain's order decides where new chunks go (the splitter's first provider) and where
  failover goes next (every decision reads the dispatcher's settings when it is made).
* A paused provider is not called: a job that reaches its queue is recorded as a rejected
  attempt ("paused by an operator") and passed to the next running provider, through the
  attempt protocol like any failure, so nothing is lost or sent twice.
* When every provider is paused, the provider queues (both lanes and the re-sends) are not
  consumed at all: work waits in the broker, not in memory, until one is resumed.
* ``max_attempts`` bounds the decisions made from now on.
* The sending domains' capacity rules (``shared.domain_capacity``) apply to the next chunk; a
  chunk held at its domain's capacity raises the ``capacity`` alert.
* Health orders the running chain (:func:`shared.provider_health.order`): every
  :data:`REFRESH_EVERY` seconds this process adds its calls to the shared windows, reads
  every provider's windows back, moves each circuit and re-orders the chain.

The values in force are on ``/metrics`` (``safedelivr_provider_paused``,
``safedelivr_provider_chain_position``, ``safedelivr_provider_health``,
``safedelivr_provider_circuit``, ``safedelivr_settings_applied``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Gauge

from services.consumers.dispatch import Dispatcher
from services.consumers.splitter import Splitter
from shared.alerts import Alert, AlertConfig, Alerter
from shared.broker import Broker
from shared.config import ProviderSettings
from shared.domain_capacity import Capacity
from shared.errors import DependencyUnavailable
from shared.livesettings import LiveSettings
from shared.provider_health import (
    Circuit,
    CircuitState,
    HealthRules,
    HealthStore,
    draw,
    failures_in_last_minute,
    next_circuit,
    order,
    score,
)
from shared.providers.catalog import CATALOG, CODES
from shared.settle import Handler

log = logging.getLogger(__name__)


#: Seconds between two health refreshes.
REFRESH_EVERY = 2.0
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
    splitter: Splitter
    broker: Broker
    base: ProviderSettings
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
    _circuit_states: dict[str, CircuitState] = field(default_factory=dict, repr=False)
    _seen: LiveSettings | None = field(default=None, repr=False)

    async def __call__(self, live: LiveSettings) -> None:
        configured = tuple(self.dispatcher.providers)
        self.live = live
        d = self.dispatcher
        d.paused = live.paused & frozenset(configured)
        d.limiter.limits = live.limits()
        d.capacity.apply(live.capacity)
        d.handoff.max_attempts = live.max_attempts
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
        if self.live is None:
            return AlertConfig("", 600)
        live = self.live
        return AlertConfig(
            live.alert_url, live.alert_cool_off, live.alert_email_to, live.alert_email_from
        )

    async def capacity_held(self, domain: str, cap: Capacity, sent: int) -> None:
        """A chunk was held at its domain's capacity: alert (once per cool-off)."""
        if self.alerter is None:
            return
        text = (
            f"{domain} reached today's sending capacity ({sent:,} of {cap.limit:,} recipients, "
            f"{cap.state}: {cap.why}); its mail is held until capacity allows"
        )
        await self.alerter.send(Alert("capacity", domain, text))

    def refresh(self) -> None:
        """Order the running chain by health and hand it to everything that picks providers."""
        if self.live is None:
            return
        running = self.live.running_chain(tuple(self.dispatcher.providers))
        chain = order(running, self.health, self.circuits, draw(), self.live.health)
        d = self.dispatcher
        d.settings = self.base.model_copy(
            update={"chain": ",".join(chain), "max_attempts": self.live.max_attempts}
        )
        d.handoff.chain = chain
        self.splitter.first_provider = chain[0]
        for code in CODES:
            place = chain.index(code) + 1 if code in chain and code not in self.live.paused else 0
            self.metrics.position.labels(code).set(place)

    async def keep_health(self, store: HealthStore) -> None:
        """Every REFRESH_EVERY seconds: share this process's calls, read everyone's back, move
        the circuits and re-order the chain. Runs until cancelled."""
        try:
            self._circuit_states.update(await store.circuits())  # as they were left
        except DependencyUnavailable as exc:
            log.warning("circuits not read at start: %s", exc)
        while True:
            try:
                await self._share(store)
                await self._score(store)
            except DependencyUnavailable as exc:
                log.warning("provider health not refreshed: %s", exc)
            self.refresh()
            await asyncio.sleep(REFRESH_EVERY)

    async def _share(self, store: HealthStore) -> None:
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

    async def _score(self, store: HealthStore) -> None:
        now = self.dispatcher.now()
        for code in self.dispatcher.providers:
            windows = await store.windows(code, now)
            scored = score(windows, now)
            await self._burst(code, failures_in_last_minute(windows, now))
            before = self.circuits.get(code, "closed")
            rules = self.live.health if self.live else HealthRules()
            state = next_circuit(
                self._circuit_states.get(code, CircuitState()), scored.health, now, rules
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
