"""The consumer process: connects, declares the topology, consumes every queue of the chain,
serves /healthz, /readyz and /metrics, and drains in-flight deliveries on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
from starlette.applications import Starlette

from services.consumers.campaign_hold import CampaignHold
from services.consumers.canary_judge import CanaryJudge, tell_nobody
from services.consumers.dispatch import Dispatcher
from services.consumers.domain_checks import DomainChecker
from services.consumers.faults import FaultPoints, no_faults
from services.consumers.live import ConsumerSettings, LiveMetrics, capacity_alert
from services.consumers.provider_rates import ProviderLimiter
from services.consumers.rollups import RollUp
from services.consumers.running import Running
from services.consumers.scheduler import Scheduler
from services.consumers.splitter import Splitter
from services.consumers.template_rollouts import LiveRollouts
from shared.accounts.domain_checks import CheckRules
from shared.accounts.domains import WAKE as DOMAINS_WAKE
from shared.accounts.domains import DohResolver, DomainStore
from shared.accounts.ratelimit import RecipientQuota
from shared.audience.campaigns import CampaignStore
from shared.audience.suppressions import SuppressionStore
from shared.core.errors import DependencyUnavailable, ProviderError
from shared.core.lanes import PRIORITIES
from shared.delivery.acceptance import Acceptance
from shared.delivery.attempts import AttemptStore
from shared.delivery.batchstore import Batches, BatchStore
from shared.delivery.domain_capacity import CapacityGate, DomainVolumes
from shared.delivery.outbox import Outbox
from shared.delivery.recipients import Recipients, RecipientStore
from shared.delivery.schedule_store import ScheduleStore
from shared.delivery.stats import StatsStore, tell_rollups
from shared.engagement.engagement import tracker_of
from shared.infra.byte_budget import ByteBudget
from shared.infra.config import Settings
from shared.infra.current import Current
from shared.infra.health import health_routes
from shared.infra.leases import woken
from shared.infra.metrics import DeadLetterMetrics, DispatchMetrics, new_registry
from shared.infra.resources import Resources, open_resources, readiness_checks
from shared.infra.settle import InFlight, settling
from shared.infra.stall_monitor import StallMetrics, watching
from shared.infra.user_cache import UserChanges
from shared.ingest.ingest import Ingest, IngestMetrics
from shared.ops.alerts import Alert, Alerter, alert_config, alert_http, alerter_for
from shared.ops.deadletters import DeadLetterStore, Letter, archiver
from shared.ops.livesettings import SettingsStore, Watcher
from shared.outbound.user_hooks import HookEmitter
from shared.providers.base import Provider
from shared.providers.provider_health import HealthStore, tell_refreshers
from shared.providers.registry import build_providers, close_all
from shared.templates.canary import Margins
from shared.templates.canary_store import CanaryStore
from shared.templates.templates import TemplateStore

log = logging.getLogger(__name__)

#: Seconds to let in-flight deliveries finish at shutdown before closing the channels.
DRAIN_TIMEOUT = 30.0
#: Seconds between two counts of the dead letters waiting for an operator.
DEAD_COUNT_EVERY = 30.0
#: Seconds a DNS-over-HTTPS look-up of a sending domain may take.
DNS_TIMEOUT = 10.0


def build_dispatcher(
    settings: Settings,
    res: Resources,
    metrics: DispatchMetrics | None = None,
    *,
    fault_points: FaultPoints = no_faults,
    running: Current[Running] | None = None,
    alerter: Alerter | None = None,
    ingest_metrics: IngestMetrics | None = None,
) -> Dispatcher:
    """The provider senders' dispatcher, with its own provider adapters (close them);
    ``running`` is the live settings' cell (by default the env's values, never changed)."""
    stats = tell_rollups(StatsStore(res.db, settings.stats.buckets), res.broker)
    running = running or Current(Running.start(settings.providers))
    return Dispatcher(
        broker=res.broker,
        batches=BatchStore(res.db, stats),
        attempts=AttemptStore(res.db),
        providers=build_providers(settings.providers, res.cpu),
        settings=settings.providers,
        metrics=metrics or DispatchMetrics.create(new_registry()),
        recipients=RecipientStore(res.db, stats, res.cpu),
        suppressions=SuppressionStore(res.db),
        running=running,
        fault_points=fault_points,
        deferred_deadline=settings.webhooks.deferred_deadline,
        limiter=ProviderLimiter(res.db, settings.amqp.exchange),
        capacity=CapacityGate(DomainVolumes(res.db), on_held=capacity_alert(alerter)),
        tracker=tracker_of(settings.tracking),
        user_hooks=HookEmitter(res.db, res.broker),
        # Providers' answers recipient by recipient go through the webhooks' ingest; its
        # hand-offs follow this process's running chain.
        ingest=Ingest.over(
            res.db,
            res.broker,
            settings,
            ingest_metrics or IngestMetrics.create(new_registry()),
            route=running,
        ),
        campaigns=CampaignHold(CampaignStore(res.db, settings.amqp.exchange)),
        work=ByteBudget(settings.consumers.work_budget_bytes),
        cpu=res.cpu,
        rollouts=LiveRollouts(TemplateStore(res.db)),
    )


@dataclass
class Consumers:
    """What :func:`start_consumers` started."""

    dispatcher: Dispatcher
    watcher: Watcher
    applier: ConsumerSettings


async def start_consumers(
    settings: Settings,
    res: Resources,
    inflight: InFlight,
    metrics: DispatchMetrics | None = None,
    *,
    fault_points: FaultPoints = no_faults,
    dead_metrics: DeadLetterMetrics | None = None,
    live_metrics: LiveMetrics | None = None,
    alerter: Alerter | None = None,
    ingest_metrics: IngestMetrics | None = None,
) -> Consumers:
    """Declare the topology, apply the live settings, and start the splitter, one sender per
    provider in the chain and the dead-letter archiver (run ``watcher.run()`` to keep the
    settings current)."""
    await res.broker.declare()
    running = Current(Running.start(settings.providers))
    dispatcher = build_dispatcher(
        settings,
        res,
        metrics,
        fault_points=fault_points,
        running=running,
        alerter=alerter,
        ingest_metrics=ingest_metrics,
    )
    providers = dispatcher.providers
    splitter = Splitter(res.broker, dispatcher.batches, running)
    handler = settling(dispatcher.process, inflight)
    applier = ConsumerSettings(
        dispatcher,
        running,
        res.broker,
        handler,
        settings.consumers.prefetch,
        live_metrics or LiveMetrics.create(new_registry()),
        bulk_prefetch=settings.consumers.bulk_prefetch,
        alerter=alerter,
    )
    watcher = Watcher(SettingsStore(res.db, settings.amqp.exchange), settings.providers, applier)
    await watcher.load()  # before any work is taken: a paused provider is paused from the start
    # Wake-ups are for the loops that asked for them (``shared.infra.leases``), not a change.
    await res.broker.listen(lambda body: None if woken(body) else watcher.nudge())
    topology = res.broker.topology
    await res.broker.consume(
        topology.batches_queue, settling(splitter.process, inflight), prefetch=16
    )
    probe = asyncio.create_task(_probe_query_apis(providers, settings))
    _background.add(probe)
    probe.add_done_callback(_background.discard)
    if applier.consuming:
        for code in settings.providers.chain_codes:
            await applier.start_provider(code)
    await start_archiving(
        res, inflight, dead_metrics or DeadLetterMetrics.create(new_registry()), alerter
    )
    return Consumers(dispatcher, watcher, applier)


async def start_archiving(
    res: Resources,
    inflight: InFlight,
    metrics: DeadLetterMetrics,
    alerter: Alerter | None = None,
) -> None:
    """Archive every dead letter (see ``shared.ops.deadletters``). Held through outages without a
    limit: the dead queue has no queue behind it, so a letter is only ever acked once stored."""

    def archived(letter: Letter) -> None:
        metrics.archived.labels(letter.queue).inc()
        metrics.waiting.inc()
        if alerter is not None:
            alert = Alert(
                "dead_letters",
                letter.queue,
                f"work was dead-lettered from {letter.queue} ({letter.reason}): "
                f"see GET /v1/dead-letters (first: {letter.id})",
            )
            task = asyncio.create_task(alerter.send(alert))
            _background.add(task)
            task.add_done_callback(_background.discard)

    store = DeadLetterStore(res.db)
    await res.broker.consume(
        res.broker.topology.dead_letter_queue,
        settling(archiver(store, archived), inflight, hold=None),
        prefetch=8,
    )


async def watch_queues(res: Resources, applier: ConsumerSettings, alerter: Alerter) -> None:
    """Alert when a provider queue (of either lane) holds more jobs than
    ``alerts.queue_depth``."""
    topology = res.broker.topology
    while True:
        await asyncio.sleep(DEAD_COUNT_EVERY)
        limit = applier.live.alert_queue_depth if applier.live else 10_000
        for code, lane in itertools.product(applier.dispatcher.providers, PRIORITIES):
            queue = topology.lane_queue(code, lane)
            try:
                depth = await res.broker.queue_depth(queue)
            except DependencyUnavailable as exc:
                log.warning("could not read the depth of %s: %s", queue, exc)
                continue
            if depth > limit:
                text = f"{depth} jobs wait in {queue} (alert above {limit})"
                await alerter.send(Alert("queue_depth", queue, text))


async def count_dead_letters(res: Resources, metrics: DeadLetterMetrics) -> None:
    """Keep the waiting gauge true to the archive (operators replay and delete elsewhere)."""
    store = DeadLetterStore(res.db)
    while True:
        try:
            metrics.waiting.set(await store.waiting())
        except DependencyUnavailable as exc:
            log.warning("could not count dead letters: %s", exc)
        await asyncio.sleep(DEAD_COUNT_EVERY)


#: Seconds between two sweeps of the per-day counter partitions of days long past.
TIDY_EVERY = 3600.0
#: Past days whose counters are dropped on each sweep (the day before yesterday and older).
TIDY_DAYS = range(2, 9)


async def tidy_counters(res: Resources, dispatcher: Dispatcher, scope: str) -> None:
    """Drop the provider health windows and rate-limit slices of days long past: counter
    tables cannot expire rows, and only their last minutes are read. Idempotent (every
    process may sweep); runs until cancelled."""
    health = HealthStore(res.db, scope)
    while True:
        today = dispatcher.now().date()
        for code in dispatcher.providers:
            for back in TIDY_DAYS:
                day = today - timedelta(days=back)
                try:
                    await health.forget(code, day)
                    await dispatcher.limiter.forget(code, day)
                except DependencyUnavailable as exc:
                    log.warning("old provider counters not dropped: %s", exc)
        await asyncio.sleep(TIDY_EVERY)


def scheduler_of(settings: Settings, res: Resources, batches: Batches) -> Scheduler:
    """The scheduler of the namespace's scheduled batches (run it); it settles the cancelled
    batches it finds (their stats, and their recipients back to the daily quota)."""
    exchange = settings.amqp.exchange
    quota = RecipientQuota(res.db, settings.api.daily_recipient_quota)
    acceptance = Acceptance(batches, Outbox(res.db, exchange), res.broker, refunds=quota)
    return Scheduler(ScheduleStore(res.db, exchange), batches, res.broker, acceptance.settle)


def domain_checker_of(settings: Settings, res: Resources, dns: httpx.AsyncClient) -> DomainChecker:
    """The periodic look-ups of verified sending domains (run it)."""
    return DomainChecker(
        DomainStore(res.db),
        DohResolver(dns, settings.api.dns_url),
        CheckRules.of(settings.api),
        ScheduleStore(res.db, f"{settings.amqp.exchange}:domains"),
        changes=UserChanges(res.broker, wake=DOMAINS_WAKE),
    )


def judge_of(
    settings: Settings,
    res: Resources,
    batches: Batches,
    recipients: Recipients,
    alerter: Alerter | None = None,
    rollouts: LiveRollouts | None = None,
) -> CanaryJudge:
    """The judge of the namespace's template canaries (run it); a template it concludes
    is read again by this process's senders' ``rollouts`` at once."""
    c = settings.consumers
    return CanaryJudge(
        CanaryStore(res.db, settings.amqp.exchange),
        TemplateStore(res.db),
        batches,
        recipients,
        Margins.of(c),
        timedelta(seconds=c.canary_window),
        timedelta(seconds=c.canary_deadline),
        alerter,
        concluded=rollouts.forget if rollouts is not None else tell_nobody,
        attempts=AttemptStore(res.db),
    )


#: Start-up and alert tasks kept referenced until they finish.
_background: set[asyncio.Task[Any]] = set()


async def _probe_query_apis(providers: Mapping[str, Provider], settings: Settings) -> None:
    """Say at start-up which providers' query APIs cannot settle ambiguous sends."""
    window = settings.providers.webhook_window
    for code, provider in providers.items():
        try:
            available = await provider.lookup_available()
        except ProviderError as exc:
            log.warning("could not check %s's query API: %s", provider.name, exc)
            continue
        if not available:
            log.warning(
                "%s (%s) has no query API on this account (SendGrid: the Email Activity "
                "History add-on): a send whose outcome is unknown is resolved by webhooks "
                "alone, so recipients without any event are sent through the next provider "
                "only after SAFEDELIVR_PROVIDERS_WEBHOOK_WINDOW (%ds)",
                provider.name,
                code,
                window,
            )


