"""The simulated deployment: the services' real code in simulated processes, over the twins.

Processes and what each runs (as ``services.cli`` runs them in production):

* ``api``: accepting batches (:class:`services.api.sending.Sending` over
  :class:`shared.acceptance.Acceptance`) and the outbox relay;
* ``consumers-a`` and ``consumers-b``: the splitter and the provider senders
  (:class:`services.consumers.dispatch.Dispatcher`), each consuming every queue, so two
  deliveries of one job can run at once;
* ``webhooks``: the providers' webhook intake (:class:`services.webhooks.intake.Intake`,
  :class:`services.webhooks.ingest.Ingest`) and its queue's consumer.

The twins' tables are the "disks" every incarnation shares; everything else (caches, the
relay's memory, deliveries in flight) belongs to an incarnation and dies with it. Clients
are outside every process: a request is handled in the ``api`` process and its answer is a
step that can be lost. Periodic work (the relay's passes) is run by the world when it is due
and has something to look at, so a quiet world costs nothing however long it waits.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from prometheus_client import CollectorRegistry

from services.api.campaign_runner import PASS_EVERY as RUNNER_EVERY
from services.api.campaign_runner import CampaignRunner
from services.api.campaigns import Campaigns
from services.api.sending import Sending
from services.api.templated import TemplateBatches
from services.consumers.campaign_hold import CampaignHold
from services.consumers.canary_judge import JUDGE_EVERY, CanaryJudge
from services.consumers.dispatch import Dispatcher
from services.consumers.scheduler import PASS_EVERY as SCHEDULER_EVERY
from services.consumers.scheduler import Scheduler
from services.consumers.splitter import Splitter
from services.hooks.worker import Worker
from services.webhooks.ingest import Ingest, IngestMetrics
from services.webhooks.intake import Intake, IntakeMetrics
from shared.acceptance import Acceptance
from shared.background import Background
from shared.batchstore import shown_status
from shared.canary import Margins
from shared.config import ApiSettings, ConsumerSettings, ProviderSettings, Settings, WebhookSettings
from shared.errors import DependencyUnavailable
from shared.handoff import HandOff
from shared.hook_delivery import Outcome
from shared.http import ApiError
from shared.metrics import ApiMetrics, DispatchMetrics
from shared.outbox import Relay
from shared.resources import topology_for
from shared.settle import Delivery, Poison, run
from shared.user_hooks import HookEmitter, wake
from simulation.broker import SimBroker, SimMessage
from simulation.faults import Schedule
from simulation.processes import Gate, Incarnation, Killed, Process
from simulation.providers import Ledger, SimProvider
from simulation.runtime import VirtualClock
from tests.fakes.acceptance_stores import FakeOutbox, FakePreferences, FakeQuota, FakeRecentMail
from tests.fakes.account_stores import AccountTables, FakeIdempotencyStore
from tests.fakes.campaign_store import CampaignTables, FakeCampaigns
from tests.fakes.canary_store import CanaryTables, FakeCanary
from tests.fakes.contact_lists import FakeContactLists
from tests.fakes.hooks import FakeHookQueue, FakeHookStore, emitter_over
from tests.fakes.schedule_store import FakeSchedule, ScheduleTables
from tests.fakes.stores import (
    FakeAttempts,
    FakeBatches,
    FakeCassandra,
    FakeRecipients,
    FakeStats,
    FakeSuppressions,
    FakeTimeline,
    FakeWebhookTokens,
)
from tests.fakes.template_store import FakeTemplates

log = logging.getLogger(__name__)

#: The processes of a simulated deployment, in the order they boot.
PROCESSES = ("api", "consumers-a", "consumers-b", "webhooks", "hooks")


@dataclass(frozen=True)
class Config:
    """What a scenario may set about the deployment."""

    chain: str = "sg,mg"
    max_attempts: int = 4
    query_api: tuple[str, ...] = ("sg", "mg")
    """Providers whose query API the account can use."""
    event_delays: tuple[float, ...] = (1.0, 4.0, 8.0)
    resolve_interval: int = 30
    query_after: int = 300
    webhook_window: int = 3600
    deferred_deadline: int = 4 * 3600
    quota: int = 100_000
    scripts: dict[str, tuple[str | None, ...]] = field(default_factory=dict)
    """How each provider's first calls go whatever the schedule (``send`` fault kinds)."""
    duplicate_posts: bool = False
    """Whether the providers deliver every webhook post twice."""
    outages: tuple[tuple[float, float], ...] = ()
    """Windows (start, seconds) in which Cassandra answers nothing."""
    answers_lost: int = 0
    """How many of the API's first answers never reach their client, whatever the schedule."""


