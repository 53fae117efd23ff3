"""Events for users' webhook endpoints: their types and payload (pure), and the emitter the
send and webhook paths call with what happened to each recipient.

:meth:`HookEmitter.emit` persists one queue row per endpoint that wants the event (in the
endpoint's ordered queue, ``shared.outbound.hook_queue``) before it returns, then wakes the delivery
worker (``services.hooks``) with ``whook.<endpoint_uuid>``; a lost wake only delays
delivery until the worker's next sweep. A user without endpoints costs one cached lookup:
a user's endpoints are remembered for :data:`CACHE_SECONDS` (an endpoint created meanwhile
gets its first events that much later, never events from before it existed).

Each event's ``webhook-id`` is derived from its source (``source_id``: a provider event's id,
an attempt's id) and its type, so the same event emitted twice (a provider webhook delivered
twice, a retried consumer) is the same message and receivers can de-duplicate; retries and
replays carry it too. Events reach an endpoint in the order they were emitted; the events
of one call are put in the order they occurred first.

:class:`FakeUserHooks` is the in-memory twin for tests of code that emits.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final, Literal, Protocol

import orjson

from shared.core.errors import DependencyUnavailable
from shared.infra.broker import Broker
from shared.infra.db import Database
from shared.infra.topology import wake_key
from shared.outbound.hook_queue import HookQueue, Queued
from shared.outbound.hook_store import Endpoint, HookStore

log = logging.getLogger(__name__)

#: Every event type an endpoint can subscribe to.
EVENT_TYPES: Final = (
    "recipient.attempt",
    "recipient.sent",
    "recipient.delivered",
    "recipient.deferred",
    "recipient.bounced",
    "recipient.dropped",
    "recipient.complained",
    "recipient.unsubscribed",
    "recipient.opened",
    "recipient.clicked",
    "recipient.failed_over",
)
#: The subscription to every type (also what an empty list means).
ALL: Final = "*"
#: Seconds a process remembers a user's endpoints.
CACHE_SECONDS: Final = 5.0

Evidence = Literal["webhook", "provider query", "api"]


class EventsError(ValueError):
    """An event filter names a type that does not exist; the message names it."""


def parse_events(requested: Iterable[str] | None) -> frozenset[str]:
    """The stored form of an event filter: empty for "every type" (``[]``, omitted or
    ``["*"]``), else the named types. Raises EventsError naming an unknown one."""
    wanted = set(requested or ())
    if ALL in wanted:
        if len(wanted) > 1:
            raise EventsError('"*" already means every event; list types or "*" alone')
        return frozenset()
    unknown = sorted(wanted - set(EVENT_TYPES))
    if unknown:
        raise EventsError(f"unknown event type {', '.join(map(repr, unknown))}")
    return frozenset(wanted)


def shown_events(stored: frozenset[str]) -> list[str]:
    """An event filter as users see it: ``["*"]`` for every type."""
    return sorted(stored) if stored else [ALL]


def wants(events: frozenset[str], event_type: str) -> bool:
    return not events or event_type in events


@dataclass(frozen=True, slots=True)
class HookEvent:
    """One thing that happened to one recipient."""

    type: str
    """One of :data:`EVENT_TYPES`."""
    source_id: str
    """What it came from, unique per event (a provider event's id, an attempt's id): the
    ``webhook-id`` is derived from it and ``type``."""
    occurred_at: datetime
    batch_id: uuid.UUID
    log_id: uuid.UUID
    email: str
    provider: str | None = None
    attempt: int | None = None
    outcome: str | None = None
    evidence: Evidence = "api"
    reason: str | None = None
    attempt_id: str | None = None
    """The provider attempt's id (``recipient.attempt``, ``recipient.failed_over``)."""

    def __post_init__(self) -> None:
        if self.type not in EVENT_TYPES:
            raise ValueError(f"unknown webhook event type {self.type!r}")
        if self.occurred_at.tzinfo is None:
            raise ValueError("occurred_at must be timezone-aware")


def message_id(event: HookEvent) -> str:
    """The event's ``webhook-id``: the same for the same source and type, every time."""
    digest = hashlib.sha256(f"{event.type}\x00{event.source_id}".encode()).hexdigest()
    return f"msg_{digest[:32]}"


def payload(event: HookEvent) -> bytes:
    """The JSON body delivered for ``event``."""
    return orjson.dumps(
        {
            "type": event.type,
            "timestamp": event.occurred_at.astimezone(UTC).isoformat(),
            "data": {
                "batch_id": str(event.batch_id),
                "log_id": str(event.log_id),
                "email": event.email,
                "provider": event.provider,
                "attempt": event.attempt,
                "outcome": event.outcome,
                "evidence": event.evidence,
                "reason": event.reason,
                "attempt_id": event.attempt_id,
                "occurred_at": event.occurred_at.astimezone(UTC).isoformat(),
            },
        }
    )


