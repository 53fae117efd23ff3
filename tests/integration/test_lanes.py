"""Priority lanes on the real RabbitMQ, Cassandra, API and sandbox providers: an existing
deployment gets the bulk queues when it declares, a bulk batch's chunks wait in the providers'
bulk queues, its failover stays there, and transactional mail overtakes a bulk batch that is
still draining."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from services.consumers.faults import no_faults
from shared.core.errors import PublishError
from shared.infra.broker import Broker
from shared.infra.config import AmqpSettings, Settings
from shared.infra.db import Database
from shared.infra.resources import topology_for
from shared.infra.topology import QueueSpec, Topology, dispatch_key
from tests.integration.harness import eventually
from tests.integration.stack import Stack, emails, fast_settings, full_stack


@pytest.fixture
async def stack(settings: Settings, db: Database) -> AsyncIterator[Stack]:
    async with full_stack(fast_settings(settings), db) as s:
        yield s


async def _depth(stack: Stack, queue: str) -> int:
    return int(await stack.api_app.state.resources.broker.queue_depth(queue))


async def _provider_total(stack: Stack) -> int:
    """Recipients every sandbox provider accepted so far."""
    resp = await stack.sandbox.get("/_control/sends", params={"recent": "0"})
    return sum(int(p["recipients"]) for p in resp.json().values())


class _BeforeLanes(Topology):
    """The topology of the release before lanes: no bulk queues."""

    def work_queues(self) -> list[QueueSpec]:
        return [q for q in super().work_queues() if not q.name.endswith(".bulk")]


async def test_an_existing_deployment_gets_the_bulk_queues_at_declare_time(
    services_up: None, exchange_name: str
) -> None:
    """Declaring this release's topology over the previous one's adds the bulk queues and
    keeps the work already queued."""
    url = AmqpSettings().url.get_secret_value()
    old = Broker(url, _BeforeLanes(exchange=exchange_name, delay_tiers=(1,)), name="old")
    new = Broker(url, Topology(exchange=exchange_name, delay_tiers=(1,)), name="new")
    await old.connect()
    await new.connect()
    try:
        await old.declare()
        await old.publish(dispatch_key("sg", uuid.uuid4()), b"{}")
        with pytest.raises(PublishError, match="unroutable"):
            await old.publish(dispatch_key("sg", uuid.uuid4(), 0, "bulk"), b"{}")

        await new.declare()
        await new.publish(dispatch_key("sg", uuid.uuid4(), 0, "bulk"), b"{}")

        assert await new.queue_depth(new.topology.bulk_queue("sg")) == 1
        assert await new.queue_depth(new.topology.provider_queue("sg")) == 1
    finally:
        await new.delete()
        await old.close()
        await new.close()


async def test_a_bulk_batch_is_announced_and_queued_in_the_bulk_lane(stack: Stack) -> None:
    """The 202 and the batch view say ``bulk``; its chunks wait in the first provider's bulk
    queue, none in its transactional one."""
    resp = await stack.post(emails(3), priority="bulk")
    assert resp.status_code == 202, resp.text
    batch_id = resp.json()["batch_id"]
    assert resp.json()["priority"] == "bulk"
    view = await stack.api.get(f"/v1/batches/{batch_id}", headers=stack.auth)
    assert view.json()["priority"] == "bulk"

    await stack.split(batch_id)

    t = topology_for(stack.settings)
    assert await eventually(lambda: _at_least(stack, t.bulk_queue("sg"), 1)) == 1
    assert await _depth(stack, t.provider_queue("sg")) == 0


async def test_a_bulk_chunk_fails_over_within_the_bulk_lane(stack: Stack) -> None:
    """SendGrid refuses the bulk chunk (429): its next attempt goes to Mailgun's bulk queue
    as ``bulk.mg.<uuid>.retry.1``, not to Mailgun's transactional queue."""
    await stack.fault("sendgrid", status=429, count=1)
    batch_id = await stack.submit(emails(2), priority="bulk")
    await stack.split(batch_id)
    t = topology_for(stack.settings)

    assert await stack.doomed(t.bulk_queue("sg"), no_faults) == "survived"

    broker = stack.api_app.state.resources.broker
    message = await eventually(lambda: broker.get(t.bulk_queue("mg")), timeout=20)
    assert message.routing_key == dispatch_key("mg", uuid.UUID(batch_id), 1, "bulk")
    await message.nack(requeue=True)
    assert await _depth(stack, t.provider_queue("mg")) == 0


async def test_transactional_mail_overtakes_a_draining_bulk_batch(stack: Stack) -> None:
    """A one-recipient batch accepted while thousands of bulk recipients wait reaches the
    provider before the bulk batches have drained."""
    bulk = [emails(5_000, prefix=f"b{n}-") for n in range(4)]
    for group in bulk:
        await stack.split(await stack.submit(group, priority="bulk"))
    total = sum(len(group) for group in bulk)
    (urgent,) = emails(1, prefix="urgent")

    async with stack.consuming():
        await eventually(lambda: _drained_some(stack), timeout=30)
        await stack.submit([urgent])
        await eventually(lambda: _arrived(stack, urgent), timeout=30, interval=0.05)
        at_arrival = await _provider_total(stack) - 1

    assert at_arrival < total, f"the bulk batches had drained ({at_arrival:,}) first"


async def _at_least(stack: Stack, queue: str, n: int) -> int | None:
    depth = await _depth(stack, queue)
    return depth if depth >= n else None


async def _drained_some(stack: Stack) -> bool | None:
    """Whether the bulk drain has started (a provider accepted some of it)."""
    return True if await _provider_total(stack) > 0 else None


async def _arrived(stack: Stack, email: str) -> bool | None:
    return True if sum((await stack.accepted(email)).values()) else None
