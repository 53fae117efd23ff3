"""Each contract test runs twice: over the in-memory twin (``fake``) and over the real
store on Cassandra or the real broker on RabbitMQ (``real``, an integration test)."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from datetime import date
from typing import Any

import pytest

from shared.attempts import AttemptStore
from shared.batchstore import BatchStore
from shared.db import Database
from shared.recipients import RecipientStore
from shared.stats import StatsStore
from shared.suppressions import SuppressionStore
from shared.timeline import Timeline
from shared.webhook_tokens import WebhookTokens
from tests.fakes.broker import FakeBroker
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

IMPLEMENTATIONS = ["fake", pytest.param("real", marks=pytest.mark.integration)]


@dataclass
class Stores:
    """The stores under contract, and how to read back what write-only ones wrote."""

    batches: Any
    recipients: Any
    stats: Any
    attempts: Any
    suppressions: Any
    timeline: Any
    tokens: Any
    db: Database | FakeCassandra

    async def events(self, batch_id: uuid.UUID, log_id: uuid.UUID) -> list[tuple[str, bool]]:
        """A recipient's timeline rows as ``(event_id, counted)``, in time order."""
        if isinstance(self.db, FakeCassandra):
            return [
                (e, row["counted"])
                for (b, log, _, e), row in sorted(self.db.events.items(), key=lambda i: i[0][2])
                if (b, log) == (batch_id, log_id)
            ]
        rows = await self.db.rows(
            "SELECT event_id, counted FROM log_events WHERE batch_id = ? AND log_id = ?",
            (batch_id, log_id),
        )
        return [(r["event_id"], r["counted"]) for r in rows]

    async def orphaned(self, provider: str, day: date, event_id: str) -> bool:
        if isinstance(self.db, FakeCassandra):
            return (provider, day, event_id) in self.db.orphans
        row = await self.db.one(
            "SELECT event_id FROM orphan_events WHERE provider = ? AND day = ? AND event_id = ?",
            (provider, day, event_id),
        )
        return row is not None


@pytest.fixture(params=IMPLEMENTATIONS)
def stores(request: pytest.FixtureRequest) -> Stores:
    if request.param == "fake":
        fake = FakeCassandra()
        stats = FakeStats(fake)
        return Stores(
            batches=FakeBatches(fake, stats),
            recipients=FakeRecipients(fake, stats),
            stats=stats,
            attempts=FakeAttempts(fake),
            suppressions=FakeSuppressions(fake),
            timeline=FakeTimeline(fake),
            tokens=FakeWebhookTokens(fake),
            db=fake,
        )
    db: Database = request.getfixturevalue("db")
    real_stats = StatsStore(db)
    return Stores(
        batches=BatchStore(db),
        recipients=RecipientStore(db, real_stats),
        stats=real_stats,
        attempts=AttemptStore(db),
        suppressions=SuppressionStore(db),
        timeline=Timeline(db),
        tokens=WebhookTokens(db),
        db=db,
    )


@dataclass
class Brokers:
    broker: Any

    async def arrived(self, queue: str, *, within: float = 0.0) -> Any:
        """The next message on ``queue``, waiting up to ``within`` seconds (delays pass
        instantly for the twin)."""
        if isinstance(self.broker, FakeBroker):
            if within:
                self.broker.expire()
            return await self.broker.get(queue)
        deadline = asyncio.get_running_loop().time() + within
        while True:
            message = await self.broker.get(queue)
            if message is not None:
                await message.ack()
                return message
            if asyncio.get_running_loop().time() >= deadline:
                return None
            await asyncio.sleep(0.1)


@pytest.fixture(params=IMPLEMENTATIONS)
def brokers(request: pytest.FixtureRequest) -> Brokers:
    if request.param == "fake":
        return Brokers(FakeBroker())
    return Brokers(request.getfixturevalue("broker"))
