"""Twins of the stores the webhooks process uses: the timeline (:class:`FakeTimeline`, of
:mod:`shared.ingest.timeline`) and webhook tokens (:class:`FakeWebhookTokens`), their rows in
:class:`tests.fakes.cassandra.FakeCassandra` with the semantics its module describes.
"""

from __future__ import annotations

import uuid
from functools import partial

from services.webhooks.webhook_tokens import Tokens
from shared.core.webhook_events import ProviderEvent
from shared.ingest.timeline import Timelines
from tests.fakes.cassandra import FakeCassandra, Write, as_stored


class FakeTimeline(Timelines):
    """Twin of :class:`shared.ingest.timeline.Timeline`."""

    def __init__(self, db: FakeCassandra) -> None:
        self.db = db

    async def record(
        self, batch_id: uuid.UUID, log_id: uuid.UUID, ev: ProviderEvent, *, counted: bool
    ) -> None:
        failure = await self.db._before("timeline.record")
        self._put(batch_id, log_id, ev, counted)
        self.db._after(failure)

    async def statement(
        self, batch_id: uuid.UUID, log_id: uuid.UUID, ev: ProviderEvent, *, counted: bool
    ) -> Write:
        return partial(self._put, batch_id, log_id, ev, counted)

    def _put(
        self, batch_id: uuid.UUID, log_id: uuid.UUID, ev: ProviderEvent, counted: bool
    ) -> None:
        self.db.events[(batch_id, log_id, as_stored(ev.occurred_at), ev.event_id)] = {
            "kind": ev.kind,
            "provider": ev.provider,
            "attempt": ev.attempt,
            "counted": counted,
        }

    async def orphan(self, ev: ProviderEvent) -> None:
        failure = await self.db._before("timeline.orphan")
        self.db.orphans[(ev.provider, ev.occurred_at.date(), ev.event_id)] = ev.raw_event
        self.db._after(failure)


class FakeWebhookTokens(Tokens):
    """Twin of :class:`services.webhooks.webhook_tokens.WebhookTokens`."""

    def __init__(self, db: FakeCassandra) -> None:
        self.db = db

    async def accept_once(self, token: str, body_hash: bytes) -> bool:
        failure = await self.db._before("tokens.accept_once")
        first = self.db.tokens.setdefault(token, body_hash)
        self.db._after(failure)
        return first == body_hash