@dataclass
class Metrics:
    """Prometheus metrics, made once per OS process (what they count is not judged)."""

    api: ApiMetrics
    dispatch: DispatchMetrics
    ingest: IngestMetrics
    intake: IntakeMetrics

    @classmethod
    def create(cls) -> Metrics:
        registry = CollectorRegistry()
        return cls(
            ApiMetrics.create(registry),
            DispatchMetrics.create(registry),
            IngestMetrics.create(registry),
            IntakeMetrics.create(registry),
        )


_METRICS: list[Metrics] = []


def metrics() -> Metrics:
    if not _METRICS:
        _METRICS.append(Metrics.create())
    return _METRICS[0]


@dataclass
class Reply:
    """What a client heard: a status (0: the connection broke) and the body or error code."""

    status: int
    body: dict[str, Any] | None = None
    code: str | None = None
    retry_after: float | None = None
    asked_at: float = 0.0
    """When (seconds into the run, by the true clock) the client sent the request."""


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


@dataclass
class Endpoint:
    """A user's webhook endpoint, as the hooks worker's deliveries reach it (a ``hook`` step:
    it may answer 503 having taken nothing, or take the event and lose its answer)."""

    gate: Gate
    received: dict[str, list[str]] = field(default_factory=dict)
    """url -> webhook-ids in the order they first arrived (each once)."""
    first_at: dict[str, datetime] = field(default_factory=dict)
    """webhook-id -> when it first arrived."""

    async def send(
        self, url: str, msg_id: str, body: bytes, secrets: Sequence[str], now: float
    ) -> Outcome:
        fault = self.gate.enter(f"hook:{url.rsplit('/', 1)[-1]}", "hook")
        await self.gate.pause()
        if fault == "fail":
            return Outcome(503, None, 5)
        got = self.received.setdefault(url, [])
        if msg_id not in got:
            got.append(msg_id)
            self.first_at[msg_id] = datetime.now(UTC)
        if fault == "accept_fail":
            return Outcome(None, "read timeout (the endpoint took it)", 10_000)
        self.gate.die_if(fault)
        return Outcome(200, None, 5)


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
        self.settings = _settings(config)
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
        self.accounts = AccountTables(wire=self.gate)
        self.idempotency = FakeIdempotencyStore(
            self.accounts, lease=self.settings.api.idempotency_lease
        )
        server = ServerClock(self.db.now)
        self.schedule_tables = ScheduleTables(clock=server, wire=self.gate)  # type: ignore[arg-type]
        self.campaign_tables = CampaignTables(wire=self.gate)
        self.canary_tables = CanaryTables(wire=self.gate)
        self.templates = FakeTemplates(wire=self.gate)
        self.lists = FakeContactLists(wire=self.gate)
        namespace = self.settings.amqp.exchange
        self.campaign_store = FakeCampaigns(namespace, self.campaign_tables)
        self.hook_store = FakeHookStore(self.db.now, self.gate)
        self.hook_queue = FakeHookQueue(self.db.now, self.gate)
        self.endpoint = Endpoint(self.gate)
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
        self._due: dict[tuple[str, str], float] = {}
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
            self.batches,  # type: ignore[arg-type]
            self.outbox,  # type: ignore[arg-type]
            self.broker,  # type: ignore[arg-type]
            refunds=self.quota,
            decide_within=timedelta(seconds=api.commit_budget + api.outbox_grace),
        )
        sending = Sending(
            settings=self.settings,
            acceptance=acceptance,
            batches=self.batches,  # type: ignore[arg-type]
            suppressions=self.suppressions,  # type: ignore[arg-type]
            idempotency=self.idempotency,  # type: ignore[arg-type]
            quota=self.quota,  # type: ignore[arg-type]
            metrics=m.api,
            background=Background(),
            preferences=FakePreferences(self.db),  # type: ignore[arg-type]
            recent=self.recent,  # type: ignore[arg-type]
            templates=TemplateBatches(self.templates),  # type: ignore[arg-type]
            schedules=FakeSchedule(namespace, self.schedule_tables),  # type: ignore[arg-type]
            canaries=FakeCanary(namespace, self.canary_tables),  # type: ignore[arg-type]
        )
        relay = Relay(self.outbox, acceptance.finish, grace=self.settings.api.outbox_grace)  # type: ignore[arg-type]
        campaigns = Campaigns(
            self.campaign_store,  # type: ignore[arg-type]
            self.templates,  # type: ignore[arg-type]
            self.lists,  # type: ignore[arg-type]
            self.batches,  # type: ignore[arg-type]
            sending,
        )
        runner = CampaignRunner(
            self.campaign_store,  # type: ignore[arg-type]
            self.lists,  # type: ignore[arg-type]
            self.templates,  # type: ignore[arg-type]
            sending,
            FakeSchedule(f"{namespace}:campaigns", self.schedule_tables),  # type: ignore[arg-type]
            clock=self._now(inc.process),
        )
        self.api[inc] = ApiState(sending, relay, campaigns, runner)

    async def _start_consumers(self, inc: Incarnation) -> None:
        process = inc.process
        namespace = self.settings.amqp.exchange
        dispatcher = Dispatcher(
            broker=self.broker,  # type: ignore[arg-type]
            batches=self.batches,  # type: ignore[arg-type]
            attempts=self.attempts,  # type: ignore[arg-type]
            providers=self.providers,
            settings=self.settings.providers,
            metrics=metrics().dispatch,
            recipients=self.recipients,  # type: ignore[arg-type]
            deferred_deadline=self.settings.webhooks.deferred_deadline,
            campaigns=CampaignHold(self.campaign_store),  # type: ignore[arg-type]
            user_hooks=self._emitter(),
            now=self._now(process),
        )
        splitter = Splitter(
            self.broker,  # type: ignore[arg-type]
            self.batches,  # type: ignore[arg-type]
            self.settings.providers.chain_codes[0],
        )
        settle = Acceptance(
            self.batches,  # type: ignore[arg-type]
            self.outbox,  # type: ignore[arg-type]
            self.broker,  # type: ignore[arg-type]
            refunds=self.quota,
        ).settle
        scheduler = Scheduler(
            FakeSchedule(namespace, self.schedule_tables),  # type: ignore[arg-type]
            self.batches,  # type: ignore[arg-type]
            self.broker,  # type: ignore[arg-type]
            settle,
            clock=self._now(process),
        )
        c = self.settings.consumers
        judge = CanaryJudge(
            FakeCanary(namespace, self.canary_tables),  # type: ignore[arg-type]
            self.templates,  # type: ignore[arg-type]
            self.batches,  # type: ignore[arg-type]
            self.recipients,  # type: ignore[arg-type]
            Margins(
                provider_failures=c.canary_margin_failures,
                hard_bounces=c.canary_margin_bounces,
                complaints=c.canary_margin_complaints,
                min_sent=c.canary_min_sent,
            ),
            timedelta(seconds=c.canary_window),
            timedelta(seconds=c.canary_deadline),
            clock=self._now(process),
        )
        self.consumers[inc] = ConsumerState(dispatcher, scheduler, judge)
        t = self.broker.topology
        self._consume(inc, t.batches_queue, splitter.process)
        for code in self.settings.providers.chain_codes:
            for queue in t.sender_queues(code):
                self._consume(inc, queue, dispatcher.process)

    async def _start_webhooks(self, inc: Incarnation) -> None:
        handoff = HandOff(
            self.attempts,  # type: ignore[arg-type]
            self.recipients,  # type: ignore[arg-type]
            self.broker,  # type: ignore[arg-type]
            self.settings.providers.chain_codes,
            self.settings.providers.max_attempts,
        )
        ingest = Ingest(
            batches=self.batches,  # type: ignore[arg-type]
            recipients=self.recipients,  # type: ignore[arg-type]
            suppressions=self.suppressions,  # type: ignore[arg-type]
            timeline=self.timeline,  # type: ignore[arg-type]
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
            store=self.hook_store,  # type: ignore[arg-type]
            queue=self.hook_queue,  # type: ignore[arg-type]
            broker=self.broker,  # type: ignore[arg-type]
            deliverer=self.endpoint,  # type: ignore[arg-type]
            settings=self.settings.hooks,
            lease_seconds=max(30, int(self.settings.hooks.timeout * 3)),
        )
        self.hook_workers[inc] = worker
        self._consume(inc, self.broker.topology.hooks_queue, worker.handle)

    async def _sweep(self, worker: Worker) -> None:
        """One pass of the hooks process's sweep (``services.hooks.main.sweep``)."""
        async for user_id, endpoint_id in worker.store.every_endpoint():
            if await worker.has_work(endpoint_id):
                await wake(worker.broker, user_id, endpoint_id)

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

    async def receive_webhook(self, code: str, raw: bytes) -> tuple[int, str | None]:
        """A provider posts ``raw`` to our webhook service: what it heard back."""
        process = self.processes["webhooks"]

        async def handle() -> tuple[int, str | None]:
            fault = self.gate.enter(f"webhook:{code}", "webhook")
            await self.gate.pause()
            if fault in ("fail", "late"):
                return 0, fault
            self.gate.die_if(fault)
            state = self.webhooks.get(process.current)
            if state is None:
                return 503, fault
            try:
                await state.intake.receive(code, raw)
            except ApiError as exc:
                return exc.status, fault
            except DependencyUnavailable:
                return 503, fault
            return 200, fault

        task = process.spawn(handle())
        try:
            answered: tuple[int, str | None] = await task
        except (Killed, asyncio.CancelledError):
            return 0, None
        return answered

    async def request(self, user_id: uuid.UUID, body: dict[str, Any], key: str | None) -> Reply:
        """``POST /v1/batches`` as a client sees it."""

        async def accept(state: ApiState) -> dict[str, Any]:
            return await state.sending.accept(user_id, body, key)

        return await self.call("POST /v1/batches", accept)

    async def call(self, what: str, handler: Callable[[ApiState], Awaitable[Any]]) -> Reply:
        """One API request, handled in the ``api`` process, as its client sees it: the
        answer (a 2xx with the handler's result) is a step that can be lost."""
        process = self.processes["api"]

        async def handle() -> Reply:
            state = self.api.get(process.current)
            if state is None:
                return Reply(0)
            try:
                answer = await handler(state)
                reply = Reply(202 if what == "POST /v1/batches" else 200, _body(answer))
            except ApiError as exc:
                after = (exc.headers or {}).get("Retry-After")
                reply = Reply(exc.status, None, exc.code, float(after) if after else None)
            except DependencyUnavailable:
                reply = Reply(503, None, "unavailable")
            fault = self.gate.enter(f"answer:{what}", "answer")
            await self.gate.pause()
            if fault is None and self.answers_to_lose > 0 and what == "POST /v1/batches":
                self.answers_to_lose -= 1
                fault = "lost"
            if fault == "lost":
                return Reply(0)
            self.gate.die_if(fault)
            return reply

        self.requests_in_flight += 1
        asked_at = asyncio.get_running_loop().time()
        try:
            reply: Reply = await process.spawn(handle())
        except (Killed, asyncio.CancelledError):
            reply = Reply(0)
        finally:
            self.requests_in_flight -= 1
        reply.asked_at = asked_at
        return reply

    async def tracked(self, handler: Callable[[WebhookState], Awaitable[Any]]) -> Reply:
        """A request to the tracking endpoint (the webhooks service), as a reader's mail
        client sees it."""
        process = self.processes["webhooks"]

        async def handle() -> Reply:
            state = self.webhooks.get(process.current)
            if state is None:
                return Reply(0)
            try:
                await handler(state)
            except DependencyUnavailable:
                return Reply(503, None, "unavailable")
            fault = self.gate.enter("answer:POST /u/<token>", "answer")
            await self.gate.pause()
            if fault == "lost":
                return Reply(0)
            self.gate.die_if(fault)
            return Reply(200)

        self.requests_in_flight += 1
        try:
            reply: Reply = await process.spawn(handle())
        except (Killed, asyncio.CancelledError):
            return Reply(0)
        finally:
            self.requests_in_flight -= 1
        return reply

    # -- running until nothing is left ------------------------------------------------------

    def faulted_processes(self) -> set[str]:
        """Processes that met a fault in this run."""
        return {s.process for s in self.gate.steps if s.fault is not None}

    def busy(self) -> bool:
        return bool(
            self.broker.busy()
            or self.requests_in_flight
            or any(p.pending_posts for p in self.providers.values())
            or any(p.restarting for p in self.processes.values())
            or self._periodic()
        )

    def _periodic(self) -> list[tuple[str, str, float]]:
        """The periodic work that has something to look at: (process, what, every)."""
        work: list[tuple[str, str, float]] = []
        if self.outbox.pending():
            work.append(("api", "relay", self.settings.api.outbox_relay_interval))
        if any(self.campaign_tables.runs.values()):
            work.append(("api", "campaigns", RUNNER_EVERY))
        if self._schedule_open():
            for name in ("consumers-a", "consumers-b"):
                work.append((name, "scheduler", SCHEDULER_EVERY))
        if self._hooks_waiting():
            work.append(("hooks", "sweep", self.settings.hooks.sweep_interval))
        if any(self.canary_tables.rollouts.values()):
            for name in ("consumers-a", "consumers-b"):
                work.append((name, "judge", JUDGE_EVERY))
        return work

    def _schedule_open(self) -> bool:
        """Whether the scheduler has anything left to do: a batch in a minute past its
        cursor that is not yet started, or started and not yet split (a pass that died after
        starting it publishes it again). A quiet scheduler passing every second over minutes
        it already handed on changes nothing, so the world does not run those passes."""
        namespace = self.settings.amqp.exchange
        cursor = self.schedule_tables.cursors.get(namespace)
        for (ns, minute), rows in self.schedule_tables.rows.items():
            if ns != namespace or (cursor is not None and minute <= cursor):
                continue
            for batch_id in rows:
                header = self.db.headers.get(batch_id)
                status = shown_status(
                    header.get("status") if header else None,
                    header.get("dispatched") if header else None,
                )
                if status in ("scheduled", "pending", "accepted"):
                    return True
        return False

    def _passes(self) -> None:
        """Start the periodic work that is due and has something to look at."""
        now = asyncio.get_running_loop().time()
        for name, what, every in self._periodic():
            process = self.processes[name]
            if now < self._due.get((name, what), 0.0) or not process.current.alive:
                continue
            work = self._pass(process.current, what)
            if work is not None:
                self._due[(name, what)] = now + every
                process.spawn(_quietly(work))

    def _hooks_waiting(self) -> bool:
        """Whether an event waits in a user's endpoint queue (not yet delivered)."""
        now = self.db.now()
        return any(
            (row.read(now) or {}).get("done") is False
            for rows in self.hook_queue.queue.values()
            for row in rows.values()
        )

    def _pass(self, inc: Incarnation, what: str) -> Callable[[], Awaitable[Any]] | None:
        """The pass ``what`` of the incarnation's service (None: it has not started)."""
        if what == "sweep":
            worker = self.hook_workers.get(inc)
            return None if worker is None else lambda: self._sweep(worker)
        if what in ("relay", "campaigns"):
            api = self.api.get(inc)
            if api is None:
                return None
            return api.relay.once if what == "relay" else api.runner.pass_once
        consumer = self.consumers.get(inc)
        if consumer is None:
            return None
        return consumer.scheduler.pass_once if what == "scheduler" else consumer.judge.pass_once

    async def quiesce(self, horizon: float = 10 * 24 * 3600.0) -> bool:
        """Run until nothing is left to do; False if something is still going at ``horizon``
        seconds after the start."""
        loop = asyncio.get_running_loop()
        while True:
            self._passes()
            if not self.busy():
                await asyncio.sleep(0)
                if not self.busy():
                    return True
            if loop.time() >= horizon:
                return False
            await asyncio.sleep(self._tick())

    def _tick(self) -> float:
        """How long the world can wait before it must look again."""
        if self.requests_in_flight or self.broker.unacked or self.broker.leftovers():
            return 0.5
        now = asyncio.get_running_loop().time()
        due = [d for d in (self.broker.next_due(),) if d is not None]
        wait = min(due) - now if due else 60.0
        for name, what, _ in self._periodic():
            wait = min(wait, max(0.0, self._due.get((name, what), 0.0) - now))
        return max(0.05, min(wait, 600.0))


