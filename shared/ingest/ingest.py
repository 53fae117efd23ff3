"""Applying normalised provider events to Cassandra (and hand-offs to RabbitMQ).

Every write here is idempotent: the timeline row is keyed by the provider's event id and
written in one batch with the recipient's state (a delivery's events: in rounds, a few
single-partition batches each, stat rows before states, ``RecipientStore.reported_many``; a
round of one event: one logged batch), the recipient's row is written through
``shared.delivery.recipients`` with timestamps from the event (so replays and out-of-order arrivals
merge to the same result) together with its stat row, suppressions are upserts (announced to
the API processes' caches once per delivery, ``shared.audience.suppression_cache``), and hand-offs
are planned once per failed attempt (``shared.delivery.handoff``). Replaying a whole delivery is
therefore harmless, which is what lets the intake retry it until it is applied.

The attempt tag an event carries (``c.<n>``, ``r.<n>``) is evidence that the provider accepted
that attempt, which is what resolves an ambiguous call (``services.consumers.resolution``).
A failure reported on an attempt already handed over to another provider is kept in the
timeline but decides nothing (``transitions.superseded``).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Counter

from shared.accounts.domains import domain_of
from shared.audience import suppressions
from shared.audience.suppression_cache import Changes
from shared.audience.suppressions import SuppressionChecks, SuppressionStore
from shared.core.addresses import address_key
from shared.core.catalog import TRACKER
from shared.core.models import LogJob
from shared.core.webhook_events import ENGAGEMENT, ProviderEvent
from shared.delivery.attempts import AttemptStore
from shared.delivery.batchstore import Batches, BatchStore
from shared.delivery.domain_capacity import DomainVolumes, Volumes
from shared.delivery.handoff import HandOff, Route, Routing
from shared.delivery.recipient_answers import REFUSED_FOR_NOW
from shared.delivery.recipients import Recipients, RecipientStore, Report
from shared.delivery.stats import StatsStore, tell_rollups
from shared.infra.broker import Broker
from shared.infra.config import Settings
from shared.infra.current import Current
from shared.infra.db import Database
from shared.infra.topology import log_key
from shared.ingest import transitions
from shared.ingest.timeline import Timeline, Timelines
from shared.outbound import recipient_events
from shared.outbound.user_hooks import HookEmitter, HookEvent, UserHooks
from shared.providers.provider_health import Reports

log = logging.getLogger(__name__)

#: Events of one delivery applied concurrently.
CONCURRENCY = 32
#: Most events written together (a round of a delivery: its state writes are one batch per
#: batch partition, one mutation each).
ROUND = 250
#: Batch owners remembered (a batch's owner never changes).
OWNER_CACHE = 50_000


@dataclass(frozen=True, slots=True)
class Target:
    batch_id: uuid.UUID
    chunk: int
    log_id: uuid.UUID
    user_id: uuid.UUID


@dataclass(frozen=True)
class IngestMetrics:
    events: Counter
    orphans: Counter
    resends: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> IngestMetrics:
        return cls(
            Counter(
                "safedelivr_webhook_events",
                "Provider events applied",
                ["provider", "kind"],
                registry=registry,
            ),
            Counter(
                "safedelivr_webhook_orphans",
                "Events matching no recipient",
                ["provider"],
                registry=registry,
            ),
            Counter(
                "safedelivr_webhook_resends",
                "Recipients handed over to another provider after provider-side failures",
                ["provider"],
                registry=registry,
            ),
        )


@dataclass
class Ingest:
    """Applies events through the stores that own each table (in tests, their fakes)."""

    batches: Batches
    recipients: Recipients
    suppressions: SuppressionChecks
    timeline: Timelines
    handoff: HandOff
    broker: Broker
    settings: Settings
    metrics: IngestMetrics
    volumes: Volumes | None = None
    """Where deliveries, hard bounces and complaints count per sending domain and day."""
    count_outcomes: bool = False
    """Whether to count them (the live setting ``capacity.enabled``)."""
    hooks: UserHooks | None = None
    """Where each applied event goes for the users' webhooks (None: nowhere)."""
    reports: Reports = field(default_factory=Reports)
    """Provider-side drops and deferrals, for the providers' health."""
    changes: Changes | None = None
    """Who tells the API processes that users' suppression lists changed (None: no one)."""
    _owners: OrderedDict[uuid.UUID, uuid.UUID | None] = field(default_factory=OrderedDict)
    _senders: OrderedDict[uuid.UUID, BatchFacts] = field(default_factory=OrderedDict)
    """Per batch: what events of its recipients need to know of it."""

    @classmethod
    def over(
        cls,
        db: Database,
        broker: Broker,
        settings: Settings,
        metrics: IngestMetrics,
        *,
        route: Callable[[], Route] | None = None,
    ) -> Ingest:
        """The production ingest: every store on ``db``; its hand-offs follow ``route`` (by
        default the env's chain and max attempts, never changed)."""
        stats = tell_rollups(StatsStore(db, settings.stats.buckets), broker)
        recipients = RecipientStore(db, stats)
        handoff = HandOff(
            AttemptStore(db),
            recipients,
            broker,
            route or Current(Routing.start(settings.providers)),
            settings.providers.backoff_tiers,
        )
        return cls(
            batches=BatchStore(db, stats),
            recipients=recipients,
            suppressions=SuppressionStore(db),
            timeline=Timeline(db),
            handoff=handoff,
            broker=broker,
            settings=settings,
            metrics=metrics,
            volumes=DomainVolumes(db),
            hooks=HookEmitter(db, broker),
            changes=Changes(broker),
        )

    async def apply_all(self, events: Iterable[ProviderEvent]) -> dict[str, int]:
        """Apply a delivery's events in rounds: each round holds at most one event per
        recipient (the k-th event of a recipient is in round k, so it is decided on the row
        its earlier events left), its writes grouped into a few single-partition batches
        (``RecipientStore.reported_many``), then each event's hand-offs, suppressions and
        hooks. A failure anywhere fails the delivery; the provider's retry (or the intake's
        queue) applies it again, which rewrites the same cells. The users whose lists it
        changed are announced once, after the delivery is applied."""
        results: list[str] = []
        suppressed: set[uuid.UUID] = set()
        for round_ in rounds(events):
            results += await self._apply_round(round_, suppressed)
        await self._announce(suppressed)
        return {"applied": results.count("applied"), "orphans": results.count("orphan")}

    async def _apply_round(
        self, events: list[ProviderEvent], suppressed: set[uuid.UUID]
    ) -> list[str]:
        """Apply one round; the users it suppressed an address of join ``suppressed``."""
        window = asyncio.Semaphore(CONCURRENCY)

        async def plan(ev: ProviderEvent) -> Planned | None:
            async with window:
                return await self._plan(ev)

        async def finish(p: Planned) -> None:
            async with window:
                await self._finish(p)

        if len(events) > 1:  # one event asks for its owner and chunk once anyway
            await self._warm(events)
        planned = await asyncio.gather(*(plan(ev) for ev in events))
        applied = [p for p in planned if p is not None]
        await self.recipients.reported_many([p.report for p in applied])
        await asyncio.gather(*(finish(p) for p in applied))
        suppressed.update(p.target.user_id for p in applied if p.effects.suppress)
        told: dict[uuid.UUID, list[HookEvent]] = {}
        for p in applied:
            if p.told is not None:
                told.setdefault(p.target.user_id, []).append(p.told)
        if self.hooks is not None:
            # Before the provider hears 200: a failure here makes it deliver again, and the
            # same event is the same webhook message (at least once, never lost).
            hooks = self.hooks
            await asyncio.gather(*(hooks.emit(user, evs) for user, evs in told.items()))
        return ["orphan" if p is None else "applied" for p in planned]

    async def _warm(self, events: list[ProviderEvent]) -> None:
        """Look up each batch's owner and each chunk's members once for a round, before its
        events ask for them all at once (they are remembered)."""
        batches = {ev.batch_id for ev in events if ev.batch_id is not None}
        owners = await asyncio.gather(*(self._owner(b) for b in batches))
        known = {b for b, owner in zip(batches, owners, strict=True) if owner is not None}
        chunks: dict[tuple[uuid.UUID, int], uuid.UUID] = {}
        for ev in events:
            if ev.batch_id in known and ev.chunk is not None and ev.log_id is not None:
                chunks.setdefault((ev.batch_id, ev.chunk), ev.log_id)
        await asyncio.gather(*(self.recipients.member(b, c, i) for (b, c), i in chunks.items()))

    async def apply(self, ev: ProviderEvent) -> str:
        """Apply one event (a one-event round: its state and stat row in one logged batch,
        ``RecipientStore.reported_many``): ``applied`` or ``orphan``."""
        suppressed: set[uuid.UUID] = set()
        (result,) = await self._apply_round([ev], suppressed)
        await self._announce(suppressed)
        return result

    async def _announce(self, users: Iterable[uuid.UUID]) -> None:
        """Tell the API processes these users' suppression lists changed (best effort: each
        sees it within its cache's TTL without the broadcast,
        ``shared.audience.suppression_cache``)."""
        if self.changes is not None:
            await self.changes.announce(users)

    async def _plan(self, ev: ProviderEvent) -> Planned | None:
        """Where an event lands and what it does (None: an orphan, recorded as one)."""
        target = await self._locate(ev)
        if target is None:
            await self._orphan(ev)
            return None
        self.metrics.events.labels(ev.provider, ev.kind).inc()
        if ev.raw_event != REFUSED_FOR_NOW:
            # A recipient refused for now (a 4xx RCPT, a throttled or rate-limited call) is
            # no fate and no drop: it says nothing of the provider's health.
            self.reports.count(
                ev.provider, datetime.now(UTC), ev.kind, provider_side=bool(ev.provider_side)
            )
        eff = transitions.effects(ev)
        if eff.needs_row:
            row = await self.recipients.one(target.batch_id, target.chunk, target.log_id)
            eff = transitions.given_row(eff, ev, row)
        line = await self.timeline.statement(
            target.batch_id, target.log_id, ev, counted=eff.counted
        )
        report = Report(
            target.batch_id,
            target.user_id,
            target.chunk,
            target.log_id,
            provider=ev.provider,
            provider_result="" if ev.provider == TRACKER else _provider_result(ev),
            message_id=ev.message_id,
            stage_rank=transitions.stage_rank(ev),
            rank=transitions.rank(ev),
            when=ev.occurred_at,
            event=eff.event,
            state=eff.state,
            reason=ev.reason,
            evidence=ev.attempt if ev.kind != "unknown" else None,
            metrics=eff.metrics,
            also=[line],
        )
        told = recipient_events.reported_event(ev, target.batch_id, target.log_id, ev.email)
        return Planned(ev, target, eff, report, told)

    async def _finish(self, p: Planned) -> None:
        """What an event does once its state is written: engagement totals, suppressions,
        hand-offs or deadline checks, and domain counts (its users' webhook event is the
        caller's to emit, :attr:`Planned.told`)."""
        ev, target, eff = p.event, p.target, p.effects
        if ev.kind in ENGAGEMENT:
            await self.recipients.stats.hit(
                target.user_id, target.batch_id, ev.kind, machine=ev.machine is not None
            )
        if eff.suppress:
            facts = await self._sender(target.batch_id) if ev.kind == "unsubscribed" else None
            await self.suppressions.add(
                target.user_id,
                ev.email,
                reason=ev.raw_event,
                source=ev.provider,
                event_id=ev.event_id,
                at=ev.occurred_at,
                # An unsubscribe from mail that named a list leaves that list only.
                scope=facts.list if facts else None,
                # The recipient's own: only an operator may lift it (shared.audience.suppressions).
                by_recipient=suppressions.by_recipient(ev.kind, ev.raw_event, ev.reason),
            )
        if eff.hand_off:
            await self._hand_off(target, ev)
        elif eff.deadline:
            await self._schedule_deadline(target, ev)
        elif eff.finish_hand_off:
            await self.handoff.finish(
                batch_id=target.batch_id,
                chunk=target.chunk,
                log_id=target.log_id,
                cause=_cause(ev),
                failed=ev.provider,
                why=_provider_result(ev),
            )
        if self.count_outcomes:
            await self._count_outcome(target, ev, eff)

    async def count_hit(self, batch_id: uuid.UUID, kind: str, *, machine: bool) -> bool:
        """Count one more open or click in the totals only (a repeat of one just recorded:
        no timeline row, no webhook event); False when the batch is unknown."""
        owner = await self._owner(batch_id)
        if owner is None:
            return False
        await self.recipients.stats.hit(owner, batch_id, kind, machine=machine)
        return True

    async def _count_outcome(self, t: Target, ev: ProviderEvent, eff: transitions.Effects) -> None:
        """Count a delivery, hard bounce or complaint for the batch's sending domain (last:
        a delivery replayed after a failure counts again, so the counters are estimates that
        err on the side of more bounces, never fewer)."""
        kind = transitions.domain_outcome(eff)
        if kind is None or self.volumes is None:
            return
        sender = await self._sender(t.batch_id)
        if sender is None:
            return
        await self.volumes.outcome(sender.domain, ev.occurred_at.astimezone(UTC).date(), kind)

    async def _sender(self, batch_id: uuid.UUID) -> BatchFacts | None:
        """What events need to know of a batch (None when it does not exist)."""
        known = self._senders.get(batch_id)
        if known is None:
            header = await self.batches.header(batch_id)
            if header is None:
                return None
            message = header.message
            known = BatchFacts(
                domain_of(message.sender.email),
                message.provider,
                message.engagement.list if message.engagement else None,
            )
            self._senders[batch_id] = known
            if len(self._senders) > OWNER_CACHE:
                self._senders.popitem(last=False)
        return known

    async def _locate(self, ev: ProviderEvent) -> Target | None:
        if ev.batch_id is None:
            return None
        owner = await self._owner(ev.batch_id)
        if owner is None:
            return None
        if ev.log_id is not None and ev.chunk is not None:
            # Our own correlation data, echoed by the provider; still, an id that names no
            # recipient of the chunk must not write a row (or count in the stats).
            if not await self.recipients.member(ev.batch_id, ev.chunk, ev.log_id):
                return None
            return Target(ev.batch_id, ev.chunk, ev.log_id, owner)
        found = await self.recipients.locate(ev.batch_id, ev.email)
        if found is None:
            return None
        return Target(ev.batch_id, found[0], found[1], owner)

    async def _owner(self, batch_id: uuid.UUID) -> uuid.UUID | None:
        if batch_id in self._owners:
            self._owners.move_to_end(batch_id)
            return self._owners[batch_id]
        owner = await self.batches.owner(batch_id)
        if owner is not None:  # unknown batches are not cached: they may appear later
            self._owners[batch_id] = owner
            if len(self._owners) > OWNER_CACHE:
                self._owners.popitem(last=False)
        return owner

    async def _hand_off(self, t: Target, ev: ProviderEvent) -> None:
        self.metrics.resends.labels(ev.provider).inc()
        sender = await self._sender(t.batch_id)
        await self.handoff(
            batch_id=t.batch_id,
            user_id=t.user_id,
            chunk=t.chunk,
            log_id=t.log_id,
            cause=_cause(ev),
            failed=ev.provider,
            why=_provider_result(ev),
            pinned=sender.pinned if sender else None,
            later=ev.raw_event == REFUSED_FOR_NOW,
        )

    async def _schedule_deadline(self, t: Target, ev: ProviderEvent) -> None:
        """Check the recipient again when the deferral deadline has passed (every deferral
        schedules one; the first to find it still deferred hands it over, once)."""
        job = LogJob(
            batch_id=t.batch_id,
            chunk=t.chunk,
            log_id=t.log_id,
            deferral=_cause(ev),
        )
        deadline = self.settings.webhooks.deferred_deadline
        await self.broker.publish(
            log_key(ev.provider, t.log_id),
            job.encode(),
            delay=self.broker.topology.delay_tier_for(deadline),
            message_id=f"{t.log_id}:deferral:{ev.event_id}",
        )

    async def _orphan(self, ev: ProviderEvent) -> None:
        self.metrics.orphans.labels(ev.provider).inc()
        await self.timeline.orphan(ev)


