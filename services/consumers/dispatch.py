"""The provider senders: one delivery of a dispatch job, driven by the attempt protocol.

Consumes ``[bulk.]<ns>.<batch_uuid>[.retry.<n>]`` (a chunk's attempt ``n`` via provider ``ns``,
in the bulk lane or not) and
``log.<ns>.<log_uuid>[.retry.<n>]`` (one recipient's re-send attempt, or a deferral deadline
check). Each step comes from :func:`services.consumers.protocol.next_step` and is one
conditional write; when a write does not apply (someone else moved the attempt) the line is
read again at SERIAL consistency and the protocol asked again. A delivery is acked only when
everything its steps decided is durable: the outcome and decision on the attempt, the
recipients' rows, and the follow-up job confirmed by the broker.

``fault_points`` is awaited at every point where a process can die on the send path (tests
inject crashes and interleavings there; in production it does nothing:
``services.consumers.faults``).

The send path's state is in one place: the :class:`Dispatcher` is frozen, built once per
process with its parts; its collaborators (follow-ups, the suppression screen, decisions, the
caller, the resolver, the hand-off) are built from it with exactly what each uses, and none
reaches back to it. What live settings change is one ``services.consumers.running.Running``
in the :attr:`Dispatcher.running` cell, replaced whole by the applier.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import aio_pika.abc

from services.consumers import protocol
from services.consumers.calls import Caller, Decisions
from services.consumers.campaign_hold import CampaignHold
from services.consumers.faults import FaultPoints, no_faults
from services.consumers.followup import FollowUps
from services.consumers.provider_rates import ProviderLimiter
from services.consumers.resolution import Resolver
from services.consumers.running import Running
from services.consumers.screening import Screen
from services.consumers.template_rollouts import LiveRollouts
from shared.audience.suppressions import SuppressionChecks
from shared.core.errors import DependencyUnavailable
from shared.core.models import ChunkJob, LogJob
from shared.delivery.attempts import Attempt, Attempts, chunk_line, find, recipient_line
from shared.delivery.batchstore import Batches, BatchHeader
from shared.delivery.domain_capacity import CapacityGate
from shared.delivery.handoff import HandOff
from shared.delivery.recipients import Recipients
from shared.engagement.engagement import Tracker
from shared.infra.broker import Broker
from shared.infra.byte_budget import ByteBudget
from shared.infra.config import ProviderSettings
from shared.infra.current import Current
from shared.infra.gil import CpuLane
from shared.infra.logs import bound
from shared.infra.metrics import DispatchMetrics
from shared.infra.settle import Delivery, Poison
from shared.infra.topology import parse_routing_key
from shared.ingest.ingest import Ingest
from shared.outbound.user_hooks import UserHooks
from shared.providers.base import Provider
from shared.providers.provider_health import Tally
from shared.templates import template_use

log = logging.getLogger(__name__)

#: Steps one delivery may take before it gives up and requeues (a livelock guard: every
#: step either settles the delivery or loses a race that someone else won).
MAX_STEPS = 12


def decode(message: aio_pika.abc.AbstractIncomingMessage) -> tuple[protocol.Job, str | None]:
    """The job of a dispatch or re-send delivery, and its deferral tag if it is a check."""
    key = parse_routing_key(message.routing_key or "")
    if key.provider is None:
        raise Poison(f"not a dispatch key: {message.routing_key}")
    if key.kind == "dispatch":
        chunk_job = ChunkJob.decode(message.body)
        if chunk_job.batch_id != key.id or chunk_job.attempt != key.attempt:
            raise Poison("routing key and body disagree")
        job = protocol.Job(
            batch_id=chunk_job.batch_id,
            line=chunk_line(chunk_job.chunk),
            chunk=chunk_job.chunk,
            log_id=None,
            attempt=chunk_job.attempt,
            provider=key.provider,
            check=chunk_job.check,
            lane=key.lane,
            origin=message.message_id,
        )
        return job, None
    log_job = LogJob.decode(message.body)
    if log_job.log_id != key.id or (log_job.deferral is None and log_job.attempt != key.attempt):
        raise Poison("routing key and body disagree")
    job = protocol.Job(
        batch_id=log_job.batch_id,
        line=recipient_line(log_job.log_id),
        chunk=log_job.chunk,
        log_id=log_job.log_id,
        attempt=log_job.attempt,
        provider=key.provider,
        check=log_job.check,
        origin=message.message_id,
    )
    return job, log_job.deferral


@dataclass(frozen=True)
class Dispatcher:
    """One provider sender's state, built once with its parts (frozen: nothing is swapped
    in afterwards; live settings change :attr:`running`'s value, not the dispatcher)."""

    broker: Broker
    batches: Batches
    attempts: Attempts
    providers: Mapping[str, Provider]
    settings: ProviderSettings
    """Static: the env's values. The chain, pauses and max attempts in force are
    :attr:`running`'s."""
    metrics: DispatchMetrics
    recipients: Recipients
    suppressions: SuppressionChecks
    """Looked up again before every provider call (``services.consumers.screening``)."""
    running: Current[Running]
    """What live settings and health decide, replaced whole by the applier
    (``services.consumers.live``); read at the point of use."""
    fault_points: FaultPoints = no_faults
    deferred_deadline: int = 4 * 3600
    tally: Tally = field(default_factory=Tally)
    """Calls not yet added to the shared health windows (``shared.providers.provider_health``)."""
    limiter: ProviderLimiter = field(default_factory=lambda: ProviderLimiter(None, ""))
    """Client-side rate limits shared by every process (``services.consumers.provider_rates``)."""
    capacity: CapacityGate = field(default_factory=lambda: CapacityGate(None))
    """Daily capacity per sending domain (``shared.delivery.domain_capacity``)."""
    user_hooks: UserHooks | None = None
    """Where each attempt's events go for the users' webhooks (None: nowhere)."""
    ingest: Ingest | None = None
    """Where providers' answers recipient by recipient are applied, as webhook events are
    (``services.consumers.followup``; None: no provider of this process gives them)."""
    campaigns: CampaignHold | None = None
    """Holds the chunks of paused campaigns, ends those of cancelled ones (None: no hold)."""
    tracker: Tracker | None = None
    """Where tracked links, the open pixel and one-click unsubscribe point (None: nowhere,
    so mail goes without them)."""
    work: ByteBudget | None = None
    """The process's budget of recipients' bytes in provider calls being built and sent
    (``services.consumers.calls``; None: unbounded)."""
    now: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    cpu: CpuLane = field(default_factory=CpuLane)
    """The process's thread for long pure-Python work (``shared.infra.gil``)."""
    rollouts: LiveRollouts | None = None
    """Templates' rollouts as they stand, which decide a canary chunk's copy when it is sent
    (None: as they stood when each batch was accepted)."""

    follow: FollowUps = field(init=False, repr=False, compare=False)
    screen: Screen = field(init=False, repr=False, compare=False)
    decisions: Decisions = field(init=False, repr=False, compare=False)
    caller: Caller = field(init=False, repr=False, compare=False)
    resolver: Resolver = field(init=False, repr=False, compare=False)
    handoff: HandOff = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Compose the collaborators, each with what it uses, in dependency order."""
        follow = FollowUps(
            batches=self.batches,
            recipients=self.recipients,
            broker=self.broker,
            metrics=self.metrics,
            fault_points=self.fault_points,
            user_hooks=self.user_hooks,
            ingest=self.ingest,
        )
        screen = Screen(
            suppressions=self.suppressions,
            recipients=self.recipients,
            follow=follow,
            metrics=self.metrics,
            fault_points=self.fault_points,
            now=self.now,
        )
        decisions = Decisions(
            follow=follow, running=self.running, backoff=self.settings.backoff_tiers
        )
        caller = Caller(
            attempts=self.attempts,
            providers=self.providers,
            recipients=self.recipients,
            follow=follow,
            screen=screen,
            decisions=decisions,
            running=self.running,
            limiter=self.limiter,
            capacity=self.capacity,
            tally=self.tally,
            campaigns=self.campaigns,
            tracker=self.tracker,
            work=self.work,
            cpu=self.cpu,
            metrics=self.metrics,
            fault_points=self.fault_points,
            now=self.now,
            timeout=self.settings.timeout,
            resolve_interval=self.settings.resolve_interval,
        )
        resolver = Resolver(
            attempts=self.attempts,
            providers=self.providers,
            recipients=self.recipients,
            follow=follow,
            decisions=decisions,
            metrics=self.metrics,
            fault_points=self.fault_points,
            now=self.now,
            settings=protocol.ResolveSettings(
                interval=self.settings.resolve_interval,
                query_after=self.settings.query_after,
                webhook_window=self.settings.webhook_window,
                windows={"smtp": self.settings.smtp_unknown_wait},
            ),
        )
        handoff = HandOff(
            self.attempts, self.recipients, self.broker, self.running, self.settings.backoff_tiers
        )
        for name, part in (
            ("follow", follow),
            ("screen", screen),
            ("decisions", decisions),
            ("caller", caller),
            ("resolver", resolver),
            ("handoff", handoff),
        ):
            object.__setattr__(self, name, part)  # frozen: set once, here

    @property
    def lease(self) -> timedelta:
        return timedelta(seconds=self.settings.call_lease)

    async def process(
        self, message: aio_pika.abc.AbstractIncomingMessage, delivery: Delivery
    ) -> None:
        job, deferral = decode(message)
        with bound(
            batch_id=job.batch_id,
            line=job.line,
            attempt=job.attempt,
            provider=job.provider,
            log_id=job.log_id,
        ):
            if deferral is not None:
                await self.deferral_check(job, deferral)
                return
            await self.handle(job, delivery)

    async def handle(self, job: protocol.Job, delivery: Delivery) -> None:
        """Take protocol steps until this delivery may be acked."""
        header = await self.follow.header(job.batch_id)  # cached; a missing batch is poison
        if not 0 <= job.chunk < header.chunk_count:
            # Nothing to send, yet claiming it would record a phantom attempt as accepted.
            raise Poison(f"batch {job.batch_id} has no chunk {job.chunk}")
        if self.campaigns is not None and await self.campaigns.held(
            job, header.user_id, header.message, self.broker
        ):
            return  # its campaign is paused: the same job comes back later, nothing written
        # After a failure (this delivery's retry) or a lost race, read at SERIAL: an LWT of
        # ours whose outcome was unknown, or someone else's in progress, is then settled.
        serial = delivery.retries > 0
        for _ in range(MAX_STEPS):
            line = await self.attempts.line(job.batch_id, job.line, serial=serial)
            # An attempt handed over is no longer evidence for the line, from the moment its
            # successor is planned (before the recipient's row says so).
            job = replace(job, handed=frozenset(a.cause for a in line if a.cause))
            await self.fault_points("read", job)
            step = protocol.next_step(
                job,
                line,
                me=delivery.owner,
                called=bool(delivery.scratch.get("called")),
                now=self.now(),
                lease=self.lease,
            )
            if isinstance(step, protocol.Stray):
                log.info("%s attempt %d: %s", job.line, job.attempt, step.why)
                return
            if isinstance(step, protocol.Done):
                return
            if await self._take(step, job, delivery, header, line):
                return
            # Read again at SERIAL: an LWT in progress (ours or another's) is then settled.
            serial = True
        raise DependencyUnavailable("cassandra", f"{job.line}/{job.attempt}: no progress")

    async def _take(
        self,
        step: protocol.Step,
        job: protocol.Job,
        delivery: Delivery,
        header: BatchHeader,
        line: list[Attempt],
    ) -> bool:
        """Carry out one step (``line`` as read for it); True when the delivery is finished."""
        if isinstance(step, protocol.Claim):
            # The copy is chosen now and recorded with the claim, before the call: a
            # redelivery finds it there, whatever the template does meanwhile.
            version = await self._version(job, header, line)
            claimed = await self.attempts.create(
                job.batch_id,
                job.line,
                job.attempt,
                chunk=job.chunk,
                provider=job.provider,
                state="calling",
                owner=delivery.owner,
                calling_at=self.now(),
                template_version=version,
            )
            if not claimed:
                return False  # someone else's: read it back at SERIAL
            await self.fault_points("calling", job)
            return await self.caller.call(job, delivery, version)
        if isinstance(step, protocol.StartCall):
            version = await self._version(job, header, line)
            values = {"state": "calling", "owner": delivery.owner, "calling_at": self.now()}
            if version is not None:
                values["template_version"] = version
            started = await self.attempts.transition(
                job.batch_id,
                job.line,
                job.attempt,
                expect={"state": step.state, "owner": step.owner},
                values=values,
            )
            if not started:
                return False
            await self.fault_points("calling", job)
            return await self.caller.call(job, delivery, version)
        if isinstance(step, protocol.Call):
            # Our claim applied though its write reported a failure: call with what it recorded.
            current = find(line, job.attempt)
            version = current.template_version if current is not None else None
            return await self.caller.call(job, delivery, version)
        if isinstance(step, protocol.Record):
            return await self.caller.record(job, delivery)
        if isinstance(step, protocol.Expire):
            return await self._expire(job, step)
        if isinstance(step, protocol.WaitLease):
            return await self._wait_lease(job, step)
        if isinstance(step, protocol.Resolve):
            return await self.resolver.resolve(job)
        if isinstance(step, protocol.EnsureCheck):
            await self._ensure_check(job, line, step.checks)
            return True
        assert isinstance(step, protocol.FollowUp)  # noqa: S101 - the union is exhausted
        await self.follow.carry_out(job, step.attempt)
        return True

    async def _ensure_check(self, job: protocol.Job, line: list[Attempt], checks: int) -> None:
        current = find(line, job.attempt)
        if current is not None and current.state == "ambiguous":
            # The delivery that recorded it may have died before applying the answers it had
            # for some recipients: without them those would wait for evidence a relay never
            # sends, and be sent again. All of them, as a provider replays a webhook: one
            # whose row was written may still lack its hand-off (counted twice at worst).
            await self.follow.apply_answers(job, current)
        await self.follow.check(job, checks, self.settings.resolve_interval)

    async def _version(
        self, job: protocol.Job, header: BatchHeader, line: list[Attempt]
    ) -> int | None:
        """The template version attempt ``job.attempt`` is sent with
        (``shared.templates.template_use.version_at_send``): the one an earlier call of the
        line that may have reached the provider was made with, else what the template's
        rollout says now (read only for the canary's chunks)."""
        use = header.message.template
        if use is None:
            return None
        kept = template_use.kept_version(
            (a.state, a.template_version) for a in line if a.attempt < job.attempt
        )
        rollout: template_use.TemplateState | None = template_use.TemplateState(use.version)
        if use.canary is not None and job.chunk < use.canary_chunks:
            if self.rollouts is None:
                rollout = template_use.TemplateState(
                    use.version, use.canary.version, use.canary_since
                )
            else:
                rollout = await self.rollouts.rollout(header.user_id, use.id)
        return template_use.version_at_send(header.message, job.chunk, rollout, kept)

    async def _expire(self, job: protocol.Job, step: protocol.Expire) -> bool:
        """The call's outcome is unknown: mark it ambiguous and start looking for evidence."""
        checks = step.checks + 1
        expired = await self.attempts.transition(
            job.batch_id,
            job.line,
            job.attempt,
            expect={"state": "calling", "owner": step.owner},
            values={
                "state": "ambiguous",
                "checks": checks,
                "checked_by": job.origin,
                "finished_at": self.now(),
            },
        )
        if not expired:
            return False
        self.metrics.ambiguous.labels(job.provider).inc()
        await self.fault_points("expired", job)
        await self.follow.check(job, checks, self.settings.resolve_interval)
        return True

    async def _wait_lease(self, job: protocol.Job, step: protocol.WaitLease) -> bool:
        """Someone else is calling: check again when its lease ends (one chain of checks)."""
        checks = step.checks + 1
        taken = await self.attempts.transition(
            job.batch_id,
            job.line,
            job.attempt,
            expect={"state": "calling", "checks": step.checks},
            values={"checks": checks, "checked_by": job.origin},
        )
        if not taken:
            return False
        wait = max(1.0, (step.at - self.now()).total_seconds())
        await self.follow.check(job, checks, wait)
        return True

    async def deferral_check(self, job: protocol.Job, cause: str) -> None:
        """A deferral's deadline passed: hand the recipient over if it is still deferred."""
        assert job.log_id is not None  # noqa: S101 - deferral checks are re-send jobs
        row = await self.recipients.one(job.batch_id, job.chunk, job.log_id)
        if row is None:
            raise Poison(f"no recipient {job.log_id} in batch {job.batch_id}")
        why = f"deferred too long (over {self.deferred_deadline}s)"
        if protocol.deferral_expired(row, cause):
            header = await self.follow.header(job.batch_id)
            await self.handoff(
                batch_id=job.batch_id,
                user_id=header.user_id,
                chunk=job.chunk,
                log_id=job.log_id,
                cause=cause,
                failed=job.provider,
                why=why,
                pinned=header.message.provider,
            )
        elif cause not in (row.get("superseded") or ()):
            # A hand-off of this check (an earlier delivery) may have stopped after its job was
            # out and before it marked the cause; the recipient moved on since: mark it now.
            await self.handoff.finish(
                batch_id=job.batch_id,
                chunk=job.chunk,
                log_id=job.log_id,
                cause=cause,
                failed=job.provider,
                why=why,
            )
