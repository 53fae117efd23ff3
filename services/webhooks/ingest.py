"""Applying normalised provider events to Cassandra (and re-sends to RabbitMQ).

Every write here is idempotent: the timeline row is keyed by the provider's event id, the log
row is updated with a timestamp derived from the event (so replays and out-of-order arrivals
merge to the same result), stats are ledger marks, suppressions are upserts, and re-sends are
claimed by attempt number in the log-retry consumer. Replaying a whole request is therefore
harmless, which is what makes answering 503 (and letting the provider retry) safe.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from services.webhooks.transitions import effects, stage_timestamp, write_timestamp
from shared.attempts import AttemptStore
from shared.broker import Broker
from shared.config import Settings
from shared.db import Database
from shared.models import LogJob
from shared.resend import next_provider
from shared.stats import StatsStore
from shared.suppressions import SuppressionStore
from shared.topology import log_key
from shared.webhook_events import ProviderEvent

log = logging.getLogger(__name__)

#: Events of one request applied concurrently.
CONCURRENCY = 32
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
                "Recipients re-sent after provider failures",
                ["provider"],
                registry=registry,
            ),
        )


@dataclass
class Ingest:
    db: Database
    broker: Broker
    settings: Settings
    metrics: IngestMetrics
    _owners: OrderedDict[uuid.UUID, uuid.UUID | None] = field(default_factory=OrderedDict)
    _settled: OrderedDict[tuple[uuid.UUID, int, str], None] = field(default_factory=OrderedDict)

    def __post_init__(self) -> None:
        self.stats = StatsStore(self.db)
        self.suppressions = SuppressionStore(self.db)
        self.attempts = AttemptStore(self.db)

    async def apply_all(self, events: Iterable[ProviderEvent]) -> dict[str, int]:
        window = asyncio.Semaphore(CONCURRENCY)

        async def one(ev: ProviderEvent) -> str:
            async with window:
                return await self.apply(ev)

        results = await asyncio.gather(*(one(ev) for ev in events))
        return {"applied": results.count("applied"), "orphans": results.count("orphan")}

    async def apply(self, ev: ProviderEvent) -> str:
        target = await self._locate(ev)
        if target is None:
            await self._orphan(ev)
            return "orphan"
        self.metrics.events.labels(ev.provider, ev.kind).inc()
        history = await self._history(target) if _needs_history(ev) else []
        deferred_since = min(
            (r["at"].replace(tzinfo=UTC) for r in history if r["kind"] == "deferred"),
            default=ev.occurred_at,
        )
        eff = effects(
            ev, deferred_since=deferred_since, deadline=self.settings.webhooks.deferred_deadline
        )
        await self._timeline(target, ev)
        if eff.event is not None:
            await self._update_row(target, ev, eff.event, eff.state)
        for metric in eff.metrics:
            await self.stats.mark(target.user_id, ev.occurred_at, metric, [str(target.log_id)])
        if eff.suppress:
            await self.suppressions.add(
                target.user_id,
                ev.email,
                reason=ev.raw_event,
                source=ev.provider,
                event_id=ev.event_id,
                at=ev.occurred_at,
            )
        if eff.attempt_accepted:
            await self._settle_attempt(target, ev)
        if eff.resend:
            await self._resend(target, ev)
        elif ev.kind == "deferred" and deferred_since == ev.occurred_at:
            await self._schedule_deferred_check(target, ev)
        return "applied"

    async def _locate(self, ev: ProviderEvent) -> Target | None:
        if ev.batch_id is None:
            return None
        owner = await self._owner(ev.batch_id)
        if owner is None:
            return None
        if ev.log_id is not None and ev.chunk is not None:
            return Target(ev.batch_id, ev.chunk, ev.log_id, owner)
        row = await self.db.one(
            "SELECT chunk, log_id FROM batch_emails WHERE batch_id = ? AND email = ?",
            (ev.batch_id, ev.email.lower()),
        )
        if row is None:
            return None
        return Target(ev.batch_id, row["chunk"], row["log_id"], owner)

    async def _owner(self, batch_id: uuid.UUID) -> uuid.UUID | None:
        if batch_id in self._owners:
            self._owners.move_to_end(batch_id)
            return self._owners[batch_id]
        row = await self.db.one(
            "SELECT user_id FROM batches WHERE batch_id = ? LIMIT 1", (batch_id,)
        )
        owner = row["user_id"] if row else None
        if owner is not None:  # unknown batches are not cached: they may appear later
            self._owners[batch_id] = owner
            if len(self._owners) > OWNER_CACHE:
                self._owners.popitem(last=False)
        return owner

    async def _history(self, t: Target) -> list[dict[str, Any]]:
        return await self.db.rows(
            "SELECT at, kind, provider FROM log_events WHERE batch_id = ? AND log_id = ?",
            (t.batch_id, t.log_id),
        )

    async def _timeline(self, t: Target, ev: ProviderEvent) -> None:
        detail = ev.reason or ev.url or ev.message_id or ""
        await self.db.execute(
            "INSERT INTO log_events (batch_id, log_id, at, event_id, provider, kind, raw_event, "
            "detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                t.batch_id,
                t.log_id,
                ev.occurred_at,
                ev.event_id,
                ev.provider,
                ev.kind,
                ev.raw_event,
                detail[:1000],
            ),
            idempotent=True,
        )

    async def _update_row(
        self, t: Target, ev: ProviderEvent, event: str, state: str | None
    ) -> None:
        # The provider's own columns merge by the event's stage; the recipient-wide columns
        # (event, state) by ``write_timestamp``, which lets a re-send's events win.
        await self._set(
            t,
            stage_timestamp(ev),
            ("providers[?] = ?", ev.provider, _provider_result(ev)),
            *((("message_ids[?] = ?", ev.provider, ev.message_id),) if ev.message_id else ()),
        )
        columns: list[tuple[object, ...]] = [
            ("event = ?", event),
            ("last_update = ?", ev.occurred_at),
        ]
        if state is not None:
            columns.append(("state = ?", state))
        if state == "failed" and ev.reason:
            columns.append(("reason_detail = ?", ev.reason[:1000]))
        await self._set(t, write_timestamp(ev), *columns)

    async def _set(self, t: Target, stamp: int, *columns: tuple[object, ...]) -> None:
        sets = ", ".join(str(c[0]) for c in columns)
        values = [v for c in columns for v in c[1:]]
        await self.db.execute(
            f"UPDATE batches USING TIMESTAMP ? SET {sets} "  # noqa: S608 - fixed columns
            "WHERE batch_id = ? AND chunk = ? AND log_id = ?",
            (stamp, *values, t.batch_id, t.chunk, t.log_id),
            idempotent=True,
        )

    async def _settle_attempt(self, t: Target, ev: ProviderEvent) -> None:
        """A provider event proves the chunk was accepted: settle an attempt left ``sending``.

        Each (chunk, provider) is checked once per process (remembered, bounded): after the
        first event of a chunk nothing of it can be left ``sending`` by that provider.
        """
        key = (t.batch_id, t.chunk, ev.provider)
        if key in self._settled:
            return
        for a in await self.attempts.attempts(t.batch_id, t.chunk):
            if a.provider == ev.provider and a.state == "sending":
                await self.attempts.finish(
                    t.batch_id,
                    t.chunk,
                    a.attempt,
                    state="sent",
                    status_code=None,
                    message_id=ev.message_id,
                    error="settled by a provider event",
                )
        self._settled[key] = None
        if len(self._settled) > OWNER_CACHE:
            self._settled.popitem(last=False)

    async def _resend(self, t: Target, ev: ProviderEvent) -> None:
        row = await self.db.one(
            "SELECT providers, state FROM batches WHERE batch_id = ? AND chunk = ? AND log_id = ?",
            (t.batch_id, t.chunk, t.log_id),
        )
        if row is None or row["state"] != "queued":
            return
        tried = dict(row["providers"] or {})
        tried[ev.provider] = f"dropped: {ev.reason or ev.raw_event}"
        attempt = 1 + len(
            await self.db.rows(
                "SELECT attempt FROM log_attempts WHERE batch_id = ? AND log_id = ?",
                (t.batch_id, t.log_id),
            )
        )
        target = next_provider(self.settings.providers.chain_codes, tried, ev.provider)
        reason = f"{ev.provider} {ev.raw_event}: {ev.reason or 'provider-side failure'}"
        job = LogJob(
            batch_id=t.batch_id,
            chunk=t.chunk,
            log_id=t.log_id,
            attempt=attempt,
            reason=reason[:500],
            failed_provider=ev.provider,
        )
        if target is None:
            job = job.model_copy(update={"give_up": True})
            target = ev.provider
        self.metrics.resends.labels(target).inc()
        await self.broker.publish(
            log_key(target, t.log_id, attempt), job.encode(), message_id=f"{t.log_id}:{attempt}"
        )

    async def _schedule_deferred_check(self, t: Target, ev: ProviderEvent) -> None:
        deadline = self.settings.webhooks.deferred_deadline
        job = LogJob(
            batch_id=t.batch_id,
            chunk=t.chunk,
            log_id=t.log_id,
            attempt=0,
            reason=f"{ev.provider} deferred for over {deadline}s: {ev.reason or ''}",
            failed_provider=ev.provider,
            check_deferred=True,
        )
        await self.broker.publish(
            log_key(ev.provider, t.log_id),
            job.encode(),
            delay=self.broker.topology.delay_tier_for(deadline),
            message_id=f"{t.log_id}:deferred-check",
        )

    async def _orphan(self, ev: ProviderEvent) -> None:
        self.metrics.orphans.labels(ev.provider).inc()
        await self.db.execute(
            "INSERT INTO orphan_events (provider, day, event_id, body) VALUES (?, ?, ?, ?)",
            (
                ev.provider,
                ev.occurred_at.date(),
                ev.event_id,
                f"{ev.raw_event} {ev.email} batch={ev.batch_id} log={ev.log_id}",
            ),
            idempotent=True,
        )


def _needs_history(ev: ProviderEvent) -> bool:
    return ev.kind == "deferred"


def _provider_result(ev: ProviderEvent) -> str:
    if ev.kind in ("dropped", "bounced") and ev.reason:
        return f"{ev.kind}: {ev.reason}"[:300]
    return ev.kind
