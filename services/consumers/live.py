"""Applying the live settings (``shared.livesettings``) to a running consumer process.

* The chain's order decides where new chunks go (the splitter's first provider) and where
  failover goes next (every decision reads the dispatcher's settings when it is made).
* A paused provider is not called: a job that reaches its queue is recorded as a rejected
  attempt ("paused by an operator") and passed to the next running provider, through the
  attempt protocol like any failure, so nothing is lost or sent twice.
* When every provider is paused, the provider queues are not consumed at all: work waits in
  the broker, not in memory, until one is resumed.
* ``max_attempts`` bounds the decisions made from now on.

The values in force are on ``/metrics`` (``safedelivr_provider_paused``,
``safedelivr_provider_chain_position``, ``safedelivr_settings_applied``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Gauge

from services.consumers.dispatch import Dispatcher
from services.consumers.splitter import Splitter
from shared.broker import Broker
from shared.config import ProviderSettings
from shared.livesettings import LiveSettings
from shared.providers.catalog import CODES
from shared.settle import Handler

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LiveMetrics:
    paused: Gauge
    position: Gauge
    applied: Gauge

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
    consuming: bool = True
    _seen: LiveSettings | None = field(default=None, repr=False)

    async def __call__(self, live: LiveSettings) -> None:
        configured = tuple(self.dispatcher.providers)
        chain = live.running_chain(configured)
        d = self.dispatcher
        d.settings = self.base.model_copy(
            update={"chain": ",".join(chain), "max_attempts": live.max_attempts}
        )
        d.paused = live.paused & frozenset(configured)
        d.handoff.chain = chain
        d.handoff.max_attempts = live.max_attempts
        self.splitter.first_provider = chain[0]
        await self._consume(not live.all_paused(configured))
        for code in CODES:
            self.metrics.paused.labels(code).set(1 if code in live.paused else 0)
            place = chain.index(code) + 1 if code in chain and code not in live.paused else 0
            self.metrics.position.labels(code).set(place)
        self.metrics.applied.set(time.time())
        if self._seen is not None:
            log.info(
                "live settings applied: chain %s, paused %s, max attempts %d",
                ",".join(chain),
                ",".join(sorted(live.paused)) or "none",
                live.max_attempts,
            )
        self._seen = live

    async def _consume(self, wanted: bool) -> None:
        if wanted == self.consuming:
            return
        topology = self.broker.topology
        queues = [
            q for code in self.dispatcher.providers
            for q in (topology.provider_queue(code), topology.log_queue(code))
        ]  # fmt: skip
        if wanted:
            for code in self.dispatcher.providers:
                await self.broker.consume(
                    topology.provider_queue(code), self.handler, prefetch=self.prefetch
                )
                await self.broker.consume(topology.log_queue(code), self.handler, prefetch=32)
            log.info("a provider was resumed: consuming the provider queues again")
        else:
            for queue in queues:
                await self.broker.cancel(queue)
            log.warning("every provider is paused: work waits in the provider queues")
        self.consuming = wanted
