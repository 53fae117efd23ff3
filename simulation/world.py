"""The simulated deployment: the services' real code in simulated processes, over the twins.

Processes and what each runs (as ``services.cli`` runs them in production):

* ``api``: accepting batches (:class:`services.api.sending.Sending` over
  :class:`shared.delivery.acceptance.Acceptance`), campaigns and their runner, the outbox relay;
* ``consumers-a`` and ``consumers-b``: the splitter, the provider senders
  (:class:`services.consumers.dispatch.Dispatcher`), the scheduler and the canary judge,
  each consuming every queue, so two deliveries of one job can run at once;
* ``webhooks``: the providers' webhook intake (:class:`services.webhooks.intake.Intake`,
  :class:`shared.ingest.ingest.Ingest`), its queue's consumer, the tracking endpoint;
* ``hooks``: the users' webhook worker (:class:`services.hooks.worker.Worker`).

The twins' tables are the "disks" every incarnation shares; everything else (caches, the
relay's memory, deliveries in flight) belongs to an incarnation and dies with it. What comes
from outside (clients, providers' webhook posts, users' endpoints) is in
``simulation.front``; running the world until it is quiet, in ``simulation.periodic``.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from services.api.campaign_runner import CampaignRunner
from services.api.campaigns import Campaigns
from services.api.capping import Caps
from services.api.sending import Sending
from services.api.templated import TemplateBatches
from services.consumers.campaign_hold import CampaignHold
from services.consumers.canary_judge import CanaryJudge
from services.consumers.dispatch import Dispatcher
from services.consumers.running import Running
from services.consumers.scheduler import Scheduler
from services.consumers.splitter import Splitter
from services.consumers.template_rollouts import LiveRollouts
from services.hooks.worker import Worker
from services.webhooks.intake import Intake
from shared.delivery.acceptance import Acceptance
from shared.delivery.handoff import HandOff, Routing
from shared.delivery.outbox import Relay
from shared.infra.background import Background
from shared.infra.current import Current
from shared.infra.resources import topology_for
from shared.infra.settle import Delivery, run
from shared.ingest.ingest import Ingest
from shared.outbound.user_hooks import HookEmitter
from shared.templates.canary import Margins
from simulation import front, periodic
from simulation.broker import SimBroker, SimMessage
from simulation.config import Config, metrics, settings_for
from simulation.faults import Schedule
from simulation.front import Reply, UserEndpoint
from simulation.processes import Gate, Incarnation, Process
from simulation.providers import Ledger, SimProvider
from simulation.runtime import VirtualClock
from tests.fakes.accounts import FakePreferences, FakeQuota
from tests.fakes.api import FakeCapStore, FakeContactLists, FakeIdempotencyStore, FakeRecentMail
from tests.fakes.audience import CampaignTables, FakeCampaigns, FakeSuppressions
from tests.fakes.cassandra import FakeCassandra
from tests.fakes.delivery import (
    FakeAttempts,
    FakeBatches,
    FakeOutbox,
    FakeRecipients,
    FakeSchedule,
    FakeStats,
    ScheduleTables,
)
from tests.fakes.outbound import FakeHookQueue, FakeHookStore, emitter_over
from tests.fakes.renderer import InlineRenderer
from tests.fakes.templates import CanaryTables, FakeCanary, FakeTemplates
from tests.fakes.webhooks import FakeTimeline, FakeWebhookTokens

log = logging.getLogger(__name__)

#: The processes of a simulated deployment, in the order they boot.
PROCESSES = ("api", "consumers-a", "consumers-b", "webhooks", "hooks")


@dataclass
class ApiState:
    sending: Sending
    relay: Relay
    campaigns: Campaigns
    runner: CampaignRunner


@dataclass
class ConsumerState:
    dispatcher: Dispatcher
    scheduler: Scheduler
    judge: CanaryJudge


@dataclass
class WebhookState:
    intake: Intake
    ingest: Ingest


class ServerClock:
    """Cassandra's clock, for twins that keep server time (leases, TTLs)."""

    def __init__(self, now: Callable[[], datetime]) -> None:
        self.now = now


