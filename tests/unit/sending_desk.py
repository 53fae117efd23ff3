"""A ``Sending`` (``services.api.sending``) over the twins, as the API's lifespan builds it
over Cassandra and RabbitMQ: the real :class:`~shared.delivery.acceptance.Acceptance` over the
batch, outbox, quota and broker twins, the Idempotency-Key and suppression twins, and the relay
that finishes what a request left behind."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from prometheus_client import CollectorRegistry

from services.api.sending import Sending
from shared.accounts.ratelimit import QuotaLedger
from shared.core.errors import DependencyUnavailable
from shared.delivery.acceptance import Acceptance
from shared.delivery.outbox import Relay
from shared.infra.background import Background
from shared.infra.config import ApiSettings, CassandraSettings, ProviderSettings, Settings
from shared.infra.metrics import ApiMetrics
from tests.fakes.accounts import FakeQuota
from tests.fakes.api import FakeIdempotencyStore
from tests.fakes.audience import FakeSuppressionStore
from tests.fakes.broker import FakeBroker
from tests.fakes.cassandra import FakeCassandra
from tests.fakes.delivery import FakeBatches, FakeOutbox, FakeSchedule, ScheduleTables

A, B = "ann@example.com", "bob@example.com"
#: What a Cassandra request that times out raises (whether it applied or not).
TIMEOUT = DependencyUnavailable("cassandra", "WriteTimeout (injected)")


def body_of(*to: str, subject: str = "Hi", **more: Any) -> dict[str, Any]:
    return {
        "from": "shop@example.com",
        "to": list(to),
        "subject": subject,
        "text": "Hello",
        **more,
    }


@dataclass
class Desk:
    """A ``Sending`` over twins (the real :class:`Acceptance` over the batch, outbox, quota
    and broker twins), and the twins to inspect."""

    sending: Sending
    acceptance: Acceptance
    db: FakeCassandra
    batches: FakeBatches
    outbox: FakeOutbox
    broker: FakeBroker
    quota: FakeQuota
    suppressions: FakeSuppressionStore
    idempotency: FakeIdempotencyStore
    user: uuid.UUID = field(default_factory=uuid.uuid4)

    async def accept(self, body: dict[str, Any], key: str | None) -> dict[str, Any]:
        return await self.sending.accept(self.user, body, key)

    async def status(self, batch_id: str) -> str | None:
        status: str | None = await self.batches.status(uuid.UUID(batch_id))
        return status

    async def used(self) -> int:
        """Recipients charged to today's quota, less those given back."""
        return await self.sending.quota.used(self.user, datetime.now(UTC).date())

    def published(self) -> list[str]:
        """The batches published so far (taken)."""
        return [m.routing_key.removeprefix("batch.") for m in self.broker.take()]

    async def relay(self, *, after: float) -> int:
        """One pass of the outbox relay, ``after`` seconds from now."""
        relay = Relay(self.outbox, self.acceptance.finish, grace=0)
        now = datetime.now(UTC) + timedelta(seconds=after)
        self.acceptance.clock = lambda: now
        return await relay.once(now)


async def new_desk(lease: float, *, cassandra: CassandraSettings | None = None, **api: Any) -> Desk:
    """``cassandra``: the limits the API holds batches to (default: Cassandra's own)."""
    db = FakeCassandra()
    batches, outbox, broker = FakeBatches(db), FakeOutbox(db), FakeBroker()
    quota = FakeQuota(db)
    acceptance = Acceptance(
        batches,
        outbox,
        broker,  # type: ignore[arg-type]
        refunds=quota,
        decide_within=timedelta(seconds=60),
    )
    suppressions, idempotency = FakeSuppressionStore(db), FakeIdempotencyStore(lease=lease)
    sending = Sending(
        settings=Settings(
            api=ApiSettings(sender_domains="any", **api),
            providers=ProviderSettings(),
            cassandra=cassandra or CassandraSettings(),
        ),
        acceptance=acceptance,
        batches=batches,
        suppressions=suppressions,
        idempotency=idempotency,
        quota=QuotaLedger(quota),
        metrics=ApiMetrics.create(CollectorRegistry()),
        background=Background(),
        schedules=FakeSchedule("ns", ScheduleTables()),
    )
    return Desk(sending, acceptance, db, batches, outbox, broker, quota, suppressions, idempotency)