@dataclass(frozen=True, slots=True)
class Planned:
    """An event located and decided, not yet written."""

    event: ProviderEvent
    target: Target
    effects: transitions.Effects
    report: Report
    told: HookEvent | None
    """What the users' webhooks hear of it (None: nothing)."""


def rounds(events: Iterable[ProviderEvent]) -> list[list[ProviderEvent]]:
    """A delivery's events in rounds of at most :data:`ROUND` events, each naming a recipient
    at most once, in delivery order: a recipient's k-th event is in a later round than its
    (k-1)-th, so it is decided on the row that one left."""
    out: list[list[ProviderEvent]] = []
    seen: dict[object, int] = {}
    for ev in events:
        key = _recipient_key(ev)
        k = seen.get(key, -1) + 1
        while k < len(out) and len(out[k]) >= ROUND:
            k += 1
        if k == len(out):
            out.append([])
        out[k].append(ev)
        seen[key] = k
    return out


def _recipient_key(ev: ProviderEvent) -> object:
    """Who an event concerns, as far as it says (before it is located)."""
    if ev.log_id is not None:
        return (ev.batch_id, ev.log_id)
    return (ev.batch_id, address_key(ev.email))


@dataclass(frozen=True, slots=True)
class BatchFacts:
    domain: str
    """The sending domain."""
    pinned: str | None
    """The provider the batch pins (None: any)."""
    list: str | None
    """The list its mail names (an unsubscribe leaves only that list)."""


def _cause(ev: ProviderEvent) -> str:
    """The attempt an event reports on, as hand-offs and deadline checks name it (events
    without our tag name their provider)."""
    return ev.attempt or f"{ev.provider}?"


def _provider_result(ev: ProviderEvent) -> str:
    if ev.raw_event == REFUSED_FOR_NOW:
        # Not a provider-side drop: it may be asked again (``shared.delivery.handoff``).
        return f"refused for now: {ev.reason}"[:300]
    if ev.kind in ("dropped", "bounced") and ev.reason:
        return f"{ev.kind}: {ev.reason}"[:300]
    if ev.kind == "deferred":
        return "deferred"
    return ev.kind