class World:
    def __init__(
        self, schedule: Schedule, config: Config, clock: VirtualClock, *, record: bool
    ) -> None:
        self.schedule = schedule
        self.config = config
        self.clock = clock
        self.gate = Gate(schedule, record=record)
        skews = {s.target: s.seconds for s in schedule.skews}
        cassandra_skew = timedelta(seconds=skews.get("cassandra", 0.0))
        self.settings = settings_for(config)
        self.db = FakeCassandra(now=lambda: clock.now() + cassandra_skew, wire=self.gate)
        self.stats = FakeStats(self.db, self.settings.stats.buckets)
        self.batches = FakeBatches(self.db, self.stats)
        self.recipients = FakeRecipients(self.db, self.stats)
        self.attempts = FakeAttempts(self.db)
        self.suppressions = FakeSuppressions(self.db)
        self.timeline = FakeTimeline(self.db)
        self.tokens = FakeWebhookTokens(self.db)
        self.outbox = FakeOutbox(self.db, self.settings.amqp.exchange)
        self.quota = FakeQuota(self.db, config.quota)
        self.recent = FakeRecentMail(self.db)
        self.preferences = FakePreferences(self.db)
        """The users' preferences as a scenario sets them (each API process reads them
        through its own cache)."""
        self.unsubscribed: list[tuple[uuid.UUID, str, float]] = []
        """(user, address, when) of each one-click unsubscribe a reader was answered."""
        self.accounts = FakeCassandra(wire=self.gate)
        self.idempotency = FakeIdempotencyStore(
            self.accounts, lease=self.settings.api.idempotency_lease
        )
        server = ServerClock(self.db.now)
        self.schedule_tables = ScheduleTables(clock=server, wire=self.gate)  # type: ignore[arg-type]
        self.campaign_tables = CampaignTables(wire=self.gate)
        self.canary_tables = CanaryTables(wire=self.gate)
        self.templates = FakeTemplates(wire=self.gate)
        self.lists = FakeContactLists(wire=self.gate)
        self.caps = FakeCapStore(wire=self.gate)
        namespace = self.settings.amqp.exchange
        self.campaign_store = FakeCampaigns(namespace, self.campaign_tables)
        self.hook_store = FakeHookStore(self.db.now, self.gate)
        self.hook_queue = FakeHookQueue(self.db.now, self.gate)
        self.endpoint = UserEndpoint(self.gate)
        self.broker = SimBroker(topology_for(self.settings), self.gate)
        self.ledger = Ledger()
        self.providers = {
            code: SimProvider(
                code,
                self.gate,
                self.ledger,
                self.receive_webhook,
                query_api=code in config.query_api,
                timeout=self.settings.providers.timeout,
                event_delays=config.event_delays,
                script=list(config.scripts.get(code, ())),
                duplicate_posts=config.duplicate_posts,
                relay=code in config.relays,
            )
            for code in self.settings.providers.chain_codes
        }
        self.gate.outages = config.outages
        self.gate.on_disconnect = self.broker.disconnected
        self.processes: dict[str, Process] = {}
        starts: dict[str, Callable[[Incarnation], Awaitable[None]]] = {
            "api": self._start_api,
            "consumers-a": self._start_consumers,
            "consumers-b": self._start_consumers,
            "webhooks": self._start_webhooks,
            "hooks": self._start_hooks,
        }
        for name in PROCESSES:
            self.processes[name] = Process(
                name, starts[name], skew=skews.get(name, 0.0), on_death=[self.broker.died]
            )
        self.api: dict[Incarnation, ApiState] = {}
        self.consumers: dict[Incarnation, ConsumerState] = {}
        self.hook_workers: dict[Incarnation, Worker] = {}
        self.webhooks: dict[Incarnation, WebhookState] = {}
        self.due_at: dict[tuple[str, str], float] = {}
        """When each process's periodic work is next due (``simulation.periodic``)."""
        self.requests_in_flight = 0
        self.answers_to_lose = config.answers_lost
        self.errors: list[str] = []

    # -- processes ------------------------------------------------------------------------

    async def boot(self) -> None:
        for process in self.processes.values():
            process.spawn(process.boot())
        await asyncio.sleep(0)

    def _now(self, process: Process) -> Callable[[], datetime]:
        return lambda: self.clock.now() + timedelta(seconds=process.skew)

    async def _start_api(self, inc: Incarnation) -> None:
        m = metrics()
        namespace = self.settings.amqp.exchange
        api = self.settings.api
        acceptance = Acceptance(
            self.batches,
            self.outbox,
            self.broker,  # type: ignore[arg-type]
            refunds=self.quota,
            decide_within=timedelta(seconds=api.commit_budget + api.outbox_grace),
            # Marks written at the next turn of the loop, not 50 ms later: a row left pending
            # meanwhile would start the relay's first pass (an hour of minutes, 240 reads,
            # each a fault point) in every scenario. What a mark's loss does is the same.
            mark_window=0.0,
        )
        sending = Sending(
            settings=self.settings,
            acceptance=acceptance,
            batches=self.batches,
            suppressions=self.suppressions,
            idempotency=self.idempotency,
            quota=self.quota,  # type: ignore[arg-type]
            metrics=m.api,
            background=Background(),
            preferences=FakePreferences(self.db),
            recent=self.recent,
            templates=TemplateBatches(self.templates, InlineRenderer()),
            schedules=FakeSchedule(namespace, self.schedule_tables),
            canaries=FakeCanary(namespace, self.canary_tables),
        )
        relay = Relay(self.outbox, acceptance.finish, grace=self.settings.api.outbox_grace)
        campaigns = Campaigns(
            self.campaign_store,
            self.templates,
            self.lists,
            self.batches,  # type: ignore[arg-type]
            sending,
            Caps(self.caps, self.settings.caps, clock=self._now(inc.process)),
        )
        runner = CampaignRunner(
            self.campaign_store,
            self.lists,
            self.templates,
            sending,
            FakeSchedule(f"{namespace}:campaigns", self.schedule_tables),
            clock=self._now(inc.process),
        )
        self.api[inc] = ApiState(sending, relay, campaigns, runner)

    async def _start_consumers(self, inc: Incarnation) -> None:
        process = inc.process
        namespace = self.settings.amqp.exchange
        # No live settings here: the consumers run on the env's values for good.
        running = Current(Running.start(self.settings.providers))
        # Providers' answers recipient by recipient go through an ingest of the process's
        # own, as in ``services.consumers.main``.
        ingest = Ingest(
            batches=self.batches,
            recipients=self.recipients,
            suppressions=self.suppressions,
            timeline=self.timeline,
            handoff=HandOff(
                self.attempts,
                self.recipients,
                self.broker,  # type: ignore[arg-type]
                running,
                self.settings.providers.backoff_tiers,
            ),
            broker=self.broker,  # type: ignore[arg-type]
            settings=self.settings,
            metrics=metrics().ingest,
            hooks=self._emitter(),
        )
        now = self._now(process)
        # Kept by the process's own (virtual) clock, as its real one would keep them.
        rollouts = LiveRollouts(self.templates, clock=lambda: now().timestamp())
        dispatcher = Dispatcher(
            broker=self.broker,  # type: ignore[arg-type]
            batches=self.batches,
            attempts=self.attempts,
            providers=self.providers,
            settings=self.settings.providers,
            metrics=metrics().dispatch,
            recipients=self.recipients,
            suppressions=self.suppressions,
            running=running,
            deferred_deadline=self.settings.webhooks.deferred_deadline,
            campaigns=CampaignHold(self.campaign_store),
            user_hooks=self._emitter(),
            ingest=ingest,
            now=self._now(process),
            rollouts=rollouts,
        )
        splitter = Splitter(
            self.broker,  # type: ignore[arg-type]
            self.batches,
            running,
        )
        settle = Acceptance(
            self.batches,
            self.outbox,
            self.broker,  # type: ignore[arg-type]
            refunds=self.quota,
        ).settle
        scheduler = Scheduler(
            FakeSchedule(namespace, self.schedule_tables),
            self.batches,
            self.broker,  # type: ignore[arg-type]
            settle,
            clock=self._now(process),
        )
        c = self.settings.consumers
        judge = CanaryJudge(
            FakeCanary(namespace, self.canary_tables),
            self.templates,
            self.batches,
            self.recipients,
            Margins.of(c),
            timedelta(seconds=c.canary_window),
            timedelta(seconds=c.canary_deadline),
            clock=self._now(process),
            concluded=rollouts.forget,
            attempts=self.attempts,
        )
        self.consumers[inc] = ConsumerState(dispatcher, scheduler, judge)
        t = self.broker.topology
        self._consume(inc, t.batches_queue, splitter.process)
        for code in self.settings.providers.chain_codes:
            for queue in t.sender_queues(code):
                self._consume(inc, queue, dispatcher.process)

    async def _start_webhooks(self, inc: Incarnation) -> None:
        handoff = HandOff(
            self.attempts,
            self.recipients,
            self.broker,  # type: ignore[arg-type]
            Current(Routing.start(self.settings.providers)),
            self.settings.providers.backoff_tiers,
        )
        ingest = Ingest(
            batches=self.batches,
            recipients=self.recipients,
            suppressions=self.suppressions,
            timeline=self.timeline,
            handoff=handoff,
            broker=self.broker,  # type: ignore[arg-type]
            settings=self.settings,
            metrics=metrics().ingest,
            hooks=self._emitter(),
        )
        intake = Intake(self.tokens, self.broker, ingest, metrics().intake)  # type: ignore[arg-type]
        self.webhooks[inc] = WebhookState(intake, ingest)
        self._consume(inc, self.broker.topology.webhooks_queue, intake.process, hold=None)

    def _emitter(self) -> HookEmitter:
        """An incarnation's emitter of users' webhook events (its endpoint cache its own)."""
        return emitter_over(self.hook_store, self.hook_queue, self.broker, cache_seconds=5.0)

    async def _start_hooks(self, inc: Incarnation) -> None:
        worker = Worker(
            store=self.hook_store,
            queue=self.hook_queue,
            broker=self.broker,  # type: ignore[arg-type]
            deliverer=self.endpoint,  # type: ignore[arg-type]
            settings=self.settings.hooks,
            lease_seconds=max(30, int(self.settings.hooks.timeout * 3)),
        )
        self.hook_workers[inc] = worker
        self._consume(inc, self.broker.topology.hooks_queue, worker.handle)

    def _consume(
        self,
        inc: Incarnation,
        queue: str,
        process: Callable[[Any, Delivery], Awaitable[None]],
        *,
        hold: float | None = 600.0,
    ) -> None:
        async def handle(message: SimMessage) -> None:
            await run(process, message, hold=hold)  # type: ignore[arg-type]

        inc.process.spawn(self.broker.consume(queue, handle), inc)

    # -- the outside world ----------------------------------------------------------------

    # -- running until nothing is left ------------------------------------------------------

    # -- the world outside (``simulation.front``) and running it (``simulation.periodic``) --

    async def receive_webhook(self, code: str, raw: bytes) -> tuple[int, str | None]:
        """A provider posts ``raw`` to our webhook service: what it heard back."""
        return await front.receive_webhook(self, code, raw)

    async def request(self, user_id: uuid.UUID, body: dict[str, Any], key: str | None) -> Reply:
        """``POST /v1/batches`` as a client sees it."""
        return await front.request(self, user_id, body, key)

    async def call(self, what: str, handler: Callable[[ApiState], Awaitable[Any]]) -> Reply:
        """One API request as its client sees it."""
        return await front.call(self, what, handler)

    async def tracked(self, handler: Callable[[WebhookState], Awaitable[Any]]) -> Reply:
        """A request to the tracking endpoint as a reader's mail client sees it."""
        return await front.tracked(self, handler)

    async def quiesce(self, horizon: float = 10 * 24 * 3600.0) -> bool:
        """Run until nothing is left to do; False if something still is at ``horizon``."""
        return await periodic.quiesce(self, horizon)

    def faulted_processes(self) -> set[str]:
        """Processes that met a fault in this run."""
        return {s.process for s in self.gate.steps if s.fault is not None}
