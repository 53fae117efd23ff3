"""Opening and closing a service's connections (Cassandra session and RabbitMQ broker) and
its CPU lane (``shared.infra.gil``): what every service process holds once."""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_delay,
    wait_random_exponential,
)

from shared.core.errors import DependencyUnavailable
from shared.infra.broker import Broker
from shared.infra.config import Settings
from shared.infra.db import Database
from shared.infra.gil import CpuLane
from shared.infra.health import Check
from shared.infra.migrations import fix_layout
from shared.infra.topology import Topology

log = logging.getLogger(__name__)


def topology_for(settings: Settings) -> Topology:
    return Topology(
        exchange=settings.amqp.exchange,
        delay_tiers=settings.providers.backoff_tiers,
        delivery_limit=settings.amqp.delivery_limit,
        # Deferral deadlines and the checks of calls whose outcome is unknown wait in delay
        # queues of their own length.
        extra_delay_tiers=(
            settings.webhooks.deferred_deadline,
            settings.providers.resolve_interval,
            math.ceil(settings.providers.call_lease),
            # Users' webhook endpoints are retried for about a day (up to 8 h apart).
            *settings.hooks.delay_tiers,
        ),
    )


async def declare_topology(settings: Settings) -> Topology:
    """``safedelivr topology``: declare every exchange, queue and binding (idempotent)."""
    broker = Broker(
        settings.amqp.url.get_secret_value(), topology_for(settings), name="safedelivr-topology"
    )
    await broker.connect()
    try:
        await broker.declare()
    finally:
        await broker.close()
    return broker.topology


@dataclass(slots=True)
class Resources:
    db: Database
    broker: Broker
    cpu: CpuLane = field(default_factory=CpuLane)
    """The process's one thread for long pure-Python work (its first use starts it)."""


async def connect_with_retry(settings: Settings, *, name: str, wait: float = 60.0) -> Resources:
    """Connect to both services, retrying for up to ``wait`` seconds (they may be starting)."""
    async for attempt in _patiently("Cassandra", wait):
        with attempt:
            db = await Database.connect(settings.cassandra, keyspace=settings.cassandra.keyspace)
    broker = Broker(
        settings.amqp.url.get_secret_value(),
        topology_for(settings),
        publish_timeout=settings.amqp.publish_timeout,
        name=name,
    )
    try:
        async for attempt in _patiently("RabbitMQ", wait):
            with attempt:
                await broker.connect()
    except DependencyUnavailable:
        await db.close()
        raise
    return Resources(db, broker)


def _patiently(what: str, wait: float) -> AsyncRetrying:
    """Retry a connection that fails as :class:`DependencyUnavailable` for ``wait`` seconds,
    backing off from half a second to five (with jitter), saying so each time."""

    def say(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        detail = error.detail if isinstance(error, DependencyUnavailable) else error
        log.warning("waiting for %s: %s", what, detail)

    return AsyncRetrying(
        retry=retry_if_exception_type(DependencyUnavailable),
        stop=stop_after_delay(wait),
        wait=wait_random_exponential(multiplier=0.5, max=5),
        before_sleep=say,
        reraise=True,
    )


@asynccontextmanager
async def open_resources(settings: Settings, *, name: str) -> AsyncIterator[Resources]:
    res = await connect_with_retry(settings, name=name)
    try:
        await fix_layout(res.db, settings.stats.buckets)
        yield res
    finally:
        await res.cpu.aclose()
        await res.broker.close()
        await res.db.close()


def readiness_checks(res: Resources) -> dict[str, Check]:
    """The checks /readyz runs: a CQL round trip and a live AMQP connection."""

    async def cassandra() -> None:
        await res.db.one("SELECT release_version FROM system.local")

    async def rabbitmq() -> None:
        if not res.broker.connected:
            raise DependencyUnavailable("rabbitmq", "connection closed")
        await res.broker.queue_depth(res.broker.topology.batches_queue)

    return {"cassandra": cassandra, "rabbitmq": rabbitmq}