async def _quietly(work: Callable[[], Awaitable[Any]]) -> None:
    """A periodic pass, as its loop runs it: a dependency down ends the pass, not the loop."""
    try:
        await work()
    except DependencyUnavailable as exc:
        log.debug("periodic work: %s", exc)


def _body(answer: Any) -> dict[str, Any] | None:
    if isinstance(answer, dict):
        return answer
    return None


_SETTINGS: dict[str, Settings] = {}


def _settings(config: Config) -> Settings:
    """The deployment's settings (made once per configuration: validating them costs more
    than a whole simulated run)."""
    key = repr(config)
    made = _SETTINGS.get(key)
    if made is None:
        made = _SETTINGS[key] = _make_settings(config)
    return made


def _make_settings(config: Config) -> Settings:
    return Settings(
        providers=ProviderSettings(
            chain=config.chain,
            max_attempts=config.max_attempts,
            backoff="5,30",
            timeout=10.0,
            resolve_interval=config.resolve_interval,
            query_after=config.query_after,
            webhook_window=config.webhook_window,
        ),
        webhooks=WebhookSettings(deferred_deadline=config.deferred_deadline),
        api=ApiSettings(sender_domains="any", daily_recipient_quota=config.quota),
        # A canary is judged on a few recipients, soon (the defaults want 100 and an hour).
        consumers=ConsumerSettings(canary_min_sent=2, canary_window=60.0, canary_deadline=600.0),
    )


def today() -> date:
    return datetime.now(UTC).date()


__all__ = ["Config", "Poison", "Reply", "World"]
