"""The API application: factory, lifespan (connections, outbox relay), routes, error handlers."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta

import httpx
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Route

from services.api import oauth
from services.api.campaign_runner import CampaignRunner
from services.api.campaigns import Campaigns
from services.api.cap_store import CapStore
from services.api.capping import Caps
from services.api.contact_lists import ContactLists
from services.api.cooldown import RecentMail
from services.api.dashboard import compile_pages, create_templates, dashboard_routes
from services.api.idempotency import IdempotencyStore
from services.api.keycache import KeyCache, Revocations
from services.api.managing import Managing
from services.api.openapi import document as openapi_document
from services.api.openapi import openapi_json
from services.api.original import original_routes
from services.api.routes import V1_ROUTES
from services.api.sending import Sending
from services.api.sessions import LoginRequired, cookie_secure, login_required_response
from services.api.templated import TemplateBatches
from shared.accounts import accounts, ratelimit
from shared.accounts.domains import WAKE as DOMAINS_WAKE
from shared.accounts.domains import DohResolver, DomainStore
from shared.accounts.preferences import PreferenceStore
from shared.accounts.ratelimit import (
    QuotaLedger,
    RateLimiter,
    RatePolicy,
    RateWindows,
    RecipientQuota,
)
from shared.audience.campaigns import CampaignStore
from shared.audience.suppression_cache import Changes, SuppressionCache
from shared.audience.suppressions import SuppressionStore
from shared.core.errors import DependencyUnavailable
from shared.delivery.acceptance import Acceptance
from shared.delivery.attempts import AttemptStore
from shared.delivery.batchstore import BatchStore
from shared.delivery.outbox import Outbox, Relay, relay_forever, tell_relays
from shared.delivery.schedule_store import ScheduleStore
from shared.delivery.stats import StatsStore, tell_rollups
from shared.infra.background import Background
from shared.infra.broker import Broker
from shared.infra.byte_budget import ByteBudget
from shared.infra.config import Settings
from shared.infra.health import health_routes
from shared.infra.http import AdmissionLimit, BodyBudget, StrictTransportSecurity, error_handlers
from shared.infra.metrics import ApiMetrics, new_registry
from shared.infra.resources import open_resources, readiness_checks
from shared.infra.stall_monitor import StallMetrics, watching
from shared.infra.user_cache import UserCache, UserChanges
from shared.ops.deadletters import DeadLetters, DeadLetterStore
from shared.templates.canary_store import CanaryStore
from shared.templates.template_pool import TemplatePool
from shared.templates.templates import TemplateStore

log = logging.getLogger(__name__)


async def _hear_changes(
    broker: Broker,
    keys: KeyCache,
    lists: SuppressionCache,
    domains: UserCache[frozenset[str]],
) -> None:
    """Drop keys, users' suppression lists and verified domains from this process's caches as
    soon as any process announces them revoked or changed; with the broker down, cached ones
    still expire within their TTL (``services.api.keycache``, ``shared.audience.suppression_cache``,
    ``shared.infra.user_cache``)."""

    def hear(body: bytes) -> None:
        keys.hear(body)
        lists.hear(body)
        domains.hear(body)

    try:
        await broker.listen(hear)
    except DependencyUnavailable as exc:
        log.warning(
            "not hearing key revocations or suppression changes (cached ones expire "
            "on their own): %s",
            exc,
        )


async def _hear(broker: Broker, on_message: Callable[[bytes], None], what: str) -> None:
    """Listen to the announcements for a loop's wake-ups; with the broker down the loop
    keeps its own next due times (a wake-up lost costs its lease's renewal period)."""
    try:
        await broker.listen(on_message)
    except DependencyUnavailable as exc:
        log.warning("not hearing %s (loops keep their own times): %s", what, exc)


def create_app(settings: Settings) -> Starlette:
    registry = new_registry()
    stalls = StallMetrics.create(registry)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with open_resources(settings, name="safedelivr-api") as res:
            state = app.state
            state.resources = res
            # Large batches' validation, CSV scans, large JSON: on one thread (shared.infra.gil).
            state.cpu = res.cpu
            state.stats = tell_rollups(StatsStore(res.db, settings.stats.buckets), res.broker)
            state.batches = BatchStore(res.db, state.stats)
            state.outbox = Outbox(res.db, settings.amqp.exchange)
            # Charged in process against leases of the shared counter (shared.accounts.ratelimit).
            state.quota = QuotaLedger(RecipientQuota(res.db, settings.api.daily_recipient_quota))
            # Made here, not on first use, so that its leases in flight end before the database.
            state.rate_limiter = RateLimiter(
                RateWindows(res.db),
                RatePolicy(settings.api.rate_limit_per_second, settings.api.rate_burst),
            )
            state.acceptance = Acceptance(
                state.batches,
                state.outbox,
                res.broker,
                refunds=state.quota,
                decide_within=timedelta(
                    seconds=settings.api.commit_budget + settings.api.outbox_grace
                ),
            )
            state.attempts = AttemptStore(res.db)
            state.idempotency = IdempotencyStore(res.db, lease=settings.api.idempotency_lease)
            state.suppressions = SuppressionStore(res.db)
            state.preferences = PreferenceStore(res.db)
            state.domains = DomainStore(res.db)
            # Not ``templates``: that is the dashboard's Jinja2 environment.
            state.template_store = TemplateStore(res.db)
            # Users' templates are compiled and rendered in worker processes of their own
            # (started below, closed last).
            state.template_pool = TemplatePool(settings.templates)
            state.canary_store = CanaryStore(res.db, settings.amqp.exchange)
            state.caps = Caps(CapStore(res.db), settings.caps)
            state.dead_letters = DeadLetters(DeadLetterStore(res.db), res.broker)
            state.background = Background()
            state.keys = KeyCache(functools.partial(accounts.read_key, res.db))
            state.suppression_cache = SuppressionCache(
                state.suppressions,
                small=settings.api.suppression_cache_small,
                ttl=settings.api.suppression_cache_ttl,
            )
            state.domain_cache = UserCache(
                state.domains.verified, wake=DOMAINS_WAKE, ttl=settings.api.domain_cache_ttl
            )
            state.domain_changes = UserChanges(res.broker, state.domain_cache, DOMAINS_WAKE)
            state.managing = Managing(
                res.db,
                state.suppressions,
                max_keys=settings.api.max_keys_per_user,
                revocations=Revocations(res.broker, state.keys),
                changes=Changes(res.broker, state.suppression_cache),
            )
            await _hear_changes(res.broker, state.keys, state.suppression_cache, state.domain_cache)
            state.sending = Sending(
                settings=settings,
                acceptance=state.acceptance,
                batches=state.batches,
                suppressions=state.suppressions,
                idempotency=state.idempotency,
                quota=state.quota,
                metrics=state.metrics,
                background=state.background,
                domains=state.domains,
                domain_cache=state.domain_cache,
                preferences=state.preferences,
                recent=RecentMail(res.db),
                templates=TemplateBatches(state.template_store, state.template_pool),
                schedules=ScheduleStore(res.db, settings.amqp.exchange),
                canaries=state.canary_store,
                cpu=res.cpu,
                suppression_cache=state.suppression_cache,
            )
            state.campaigns = Campaigns(
                CampaignStore(res.db, settings.amqp.exchange),
                state.template_store,
                ContactLists(res.db),
                state.batches,
                state.sending,
                state.caps,
            )
            await state.template_pool.start()
            campaign_runner = CampaignRunner(
                state.campaigns.store,
                state.campaigns.lists,
                state.template_store,
                state.sending,
                ScheduleStore(res.db, f"{settings.amqp.exchange}:campaigns"),
            )
            await _hear(res.broker, campaign_runner.loop.heard, "campaign wake-ups")
            runner = asyncio.create_task(campaign_runner.loop.run())
            state.github_http = httpx.AsyncClient(
                timeout=httpx.Timeout(settings.github.timeout), follow_redirects=False
            )
            state.resolver = DohResolver(state.github_http, settings.api.dns_url)
            interval = settings.api.outbox_relay_interval
            outbox_relay = Relay(
                state.outbox, state.acceptance.finish, grace=settings.api.outbox_grace
            )
            tell_relays(state.outbox, res.broker, interval, outbox_relay)
            await _hear(res.broker, outbox_relay.heard, "outbox wake-ups")
            relay = asyncio.create_task(relay_forever(outbox_relay, interval=interval))
            purge = asyncio.create_task(ratelimit.purge_forever(res.db))
            leases = asyncio.create_task(state.quota.reconcile_forever())
            # Built before serving, off the event loop: the first request for the API docs
            # or a dashboard page held the loop for 50-100 ms while one was built.
            state.openapi = await asyncio.to_thread(openapi_document)
            await asyncio.to_thread(compile_pages, state.templates)
            try:
                with watching(stalls):
                    yield
            finally:
                await state.github_http.aclose()
                purge.cancel()
                runner.cancel()
                relay.cancel()
                # Awaited while the database is open: the runner releases its lease.
                with contextlib.suppress(asyncio.CancelledError):
                    await runner
                with contextlib.suppress(asyncio.CancelledError):
                    await relay
                await state.background.drain()
                await state.rate_limiter.close()
                leases.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await leases
                # Unspent leases back to the day's counter, after the last batch is charged.
                await state.quota.close()
                await state.template_pool.close()

    routes = [
        Route("/v1/openapi.json", openapi_json, methods=["GET"]),
        *V1_ROUTES,
        *original_routes(),
        Route("/auth/github/login", oauth.login, methods=["GET"]),
        Route("/auth/github/callback", oauth.callback, methods=["GET"]),
        Route("/auth/logout", oauth.logout, methods=["POST"]),
        *health_routes(
            "api",
            registry,
            lambda request: readiness_checks(request.app.state.resources),
            settings.metrics_token,
        ),
        *dashboard_routes(),  # last: its / and /static shadow nothing above
    ]
    body_budget = ByteBudget(settings.api.body_budget_bytes)
    middleware = [
        Middleware(AdmissionLimit, limit=settings.api.max_concurrency),
        Middleware(BodyBudget, budget=body_budget, wait=settings.api.body_wait),
    ]
    if cookie_secure(settings):
        # Outermost, so that even a 503 from the admission limit carries it.
        middleware.insert(0, Middleware(StrictTransportSecurity))
    app = Starlette(
        middleware=middleware,
        routes=routes,
        lifespan=lifespan,
        exception_handlers={**error_handlers(), LoginRequired: login_required_response},
    )
    app.state.settings = settings
    app.state.body_budget = body_budget
    app.state.templates = create_templates()
    app.state.metrics = ApiMetrics.create(registry)
    return app
