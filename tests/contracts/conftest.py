"""Each contract test runs twice: over the in-memory twin (``fake``) and over the real
store on Cassandra or the real broker on RabbitMQ (``real``, an integration test)."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from datetime import date
from typing import Any

import orjson
import pytest

from services.webhooks.webhook_tokens import WebhookTokens
from shared.audience.suppressions import SuppressionStore
from shared.core.batch_ids import accepted_at
from shared.delivery.attempts import AttemptStore
from shared.delivery.batchstore import BatchStore, NewBatch
from shared.delivery.precedence import queued_stamp
from shared.delivery.recipients import RecipientStore, log_id_for
from shared.delivery.stats import Rollup, StatsStore
from shared.infra.db import Database
from shared.ingest.timeline import Timeline
from tests.fakes.audience import FakeSuppressions
from tests.fakes.broker import FakeBroker
from tests.fakes.cassandra import FakeCassandra
from tests.fakes.delivery import FakeAttempts, FakeBatches, FakeRecipients, FakeStats
from tests.fakes.webhooks import FakeTimeline, FakeWebhookTokens

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

    async def legacy(self, batch: NewBatch) -> None:
        """Store ``batch``'s recipients as release v1 did (before data model v2): one row per
        recipient, ``queued`` at acceptance, and no chunk rows."""
        created, queued = accepted_at(batch.batch_id), queued_stamp(batch.batch_id)
        for i, r in enumerate(batch.recipients):
            log_id = log_id_for(batch.batch_id, r.email)
            subs = orjson.dumps(dict(r.substitutions)).decode() if r.substitutions else None
            values = {
                "email": r.email,
                "name": r.name,
                "substitutions": subs,
                "state": "queued",
                "event": "queued",
                "last_update": created,
            }
            if isinstance(self.db, FakeCassandra):
                self.db.insert(batch.batch_id, batch.chunk_of(i), log_id, values, queued)
                continue
            await self.db.execute(
                "INSERT INTO batches (batch_id, chunk, log_id, email, name, substitutions, "
                "state, event, last_update) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) USING TIMESTAMP ?",
                (batch.batch_id, batch.chunk_of(i), log_id, *values.values(), queued),
            )

    async def store_rollup(
        self, user_id: uuid.UUID, day: date, bucket: int, rollup: Rollup
    ) -> None:
        """Overwrite a bucket's stored rollup (as a lost or wrong rollup write would)."""
        if isinstance(self.db, FakeCassandra):
            self.db.stat_rows[(user_id, day, bucket)].static.put(
                "rollup", rollup.encode(), self.db.stamp()
            )
            return
        await self.db.execute(
            "UPDATE stat_rows SET rollup = ? WHERE user_id = ? AND day = ? AND bucket = ?",
            (rollup.encode(), user_id, day, bucket),
        )

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
        batches=BatchStore(db, real_stats),
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
