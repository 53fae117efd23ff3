"""The broker contract: routing by the topology, delays, and refusing unroutable keys,
asserted identically of the in-memory twin and of the real broker on RabbitMQ."""

from __future__ import annotations

import uuid

import pytest

from shared.core.errors import PublishError
from shared.infra.topology import batch_key, dispatch_key, log_key
from tests.contracts.conftest import Brokers


@pytest.mark.parametrize(
    ("key", "queue"),
    [
        (lambda: batch_key(uuid.uuid1()), "batches_queue"),
        (lambda: dispatch_key("mg", uuid.uuid1(), 2), "mg"),
        (lambda: log_key("sg", uuid.uuid1(), 1), "log.sg"),
        (lambda: "hook.mg", "webhooks_queue"),
    ],
    ids=["batch", "dispatch", "log", "hook"],
)
async def test_a_message_reaches_the_queue_its_key_is_bound_to(
    brokers: Brokers, key: object, queue: str
) -> None:
    topology = brokers.broker.topology
    name = {
        "batches_queue": topology.batches_queue,
        "webhooks_queue": topology.webhooks_queue,
        "mg": topology.provider_queue("mg"),
        "log.sg": topology.log_queue("sg"),
    }[queue]
    routing_key = key()  # type: ignore[operator]
    await brokers.broker.publish(routing_key, b'{"n": 1}', message_id="m-1")
    message = await brokers.arrived(name, within=5)
    assert message is not None
    assert (message.routing_key, message.body, message.message_id) == (
        routing_key,
        b'{"n": 1}',
        "m-1",
    )
    assert await brokers.arrived(topology.provider_queue("sg")) is None


async def test_a_delayed_message_waits_then_arrives_under_its_own_key(brokers: Brokers) -> None:
    topology = brokers.broker.topology
    key = dispatch_key("sg", uuid.uuid1(), 1)
    await brokers.broker.publish(key, b"{}", delay=1, message_id="d-1")
    assert await brokers.arrived(topology.provider_queue("sg")) is None
    message = await brokers.arrived(topology.provider_queue("sg"), within=10)
    assert message is not None
    assert (message.routing_key, message.message_id) == (key, "d-1")


async def test_an_unroutable_key_is_refused(brokers: Brokers) -> None:
    with pytest.raises(PublishError, match="unroutable"):
        await brokers.broker.publish("nobody.listens", b"{}")