def create_app(settings: Settings, *, fault_points: FaultPoints = no_faults) -> Starlette:
    registry = new_registry()
    metrics = DispatchMetrics.create(registry)
    dead_metrics = DeadLetterMetrics.create(registry)
    live_metrics = LiveMetrics.create(registry)
    stalls = StallMetrics.create(registry)
    # The per-recipient answers the consumers apply count beside the webhooks' events.
    ingest_metrics = IngestMetrics.create(registry)
    inflight = InFlight()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with (
            open_resources(settings, name="safedelivr-consumers") as res,
            alert_http() as alert_client,
            httpx.AsyncClient(timeout=DNS_TIMEOUT, follow_redirects=False) as dns_http,
        ):
            app.state.resources = res
            exchange = settings.amqp.exchange
            # Configured from the live settings once start_consumers has loaded them.
            alerter = alerter_for(
                settings, res, alert_client, functools.partial(alert_config, None)
            )
            started = await start_consumers(
                settings,
                res,
                inflight,
                metrics,
                fault_points=fault_points,
                dead_metrics=dead_metrics,
                live_metrics=live_metrics,
                alerter=alerter,
                ingest_metrics=ingest_metrics,
            )
            alerter.config = started.applier.alert_config
            dispatcher = started.dispatcher
            scheduler = scheduler_of(settings, res, dispatcher.batches)
            await res.broker.listen(scheduler.loop.heard)
            roll_up = RollUp(StatsStore(res.db, settings.stats.buckets))
            await res.broker.listen(roll_up.heard)
            await res.broker.listen(started.applier.heard)
            health = tell_refreshers(HealthStore(res.db, settings.amqp.exchange), res.broker)
            log.info("consuming %s", ", ".join(settings.providers.chain_codes))
            tasks = [
                asyncio.create_task(count_dead_letters(res, dead_metrics)),
                asyncio.create_task(started.watcher.run()),
                asyncio.create_task(started.applier.keep_health(health)),
                asyncio.create_task(watch_queues(res, started.applier, alerter)),
                asyncio.create_task(tidy_counters(res, dispatcher, exchange)),
                asyncio.create_task(roll_up.run()),
                asyncio.create_task(scheduler.loop.run()),
                asyncio.create_task(domain_checker_of(settings, res, dns_http).run()),
                asyncio.create_task(
                    judge_of(
                        settings,
                        res,
                        dispatcher.batches,
                        dispatcher.recipients,
                        alerter,
                        dispatcher.rollouts,
                    ).run()
                ),
            ]
            if dispatcher.ingest is not None:
                # What providers answered recipient by recipient counts for their health.
                tasks.append(asyncio.create_task(dispatcher.ingest.reports.keep_adding(health)))
            try:
                with watching(stalls):
                    yield
            finally:
                for task in tasks:
                    task.cancel()
                # Awaited while the database is open: the scheduler releases its lease.
                await asyncio.gather(*tasks, return_exceptions=True)
                await res.broker.stop_consuming()
                if not await inflight.wait_idle(DRAIN_TIMEOUT):
                    log.warning(
                        "%d deliveries still in flight; they will be redelivered", inflight.count
                    )
                await close_all(dispatcher.providers)

    routes = health_routes(
        "consumers",
        registry,
        lambda request: readiness_checks(request.app.state.resources),
        settings.metrics_token,
    )
    return Starlette(routes=routes, lifespan=lifespan)
