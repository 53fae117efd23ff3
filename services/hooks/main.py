"""The webhook delivery process: connects, declares the topology, consumes the wake-ups of
users' endpoints (``whook.<endpoint_uuid>``), sweeps every endpoint now and then (a wake-up
lost with a crashed publisher delays delivery by one sweep at most), and serves /healthz,
/readyz and /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from starlette.applications import Starlette

from services.hooks.notice import DisabledMail
from services.hooks.worker import Worker
from shared.core.errors import DependencyUnavailable
from shared.delivery.acceptance import Acceptance
from shared.delivery.batchstore import BatchStore
from shared.delivery.outbox import Outbox, tell_relays
from shared.delivery.stats import StatsStore, tell_rollups
from shared.infra.config import Settings
from shared.infra.health import health_routes
from shared.infra.metrics import HookMetrics, new_registry
from shared.infra.resources import Resources, open_resources, readiness_checks
from shared.infra.settle import InFlight, settling
from shared.infra.stall_monitor import StallMetrics, watching
from shared.outbound.hook_delivery import Deliverer
from shared.outbound.hook_queue import HookQueue
from shared.outbound.hook_store import HookStore
from shared.outbound.user_hooks import wake

log = logging.getLogger(__name__)

#: Seconds to let passes in flight finish at shutdown.
DRAIN_TIMEOUT = 15.0


def build_worker(
    settings: Settings,
    res: Resources,
    http: httpx.AsyncClient,
    metrics: HookMetrics | None = None,
) -> Worker:
    hooks = settings.hooks
    # Its mails (an endpoint disabled) are batches: the roll-ups and relays are told of them.
    stats = tell_rollups(StatsStore(res.db, settings.stats.buckets), res.broker)
    outbox = tell_relays(
        Outbox(res.db, settings.amqp.exchange), res.broker, settings.api.outbox_relay_interval
    )
    acceptance = Acceptance(BatchStore(res.db, stats), outbox, res.broker)
    return Worker(
        store=HookStore(res.db),
        queue=HookQueue(res.db),
        broker=res.broker,
        deliverer=Deliverer(
            http, timeout=hooks.timeout, allow_http=hooks.allow_http, allowed=hooks.networks
        ),
        settings=hooks,
        notify=DisabledMail(res.db, acceptance, hooks.mail_from, settings.api.public_url),
        lease_seconds=max(30, int(hooks.timeout * 3)),
        metrics=metrics,
    )


async def sweep(worker: Worker, interval: float) -> None:
    """Each ``interval``, wake every enabled endpoint that has something to send and is not
    waiting for a retry (plain reads: idle endpoints cost no lease)."""
    while True:
        await asyncio.sleep(interval)
        try:
            async for user_id, endpoint_id in worker.store.every_endpoint():
                if await worker.has_work(endpoint_id):
                    await wake(worker.broker, user_id, endpoint_id)
        except DependencyUnavailable as exc:
            log.warning("webhook sweep: %s", exc)


def create_app(settings: Settings) -> Starlette:
    registry = new_registry()
    metrics = HookMetrics.create(registry)
    stalls = StallMetrics.create(registry)
    inflight = InFlight()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with (
            open_resources(settings, name="safedelivr-hooks") as res,
            # No connection is kept: each goes to a vetted address under one endpoint's host
            # name (SNI, certificate check), and a pooled one would carry another user's
            # events to whichever host it was opened for.
            httpx.AsyncClient(
                follow_redirects=False,
                trust_env=False,
                limits=httpx.Limits(max_keepalive_connections=0),
            ) as http,
        ):
            app.state.resources = res
            await res.broker.declare()
            worker = app.state.worker = build_worker(settings, res, http, metrics)
            await res.broker.consume(
                res.broker.topology.hooks_queue,
                settling(worker.handle, inflight),
                prefetch=32,
            )
            swept = asyncio.create_task(sweep(worker, settings.hooks.sweep_interval))
            try:
                with watching(stalls):
                    yield
            finally:
                swept.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await swept
                await res.broker.stop_consuming()
                if not await inflight.wait_idle(DRAIN_TIMEOUT):
                    log.warning("%d webhook passes still in flight", inflight.count)

    routes = health_routes(
        "hooks",
        registry,
        lambda request: readiness_checks(request.app.state.resources),
        settings.metrics_token,
    )
    return Starlette(routes=routes, lifespan=lifespan)