def queued_for(endpoints: Sequence[Endpoint], events: Sequence[HookEvent]) -> list[Queued]:
    """What to queue: each event, in order of occurrence, for each endpoint collecting events
    (``Endpoint.collecting``) that wants it."""
    ordered = sorted(events, key=lambda e: e.occurred_at)
    return [
        Queued(ep.endpoint_id, message_id(ev), ev.type, payload(ev))
        for ev in ordered
        for ep in endpoints
        if ep.collecting and wants(ep.events, ev.type)
    ]


class UserHooks(Protocol):
    """Where the send and webhook paths report what happened to recipients."""

    async def listening(self, user_id: uuid.UUID) -> bool:
        """Whether any endpoint of ``user_id`` collects events (so a caller builds events
        only for users who will get them)."""
        ...

    async def emit(self, user_id: uuid.UUID, events: Sequence[HookEvent]) -> int:
        """Queue ``events`` for every endpoint of ``user_id`` that wants them, persisted
        before returning; returns how many deliveries were queued. Raises
        DependencyUnavailable when they could not be stored (nothing may have been)."""
        ...


class HookEmitter:
    """The real :class:`UserHooks`: Cassandra for the queues, RabbitMQ for the wake-ups.

    Build one per process in the lifespan, once its resources are open:
    ``HookEmitter(res.db, res.broker)``.
    """

    def __init__(
        self, db: Database, broker: Broker, *, cache_seconds: float = CACHE_SECONDS
    ) -> None:
        self.store = HookStore(db)
        self.queue = HookQueue(db)
        self.broker = broker
        self.cache_seconds = cache_seconds
        self._cache: dict[uuid.UUID, tuple[float, list[Endpoint]]] = {}

    async def endpoints(self, user_id: uuid.UUID) -> list[Endpoint]:
        now = time.monotonic()
        cached = self._cache.get(user_id)
        if cached is not None and now - cached[0] < self.cache_seconds:
            return cached[1]
        found = await self.store.endpoints(user_id)
        if len(self._cache) > 100_000:
            self._cache.clear()
        self._cache[user_id] = (now, found)
        return found

    async def listening(self, user_id: uuid.UUID) -> bool:
        return any(ep.collecting for ep in await self.endpoints(user_id))

    async def emit(self, user_id: uuid.UUID, events: Sequence[HookEvent]) -> int:
        if not events:
            return 0
        endpoints = await self.endpoints(user_id)
        if not endpoints:
            return 0
        rows = queued_for(endpoints, events)
        if not rows:
            return 0
        await self.queue.enqueue(rows)
        for endpoint_id in dict.fromkeys(r.endpoint_id for r in rows):
            await wake(self.broker, user_id, endpoint_id)
        return len(rows)


async def wake(
    broker: Broker, user_id: uuid.UUID, endpoint_id: uuid.UUID, *, delay: int | None = None
) -> bool:
    """Ask the delivery worker to look at an endpoint (now, or after ``delay`` seconds, a
    declared delay tier). False when the broker did not take it: the worker's sweep will."""
    body = orjson.dumps({"user_id": str(user_id), "endpoint_id": str(endpoint_id)})
    try:
        await broker.publish(wake_key(endpoint_id), body, delay=delay)
    except DependencyUnavailable as exc:
        log.warning("webhook endpoint %s not woken (the sweep will): %s", endpoint_id, exc)
        return False
    return True


@dataclass
class FakeUserHooks:
    """In-memory :class:`UserHooks`: endpoints are registered with :meth:`add`; what was
    queued is in :attr:`queued`, per endpoint, in order."""

    endpoints: dict[uuid.UUID, list[Endpoint]] = field(default_factory=dict)
    queued: dict[uuid.UUID, list[Queued]] = field(default_factory=dict)

    def add(self, user_id: uuid.UUID, endpoint: Endpoint) -> None:
        self.endpoints.setdefault(user_id, []).append(endpoint)

    async def listening(self, user_id: uuid.UUID) -> bool:
        return any(ep.collecting for ep in self.endpoints.get(user_id, []))

    async def emit(self, user_id: uuid.UUID, events: Sequence[HookEvent]) -> int:
        rows = queued_for(self.endpoints.get(user_id, []), events)
        for row in rows:
            self.queued.setdefault(row.endpoint_id, []).append(row)
        return len(rows)
