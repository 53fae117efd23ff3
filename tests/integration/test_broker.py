"""The broker adapter and topology against the real RabbitMQ."""

from __future__ import annotations

import asyncio
import os
import uuid
from urllib.parse import quote

import aio_pika
import httpx
import pytest

from shared.core.errors import DependencyUnavailable, PublishError
from shared.infra.broker import Broker
from shared.infra.config import AmqpSettings
from shared.infra.topology import Topology, batch_key, dispatch_key, log_key


async def _next(
    broker: Broker, queue: str, timeout: float = 10.0
) -> aio_pika.abc.AbstractIncomingMessage:
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        message = await broker.get(queue)
        if message is not None:
            return message
        await asyncio.sleep(0.1)
    raise AssertionError(f"nothing arrived on {queue}")


async def _depths(broker: Broker) -> dict[str, int]:
    return {spec.name: await broker.queue_depth(spec.name) for spec in broker.topology.queues()}


async def test_declare_is_idempotent(broker: Broker) -> None:
    """Declaring the same topology again succeeds and changes nothing: a queued message stays
    queued, and every key still reaches exactly its own queue, once."""
    t = broker.topology
    await broker.publish(dispatch_key("sg", uuid.uuid4()), b"queued before")
    await _next_depth(broker, t.provider_queue("sg"), 1)

    await broker.declare()

    routed = {
        t.batches_queue: batch_key(uuid.uuid4()),
        t.webhooks_queue: "hook.mg",
        t.provider_queue("mg"): dispatch_key("mg", uuid.uuid4(), 2),
        t.log_queue("sg"): log_key("sg", uuid.uuid4()),
        t.log_queue("mg"): log_key("mg", uuid.uuid4(), 1),
    }
    for key in routed.values():
        await broker.publish(key, b"{}")
    expected = dict.fromkeys((spec.name for spec in t.queues()), 0)
    expected |= dict.fromkeys([*routed, t.provider_queue("sg")], 1)
    for _ in range(50):
        if await _depths(broker) == expected:
            break
        await asyncio.sleep(0.1)
    assert await _depths(broker) == expected


async def test_unroutable_publish_raises(broker: Broker) -> None:
    """A key no queue is bound to is an error, never a silent drop (mandatory + returns)."""
    with pytest.raises(PublishError, match="unroutable"):
        await broker.publish("nothing.bound.here", b"{}")


async def test_published_messages_are_persistent_and_routed(broker: Broker) -> None:
    """A dispatch key lands in its provider queue as a persistent message."""
    key = dispatch_key("mg", uuid.uuid4(), 1)
    await broker.publish(key, b'{"x":1}')

    message = await _next(broker, broker.topology.provider_queue("mg"))
    assert message.routing_key == key
    assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    await message.ack()


async def test_log_keys_are_routable(broker: Broker) -> None:
    """log.<ns>.<uuid>.retry.<n> reaches that provider's log-retry queue."""
    key = f"log.sg.{uuid.uuid4()}.retry.2"
    await broker.publish(key, b"{}")

    message = await _next(broker, broker.topology.log_queue("sg"))
    assert message.routing_key == key
    await message.ack()


async def test_delayed_message_returns_with_its_key_after_the_tier(broker: Broker) -> None:
    """A delayed publish waits in its tier queue, then reaches the work queue under its key."""
    key = dispatch_key("sg", uuid.uuid4(), 2)
    started = asyncio.get_running_loop().time()
    await broker.publish(key, b"{}", delay=1)

    assert await broker.get(broker.topology.provider_queue("sg")) is None
    message = await _next(broker, broker.topology.provider_queue("sg"))
    assert asyncio.get_running_loop().time() - started >= 0.9
    assert message.routing_key == key
    assert message.headers.get("x-death")
    await message.ack()


async def test_a_delayed_message_waits_in_its_own_tier_only(broker: Broker) -> None:
    """A message delayed by the longer tier waits that long and comes back once, not also
    through every shorter tier (a headers exchange ignores ``x-`` headers when matching)."""
    key = dispatch_key("sg", uuid.uuid4(), 1)
    started = asyncio.get_running_loop().time()
    await broker.publish(key, b"{}", delay=2)

    message = await _next(broker, broker.topology.provider_queue("sg"))
    assert asyncio.get_running_loop().time() - started >= 1.9
    await message.ack()
    assert await broker.queue_depth(broker.topology.delay_queue(1)) == 0
    await asyncio.sleep(1.5)
    assert await broker.get(broker.topology.provider_queue("sg")) is None


