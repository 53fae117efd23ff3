"""The provider-event timeline: the one writer of ``log_events`` (each recipient's events,
keyed by the provider's event id, so a replayed event is the same row) and of
``orphan_events`` (events that match no recipient we know, kept for the operator)."""

from __future__ import annotations

import uuid
from typing import Protocol

from cassandra.query import BoundStatement

from shared.core.webhook_events import ProviderEvent
from shared.infra.db import Database

#: Longest detail stored with an event.
MAX_DETAIL = 1000


def detail_of(ev: ProviderEvent) -> str:
    """What the timeline shows next to an event: its reason, link or message id."""
    return (ev.reason or ev.url or ev.message_id or "")[:MAX_DETAIL]


def orphan_body(ev: ProviderEvent) -> str:
    """What is kept of an event that matched no recipient."""
    return f"{ev.raw_event} {ev.email} batch={ev.batch_id} log={ev.log_id}"


class Timelines(Protocol):
    """What callers use of :class:`Timeline` (the store, or its in-memory twin)."""

    async def record(
        self, batch_id: uuid.UUID, log_id: uuid.UUID, ev: ProviderEvent, *, counted: bool
    ) -> None: ...

    async def statement(
        self, batch_id: uuid.UUID, log_id: uuid.UUID, ev: ProviderEvent, *, counted: bool
    ) -> BoundStatement: ...

    async def orphan(self, ev: ProviderEvent) -> None: ...


class Timeline:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def record(
        self, batch_id: uuid.UUID, log_id: uuid.UUID, ev: ProviderEvent, *, counted: bool
    ) -> None:
        """One event on a recipient's timeline (``counted``: it decided the recipient's state
        or stats, rather than arriving for an attempt already handed over)."""
        await self.db.batch([await self.statement(batch_id, log_id, ev, counted=counted)])

    async def statement(
        self, batch_id: uuid.UUID, log_id: uuid.UUID, ev: ProviderEvent, *, counted: bool
    ) -> BoundStatement:
        """:meth:`record`'s write, for a caller to send with the recipient's own (the same
        partition: one mutation)."""
        insert = await self.db.prepare(
            "INSERT INTO log_events (batch_id, log_id, at, event_id, provider, kind, raw_event, "
            "detail, attempt, counted) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        return insert.bind(
            (
                batch_id,
                log_id,
                ev.occurred_at,
                ev.event_id,
                ev.provider,
                ev.kind,
                ev.raw_event,
                detail_of(ev),
                ev.attempt,
                counted,
            )
        )

    async def orphan(self, ev: ProviderEvent) -> None:
        """An event matching no recipient (unknown batch or address)."""
        await self.db.execute(
            "INSERT INTO orphan_events (provider, day, event_id, body) VALUES (?, ?, ?, ?)",
            (ev.provider, ev.occurred_at.date(), ev.event_id, orphan_body(ev)),
            idempotent=True,
        )
