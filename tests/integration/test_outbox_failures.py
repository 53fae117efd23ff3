"""The outbox relay over real Cassandra and RabbitMQ when finishing goes wrong: a publish the
broker refuses, an acceptance finished twice, a cancelled batch, a batch that never landed,
and another namespace's rows. Each test has its own outbox namespace and topology."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import pytest
from cassandra.util import uuid_from_time

from shared.core.errors import PublishError
from shared.delivery.acceptance import Acceptance
from shared.delivery.batchstore import BatchStore, NewBatch
from shared.delivery.outbox import Outbox, Relay
from shared.infra.broker import Broker
from shared.infra.db import Database
from shared.infra.topology import Topology
from tests.conftest import unique
from tests.fakes.world import new_batch


@dataclass
class _Stack:
    db: Database
    broker: Broker
    outbox: Outbox
    acceptance: Acceptance

    async def stored(self) -> NewBatch:
        """A batch stored with its outbox row, as the API does before it publishes."""
        batch = new_batch(f"{uuid.uuid4().hex[:8]}@example.org")
        await self.acceptance.store(batch)
        return batch

    def relay(self, acceptance: Acceptance | None = None, *, since: uuid.UUID) -> Relay:
        """A relay with no grace period, looking back only to ``since``'s minute (the first
        pass would otherwise read an hour of empty minutes)."""
        relay = Relay(self.outbox, (acceptance or self.acceptance).finish, grace=0)
        relay.since = Outbox.bucket(since)[0]
        return relay

    async def pending(self, batch_id: uuid.UUID) -> bool:
        return batch_id in await self.outbox.unpublished(*Outbox.bucket(batch_id))

    async def batch_jobs(self) -> list[str | None]:
        """The message ids of the batch jobs that reached the batches queue (taken)."""
        ids = []
        while (message := await self.broker.get(self.broker.topology.batches_queue)) is not None:
            ids.append(message.message_id)
            await message.ack()
        return ids


@pytest.fixture
async def stack(db: Database, broker: Broker) -> _Stack:
    outbox = Outbox(db, unique("ns"))
    acceptance = Acceptance(BatchStore(db), outbox, broker, decide_within=timedelta(0))
    return _Stack(db, broker, outbox, acceptance)


@pytest.fixture
async def refusing(stack: _Stack) -> AsyncIterator[Acceptance]:
    """An acceptance whose broker routes no batch key (the delay exchange binds on headers
    only): every publish comes back unroutable, as when the batches queue is gone."""
    t = stack.broker.topology
    broker = Broker(stack.broker.url, Topology(exchange=t.delay_exchange), name="refusing")
    await broker.connect()
    try:
        yield Acceptance(BatchStore(stack.db), stack.outbox, broker)
    finally:
        await broker.close()


async def test_a_publish_the_broker_refuses_is_left_for_the_next_pass(
    stack: _Stack, refusing: Acceptance
) -> None:
    batch = await stack.stored()

    with pytest.raises(PublishError, match="unroutable"):
        await stack.relay(refusing, since=batch.batch_id).once()

    assert await stack.pending(batch.batch_id)
    assert await stack.batch_jobs() == []

    assert await stack.relay(since=batch.batch_id).once() == 1

    assert not await stack.pending(batch.batch_id)
    assert await stack.batch_jobs() == [str(batch.batch_id)]


async def test_an_acceptance_finished_twice_at_once_publishes_under_one_message_id(
    stack: _Stack,
) -> None:
    """The API's retry and the relay may finish the same batch together: both publishes
    carry the batch id as message id (the splitter dedupes on it), and the row ends published."""
    batch = await stack.stored()

    headers = await asyncio.gather(*(stack.acceptance.finish(batch.batch_id) for _ in range(2)))

    assert [h.batch_id if h else None for h in headers] == [batch.batch_id] * 2
    assert set(await stack.batch_jobs()) == {str(batch.batch_id)}
    assert not await stack.pending(batch.batch_id)
    assert await stack.relay(since=batch.batch_id).once() == 0


async def test_a_cancelled_batch_is_marked_and_never_published(stack: _Stack) -> None:
    """Its client was told the request failed: the relay settles it and must not send it."""
    batch = replace(new_batch(f"{uuid.uuid4().hex[:8]}@example.org"), pending=True)
    await stack.acceptance.store(batch)
    assert await stack.acceptance.batches.cancel(batch.batch_id) == "cancelled"

    assert await stack.relay(since=batch.batch_id).once() == 1

    assert not await stack.pending(batch.batch_id)
    assert await stack.batch_jobs() == []


async def test_a_batch_its_request_never_committed_is_cancelled_not_published(
    stack: _Stack,
) -> None:
    """Stored pending by a request without a key that then died: the relay leaves it while
    the request could still commit it, then cancels it and never publishes it."""
    batch = replace(new_batch(f"{uuid.uuid4().hex[:8]}@example.org"), pending=True)
    await stack.acceptance.store(batch)
    patient = replace(stack.acceptance, decide_within=timedelta(hours=1))

    assert await stack.relay(patient, since=batch.batch_id).once() == 0
    assert await stack.pending(batch.batch_id)
    assert await stack.relay(since=batch.batch_id).once() == 1

    assert await stack.acceptance.batches.status(batch.batch_id) == "cancelled"
    assert not await stack.pending(batch.batch_id)
    assert await stack.batch_jobs() == []


async def test_a_row_whose_batch_never_landed_waits_then_is_abandoned(stack: _Stack) -> None:
    """Only the outbox row was written: the relay leaves it while the batch's write may still
    land, and gives it up an hour after acceptance, publishing nothing either way."""
    young = uuid_from_time(datetime.now(UTC) - timedelta(minutes=2))
    old = uuid_from_time(datetime.now(UTC) - timedelta(hours=2))
    for batch_id in (young, old):
        await stack.outbox.add(batch_id, uuid.uuid4())

    relay = stack.relay(since=old)
    assert await relay.once() == 0

    assert await stack.pending(young)
    assert not await stack.pending(old)
    assert relay.since == Outbox.bucket(young)[0]  # it keeps looking from the young row
    assert await stack.batch_jobs() == []


async def test_a_relay_leaves_the_rows_of_another_namespace_alone(stack: _Stack) -> None:
    """Two deployments sharing a keyspace (two exchanges) never publish each other's batches."""
    batch = await stack.stored()
    other = Outbox(stack.db, unique("ns"))
    relay = Relay(other, Acceptance(BatchStore(stack.db), other, stack.broker).finish, grace=0)
    relay.since = Outbox.bucket(batch.batch_id)[0]

    assert await relay.once() == 0

    assert await stack.pending(batch.batch_id)
    assert await stack.batch_jobs() == []
