"""The consumer process: connects, declares the topology, consumes every queue of the chain,
serves /healthz, /readyz and /metrics, and drains in-flight deliveries on SIGTERM/SIGINT."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from starlette.applications import Starlette

from services.consumers.dispatch import Dispatcher
from services.consumers.logretry import LogRetrier
from services.consumers.settle import InFlight, settling
from services.consumers.splitter import Splitter
from shared.attempts import AttemptStore
from shared.batchstore import BatchStore
from shared.config import Settings
from shared.health import health_routes
from shared.metrics import DispatchMetrics, new_registry
from shared.providers.registry import build_providers, close_all
from shared.resources import Resources, open_resources, readiness_checks

log = logging.getLogger(__name__)

#: Seconds to let in-flight deliveries finish at shutdown before closing the channels.
DRAIN_TIMEOUT = 30.0


async def start_consumers(
    settings: Settings, res: Resources, inflight: InFlight, metrics: DispatchMetrics | None = None
) -> Dispatcher:
    """Declare the topology and start the splitter and one sender per provider in the chain."""
    await res.broker.declare()
    providers = build_providers(settings.providers)
    batches = BatchStore(res.db)
    dispatcher = Dispatcher(
        res.broker, batches, AttemptStore(res.db), providers, settings.providers, metrics
    )
    splitter = Splitter(res.broker, batches, settings.providers.chain_codes[0])
    topology = res.broker.topology
    await res.broker.consume(
        topology.batches_queue, settling(splitter.process, inflight), prefetch=16
    )
    retrier = LogRetrier(res.broker, batches, providers, settings.providers)
    for code in settings.providers.chain_codes:
        await res.broker.consume(
            topology.provider_queue(code),
            settling(dispatcher.process, inflight),
            prefetch=settings.consumers.prefetch,
        )
        await res.broker.consume(
            topology.log_queue(code), settling(retrier.process, inflight), prefetch=32
        )
    return dispatcher


def create_app(settings: Settings) -> Starlette:
    registry = new_registry()
    metrics = DispatchMetrics.create(registry)
    inflight = InFlight()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with open_resources(settings, name="safedelivr-consumers") as res:
            app.state.resources = res
            dispatcher = await start_consumers(settings, res, inflight, metrics)
            log.info("consuming %s", ", ".join(settings.providers.chain_codes))
            try:
                yield
            finally:
                await res.broker.stop_consuming()
                if not await inflight.wait_idle(DRAIN_TIMEOUT):
                    log.warning(
                        "%d deliveries still in flight; they will be redelivered", inflight.count
                    )
                await close_all(dispatcher.providers)

    routes = health_routes(
        "consumers", registry, lambda request: readiness_checks(request.app.state.resources)
    )
    return Starlette(routes=routes, lifespan=lifespan)


def run(settings: Settings, *, health_port: int | None = None) -> int:
    uvicorn.run(
        create_app(settings),
        host=settings.consumers.host,
        port=health_port or settings.consumers.port,
        log_level=settings.log_level.lower(),
        access_log=False,
        loop="uvloop",
        lifespan="on",
    )
    return 0
