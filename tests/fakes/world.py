"""The services' shells over in-memory twins: a world in which batches are accepted, jobs
flow through the fake broker to the real splitter and dispatcher (settled by the real
``shared.infra.settle.run``), providers answer from a script, webhook events are applied by the real
ingest, and time is a clock the test moves.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import httpx
from prometheus_client import CollectorRegistry

from services.consumers import protocol
from services.consumers.campaign_hold import CampaignHold
from services.consumers.dispatch import Dispatcher
from services.consumers.provider_rates import ProviderLimiter
from services.consumers.running import Running
from services.consumers.splitter import Splitter
from services.consumers.template_rollouts import LiveRollouts
from services.webhooks.app import create_app as create_webhooks
from services.webhooks.intake import Intake, IntakeMetrics
from shared.core.batch_ids import accepted_at
from shared.core.catalog import CATALOG
from shared.core.errors import ProviderError
from shared.core.lanes import Priority
from shared.core.models import Address, BatchJob, Chunk, Message, Recipient
from shared.delivery.batchstore import NewBatch
from shared.delivery.domain_capacity import CapacityGate, CapacityRules
from shared.delivery.handoff import HandOff
from shared.delivery.precedence import visible
from shared.delivery.recipients import log_id_for
from shared.delivery.stats import batch_day, bucket_of
from shared.infra.byte_budget import ByteBudget
from shared.infra.config import ProviderSettings, Settings, WebhookSettings
from shared.infra.current import Current
from shared.infra.gil import CpuLane
from shared.infra.metrics import DispatchMetrics
from shared.infra.resources import topology_for
from shared.infra.settle import run
from shared.infra.topology import batch_key, parse_routing_key
from shared.ingest.ingest import Ingest, IngestMetrics
from shared.outbound.user_hooks import UserHooks
from shared.providers import responses, transport
from shared.providers.base import Gate, LookupQuery, Provider, Receipt
from tests.fakes.audience import FakeSuppressions
from tests.fakes.broker import FakeBroker, FakeMessage
from tests.fakes.cassandra import FakeCassandra
from tests.fakes.delivery import FakeAttempts, FakeBatches, FakeRecipients, FakeStats
from tests.fakes.webhooks import FakeTimeline, FakeWebhookTokens

Answer = Receipt | ProviderError | Callable[[Chunk], Awaitable[Receipt]]


@dataclass
class ScriptedProvider:
    """A provider answering from a script (then accepting), remembering every request."""

    code: str
    name: str
    max_recipients: int = 1000
    answers: list[Answer] = field(default_factory=list)
    sent: list[Chunk] = field(default_factory=list)
    found: frozenset[str] | ProviderError | None = frozenset()
    """What its query API answers (None: the account has none)."""
    lookups: list[LookupQuery] = field(default_factory=list)
    available: bool | ProviderError = True

    async def send(self, chunk: Chunk, gate: Gate | None = None) -> Receipt:
        if gate is not None:
            await gate()  # built, about to go out: the rate limit is asked here
        self.sent.append(chunk)
        answer = self.answers.pop(0) if self.answers else None
        if answer is None:
            return Receipt(self.code, 202, f"{self.code}-{len(self.sent)}")
        if isinstance(answer, ProviderError):
            raise answer
        if isinstance(answer, Receipt):
            return answer
        return await answer(chunk)

    async def lookup(self, query: LookupQuery) -> frozenset[str] | None:
        self.lookups.append(query)
        if isinstance(self.found, ProviderError):
            raise self.found
        return None if self.found is None else self.found & query.emails

    async def lookup_available(self) -> bool:
        if isinstance(self.available, ProviderError):
            raise self.available
        return self.available

    async def aclose(self) -> None:
        return None

    def emails(self) -> list[str]:
        """Every address it was asked to send to, in order."""
        return [r.email for c in self.sent for r in c.recipients]


def refused(code: str) -> ProviderError:
    """What an adapter raises when the provider cannot be reached (the request never went
    out): a clean failure, which fails over at once."""
    name = CATALOG[code].name if code in CATALOG else code
    return transport.translate(code, name, httpx.ConnectError("connection refused"), 5.0)


def answered(code: str, status: int, body: bytes = b"") -> ProviderError:
    """What an adapter raises for an HTTP answer ``status`` (``shared.providers.responses``):
    a 429 is a clean refusal, a 5xx leaves the outcome unknown."""
    error = responses.classify(code, status, body, {}, now=0.0)
    assert error is not None, f"HTTP {status} is no error"
    return error


def new_batch(
    *emails: str,
    chunk_size: int = 10,
    batch_id: uuid.UUID | None = None,
    user_id: uuid.UUID | None = None,
    priority: Priority | None = None,
) -> NewBatch:
    """A batch of one plain message to ``emails``, with the log ids acceptance gives them."""
    batch_id = batch_id or uuid.uuid1()
    return NewBatch(
        batch_id=batch_id,
        user_id=user_id or uuid.uuid4(),
        message=Message(
            sender=Address(email="news@example.com"), subject="Hi", text="Hello", priority=priority
        ),
        recipients=[
            Recipient(log_id=log_id_for(batch_id, e), email=e, name=None, substitutions={})
            for e in emails
        ],
        chunk_size=chunk_size,
    )


class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


Fault = Callable[[str, protocol.Job], Awaitable[None]]


class Died(BaseException):
    """A process died here (:meth:`World.crash_once`): not an error the code may catch."""


class World:
    """The services over the twins. The dispatcher's parts a test chooses are given here
    (it is built once, with them; nothing is swapped in afterwards)."""

    def __init__(
        self,
        *,
        webhooks: WebhookSettings | None = None,
        clock: Clock | None = None,
        user_hooks: UserHooks | None = None,
        campaigns: CampaignHold | None = None,
        limiter: ProviderLimiter | None = None,
        capacity: CapacityGate | None = None,
        capacity_rules: CapacityRules | None = None,
        work: ByteBudget | None = None,
        cpu: CpuLane | None = None,
        adapters: Mapping[str, Provider] | None = None,
        unconfigured: tuple[str, ...] = (),
        rollouts: LiveRollouts | None = None,
        **provider_settings: object,
    ) -> None:
        """``adapters`` replace the scripted providers the dispatcher calls; the scripted
        providers in ``unconfigured`` get no adapter at all (a misconfigured process);
        ``capacity_rules`` are in force from the start (as live settings would set them)."""
        values: dict[str, object] = {
            "chain": "sg,mg",
            "max_attempts": 4,
            "backoff": "5,30",
            "timeout": 5.0,
            "resolve_interval": 1,
            "query_after": 60,
            "webhook_window": 600,
        }
        values.update(provider_settings)
        self.settings = ProviderSettings(**values)  # type: ignore[arg-type]
        self.clock = clock or Clock()
        self.app_settings = Settings(
            providers=self.settings,
            webhooks=webhooks or WebhookSettings(deferred_deadline=3600),
        )
        self.db = FakeCassandra(now=self.clock)
        self.stats = FakeStats(self.db, self.app_settings.stats.buckets)
        self.batches = FakeBatches(self.db, self.stats)
        self.recipients = FakeRecipients(self.db, self.stats)
        self.attempts = FakeAttempts(self.db)
        self.suppressions = FakeSuppressions(self.db)
        self.timeline = FakeTimeline(self.db)
        self.tokens = FakeWebhookTokens(self.db)
        self.broker = FakeBroker(topology_for(self.app_settings), now=self.clock)
        self.providers = {
            "sg": ScriptedProvider("sg", "SendGrid"),
            "mg": ScriptedProvider("mg", "Mailgun"),
        }
        self.metrics = DispatchMetrics.create(CollectorRegistry())
        self.fault_points: dict[str, Fault] = {}
        self.running = Current(Running.start(self.settings, capacity=capacity_rules))
        """The live settings' cell the dispatcher, its hand-off and the splitter read."""
        # The webhooks' ingest, which the dispatcher applies providers' answers recipient by
        # recipient through too; its hand-offs follow the running chain, as the dispatcher's.
        self.ingest = Ingest(
            batches=self.batches,
            recipients=self.recipients,
            suppressions=self.suppressions,
            timeline=self.timeline,
            handoff=HandOff(
                self.attempts,
                self.recipients,
                self.broker,  # type: ignore[arg-type]
                self.running,
                self.settings.backoff_tiers,
            ),
            broker=self.broker,  # type: ignore[arg-type]
            settings=self.app_settings,
            metrics=IngestMetrics.create(CollectorRegistry()),
        )
        self.dispatcher = Dispatcher(
            broker=self.broker,  # type: ignore[arg-type]
            batches=self.batches,
            attempts=self.attempts,
            providers=adapters
            or {
                c: p
                for c, p in self.providers.items()
                if c in self.settings.chain_codes and c not in unconfigured
            },
            settings=self.settings,
            metrics=self.metrics,
            recipients=self.recipients,
            suppressions=self.suppressions,
            running=self.running,
            fault_points=self._fault,
            deferred_deadline=3600,
            now=self.clock,
            user_hooks=user_hooks,
            ingest=self.ingest,
            campaigns=campaigns,
            work=work,
            limiter=limiter or ProviderLimiter(None, ""),
            capacity=capacity or CapacityGate(None),
            cpu=cpu or CpuLane(),
            rollouts=rollouts,
        )
        self.splitter = Splitter(
            self.broker,  # type: ignore[arg-type]
            self.batches,
            self.running,
        )
        self.dead: list[FakeMessage] = []
        self.intake = Intake(
            self.tokens,
            self.broker,  # type: ignore[arg-type]
            self.ingest,
            IntakeMetrics.create(CollectorRegistry()),
        )

    async def _fault(self, point: str, job: protocol.Job) -> None:
        fault = self.fault_points.get(point)
        if fault is not None:
            await fault(point, job)

    async def accept(
        self, *emails: str, chunk_size: int = 10, priority: Priority | None = None
    ) -> NewBatch:
        """Store a batch as the API does and publish its ``batch.<uuid>`` job."""
        return await self.accept_batch(new_batch(*emails, chunk_size=chunk_size, priority=priority))

    async def accept_batch(self, batch: NewBatch) -> NewBatch:
        """Store ``batch`` as the API does and publish its ``batch.<uuid>`` job."""
        # The World's clock never runs behind a batch it accepted: writes stamped with it (a
        # status change) come after the batch's own, as a server's clock does.
        self.clock.now = max(
            self.clock.now, accepted_at(batch.batch_id) + timedelta(milliseconds=1)
        )
        await self.batches.write(batch)
        await self.batches.index(batch)
        await self.broker.publish(
            batch_key(batch.batch_id), BatchJob(batch_id=batch.batch_id).encode()
        )
        return batch

    @contextlib.asynccontextmanager
    async def webhooks(self) -> AsyncIterator[httpx.AsyncClient]:
        """An HTTP client of the real webhook app, its intake this world's (what its lifespan
        would build over Cassandra and RabbitMQ)."""
        app = create_webhooks(self.app_settings)
        app.state.intake = self.intake
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://webhooks") as client:
            yield client

    async def sent(self, *emails: str) -> NewBatch:
        """A batch accepted and sent through the first provider, with nothing left to do."""
        batch = await self.accept(*emails)
        await self.settle()
        return batch

    def _work_queues(self) -> list[str]:
        t = self.broker.topology
        names = [t.batches_queue, t.webhooks_queue]
        for code in self.settings.chain_codes:
            names += t.sender_queues(code)
        return names

    async def deliver(self, message: FakeMessage) -> str:
        """One delivery through the real settlement rules; how it was settled."""
        key = message.routing_key
        if key.startswith("hook."):
            await run(self.intake.process, message, hold=None)  # type: ignore[arg-type]
        else:
            process = self.splitter.process if key.startswith("batch.") else None
            await run(process or self.dispatcher.process, message)  # type: ignore[arg-type]
        settled = message.settled or "none"
        if settled == "reject":
            self.dead.append(message)
        elif settled == "nack":
            again = replace(message, settled=None, deliveries=message.deliveries + 1)
            if again.deliveries >= self.broker.topology.delivery_limit:
                self.dead.append(again)  # the quorum queue's delivery limit: dead-lettered
            else:
                self.broker.queues[self._queue_of(message)].append(again)
        return settled

    def _queue_of(self, message: FakeMessage) -> str:
        t = self.broker.topology
        key = message.routing_key
        if key.startswith("batch."):
            return t.batches_queue
        if key.startswith("hook."):
            return t.webhooks_queue
        if key.startswith("log."):
            return t.log_queue(key.split(".")[1])
        parsed = parse_routing_key(key)
        assert parsed.provider is not None
        return t.lane_queue(parsed.provider, parsed.lane)

    async def crash_once(self, point: str, *, attempt: int | None = None) -> protocol.Job:
        """Run until a process dies at fault point ``point`` (for ``attempt``, if given); the
        broker then redelivers the unacked message (with its properties, as RabbitMQ does),
        and the world runs to the end. The job it died on."""
        died: list[protocol.Job] = []

        async def die(at: str, job: protocol.Job) -> None:
            if attempt is None or job.attempt == attempt:
                del self.fault_points[point]
                died.append(job)
                raise Died(at)

        self.fault_points[point] = die
        for _ in range(1000):
            if died:
                break
            for name in self._work_queues():
                message = await self.broker.get(name)
                if message is None:
                    continue
                try:
                    await self.deliver(message)
                except Died:
                    again = replace(message, settled=None, deliveries=message.deliveries + 1)
                    self.broker.queues[name].append(again)
                break
            else:
                due = self.broker.next_due()
                assert due is not None, f"the send path never reached {point!r}"
                self.clock.now = max(self.clock.now, due)
                self.broker.expire(until=self.clock.now)
        await self.settle()
        assert died, f"nothing died at {point!r}"
        return died[0]

    async def step(self) -> bool:
        """Deliver the oldest ready message of any work queue; False when none is ready."""
        for name in self._work_queues():
            message = await self.broker.get(name)
            if message is not None:
                await self.deliver(message)
                return True
        return False

    async def settle(self, *, rounds: int = 1000) -> None:
        """Run until nothing is left: deliver what is ready; then move the clock to when the
        next delayed message is due, release what is due by then, and go on."""
        for _ in range(rounds):
            while await self.step():
                pass
            due = self.broker.next_due()
            if due is None:
                return
            self.clock.now = max(self.clock.now, due)
            self.broker.expire(until=self.clock.now)
        raise AssertionError("the world did not settle")

    async def states(self, batch: NewBatch) -> dict[str, str]:
        """Each recipient's visible state, by address."""
        rows = await self.recipients.batch_rows(batch.batch_id)
        return {r["email"]: visible(r).state for r in rows}

    async def rows(self, batch: NewBatch) -> dict[str, dict[str, object]]:
        return {r["email"]: r for r in await self.recipients.batch_rows(batch.batch_id)}

    async def counts(self, batch: NewBatch) -> dict[str, int]:
        """The stats of the batch's user on the batch's day, as a stats read serves them."""
        return await self.stats.day(batch.user_id, batch_day(batch.batch_id))

    async def stat_row(self, batch: NewBatch, email: str) -> dict[str, object] | None:
        """A recipient's stat row (its outcome and the metrics it earned), if it has one."""
        log_id = log_id_for(batch.batch_id, email)
        rows = await self.stats.bucket_rows(
            batch.user_id, batch_day(batch.batch_id), bucket_of(log_id, self.stats.buckets)
        )
        return next((r for r in rows if r["log_id"] == log_id), None)

    def counter(self, name: str, **labels: str) -> float:
        counter = getattr(self.metrics, name)
        return float((counter.labels(**labels) if labels else counter)._value.get())