async def test_poison_message_is_dead_lettered_after_the_delivery_limit(broker: Broker) -> None:
    """A message requeued past the delivery limit ends in the dead-letter queue, not a loop."""
    key = dispatch_key("sg", uuid.uuid4())
    await broker.publish(key, b"poison")
    queue = broker.topology.provider_queue("sg")
    for _ in range(broker.topology.delivery_limit + 1):
        message = await broker.get(queue)
        if message is None:
            break
        await message.nack(requeue=True)

    dead = await _next(broker, broker.topology.dead_letter_queue)
    assert dead.routing_key == key
    assert dead.body == b"poison"
    await dead.ack()


async def test_the_depth_of_a_missing_queue_leaves_publishing_untouched(broker: Broker) -> None:
    """The broker closes the channel of a passive declare that finds nothing: the probe's,
    never the one publishes go through (a publish right after it is confirmed)."""
    with pytest.raises(DependencyUnavailable, match="NOT_FOUND"):
        await broker.queue_depth(f"missing-{uuid.uuid4().hex}")

    await broker.publish(batch_key(uuid.uuid4()), b"{}")
    assert await broker.queue_depth(broker.topology.batches_queue) == 1


async def _next_depth(b: Broker, queue: str, depth: int) -> None:
    for _ in range(50):
        if await b.queue_depth(queue) == depth:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{queue} never reached depth {depth}")


#: A port nothing listens on: the "node" that is down.
_DEAD_NODE = "amqp://guest:guest@127.0.0.1:1/"


def _management_url() -> str:
    return f"http://127.0.0.1:{os.environ.get('SAFEDELIVR_RABBITMQ_MANAGEMENT_PORT', '15672')}"


async def _close_from_server(connection_name: str) -> None:
    """Have RabbitMQ close our connection, as a node going away does."""
    async with httpx.AsyncClient(base_url=_management_url(), auth=("guest", "guest")) as http:
        for _ in range(50):
            found = [
                c["name"]
                for c in (await http.get("/api/connections")).json()
                if c.get("client_properties", {}).get("connection_name") == connection_name
            ]
            if found:
                for name in found:
                    resp = await http.delete(f"/api/connections/{quote(name, safe='')}")
                    assert resp.status_code == 204
                return
            await asyncio.sleep(0.2)  # the management stats lag a little behind the broker
    raise AssertionError(f"no connection named {connection_name}")


async def _publish_eventually(broker: Broker, key: str, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            await broker.publish(key, b"{}")
            return
        except PublishError:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.2)


async def test_connect_skips_a_node_that_is_down(exchange_name: str) -> None:
    """With several nodes in the URL, the first that answers is used."""
    url = f"{_DEAD_NODE},{AmqpSettings().url.get_secret_value()}"
    b = Broker(url, Topology(exchange=exchange_name, delay_tiers=(1,)), name=exchange_name)
    await b.connect()
    try:
        await b.declare()
        await b.publish(batch_key(uuid.uuid4()), b"{}")
        assert await b.queue_depth(b.topology.batches_queue) == 1
    finally:
        await b.delete()
        await b.close()


async def test_connect_fails_when_every_node_is_down(exchange_name: str) -> None:
    b = Broker(f"{_DEAD_NODE},{_DEAD_NODE}", Topology(exchange=exchange_name), name="nowhere")
    with pytest.raises(DependencyUnavailable):
        await b.connect(timeout=2)


async def test_a_lost_connection_moves_on_past_a_dead_node(exchange_name: str) -> None:
    """After a loss the next attempt goes to the next node; when that one is down too, the
    attempt after it goes round to the live one, and publishing and consuming resume."""
    live = AmqpSettings().url.get_secret_value()
    name = f"failover-{exchange_name}"
    b = Broker(
        f"{live},{_DEAD_NODE}", Topology(exchange=exchange_name, delay_tiers=(1,)), name=name
    )
    await b.connect()
    try:
        await b.declare()
        got: asyncio.Queue[bytes] = asyncio.Queue()

        async def handler(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            await message.ack()
            await got.put(message.body)

        await b.consume(b.topology.batches_queue, handler, prefetch=1)
        await _close_from_server(name)

        key = batch_key(uuid.uuid4())
        await _publish_eventually(b, key)
        assert await asyncio.wait_for(got.get(), 30) == b"{}"
        # The first connect, the dead node, then the live one again: were aio-pika to stop
        # calling the hook that moves on, it would reconnect to the live node directly.
        assert b._connection._attempts >= 3  # type: ignore[union-attr]
    finally:
        await b.delete()
        await b.close()
