"""The webhook service application: factory, lifespan and route table (provider events,
and the providers' inbound routes for the `mailto:` unsubscribe)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Route

from services.webhooks import inbound, receivers
from services.webhooks.intake import Intake, IntakeMetrics
from services.webhooks.sns import SnsCertificates
from services.webhooks.webhook_tokens import WebhookTokens
from shared.core.errors import ConfigError
from shared.core.keyring import ring_from
from shared.delivery.handoff import Routing
from shared.infra import stall_monitor
from shared.infra.byte_budget import ByteBudget
from shared.infra.config import Settings
from shared.infra.current import Current
from shared.infra.health import health_routes
from shared.infra.http import AdmissionLimit, BodyBudget, error_handlers
from shared.infra.leases import woken
from shared.infra.metrics import new_registry
from shared.infra.resources import open_resources, readiness_checks
from shared.infra.settle import InFlight, settling
from shared.ingest.ingest import Ingest, IngestMetrics
from shared.ops.alerts import alert_config, alert_http, alerter_for
from shared.ops.livesettings import LiveSettings, SettingsStore, Watcher
from shared.providers import sendgrid_events
from shared.providers.provider_health import HealthStore, tell_refreshers

#: Seconds to let queued deliveries being applied finish at shutdown.
DRAIN_TIMEOUT = 10.0


def create_app(settings: Settings) -> Starlette:
    registry = new_registry()
    metrics = IngestMetrics.create(registry)
    intake_metrics = IntakeMetrics.create(registry)
    stalls = stall_monitor.StallMetrics.create(registry)
    inflight = InFlight()
    sendgrid_key = None
    if settings.webhooks.sendgrid_public_key:
        try:
            sendgrid_key = sendgrid_events.load_public_key(settings.webhooks.sendgrid_public_key)
        except ValueError as exc:
            raise ConfigError(f"SAFEDELIVR_WEBHOOKS_SENDGRID_PUBLIC_KEY: {exc}") from exc

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with (
            open_resources(settings, name="safedelivr-webhooks") as res,
            alert_http() as alert_client,
        ):
            app.state.resources = res
            alerts = Current(alert_config(None))
            # An SES feed unsubscribed (services.webhooks.receivers.ses) is told to operators.
            app.state.alerter = alerter_for(settings, res, alert_client, alerts)
            # Hand-offs after provider-side failures follow the running chain too.
            routing = Current(Routing.start(settings.providers))
            ingest = Ingest.over(res.db, res.broker, settings, metrics, route=routing)
            tokens = WebhookTokens(res.db)
            app.state.intake = intake = Intake(
                tokens, res.broker, ingest, intake_metrics, cpu=res.cpu
            )
            await res.broker.declare()
            configured = settings.providers.chain_codes

            async def apply(live: LiveSettings) -> None:
                routing.set(Routing(live.running_chain(configured), live.max_attempts))
                ingest.count_outcomes = live.capacity.enabled
                alerts.set(alert_config(live))

            watcher = Watcher(
                SettingsStore(res.db, settings.amqp.exchange), settings.providers, apply
            )
            await watcher.load()
            await res.broker.listen(lambda body: None if woken(body) else watcher.nudge())
            watching = asyncio.create_task(watcher.run())
            reporting = asyncio.create_task(
                ingest.reports.keep_adding(
                    tell_refreshers(HealthStore(res.db, settings.amqp.exchange), res.broker)
                )
            )
            await res.broker.consume(
                res.broker.topology.webhooks_queue,
                settling(intake.process, inflight, hold=None),
                prefetch=8,
            )
            try:
                with stall_monitor.watching(stalls):
                    yield
            finally:
                watching.cancel()
                reporting.cancel()
                await res.broker.stop_consuming()
                await inflight.wait_idle(DRAIN_TIMEOUT)
                await app.state.sns.aclose()

    routes = [
        Route("/webhooks/sendgrid", receivers.sendgrid, methods=["POST"]),
        Route("/webhooks/mailgun", receivers.mailgun, methods=["POST"]),
        Route("/webhooks/ses", receivers.ses, methods=["POST"]),
        Route("/webhooks/inbound/mailgun", inbound.mailgun, methods=["POST"]),
        Route("/webhooks/inbound/sendgrid", inbound.sendgrid, methods=["POST"]),
        *health_routes(
            "webhooks",
            registry,
            lambda request: readiness_checks(request.app.state.resources),
            settings.metrics_token,
        ),
    ]
    app = Starlette(
        middleware=[
            Middleware(AdmissionLimit, limit=settings.webhooks.max_concurrency),
            Middleware(
                BodyBudget,
                budget=ByteBudget(settings.webhooks.body_budget_bytes),
                wait=settings.webhooks.body_wait,
            ),
        ],
        routes=routes,
        lifespan=lifespan,
        exception_handlers=error_handlers(),
    )
    app.state.settings = settings
    app.state.sendgrid_key = sendgrid_key
    app.state.ses_topics = frozenset(
        arn.strip() for arn in settings.webhooks.ses_topic_arns.split(",") if arn.strip()
    )
    app.state.sns = SnsCertificates(pinned=settings.webhooks.ses_cert_pem)
    # The mailto: unsubscribe's tokens are the tracking endpoint's (same keys, same checks).
    app.state.tracking_ring = ring_from(settings.tracking.keys.get_secret_value())
    return app
