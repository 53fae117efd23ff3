"""The dead-letter tool (``shared.deadletters.drain_dead_letters``) against the real RabbitMQ:
what a listing shows and leaves in place, what a replay sends back, and what happens to
dead letters that are odd (undecodable, unroutable, carrying a hostile ``x-death``)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import pytest

from shared.broker import Broker
from shared.config import Settings
from shared.deadletters import drain_dead_letters
from shared.errors import PublishError
from shared.resources import topology_for
from shared.topology import Topology, batch_key, dispatch_key


@pytest.fixture
async def dlq(settings: Settings) -> AsyncIterator[Broker]:
    """A connected broker on the test's own topology (``settings`` deletes it afterwards)."""
    broker = Broker(settings.amqp.url.get_secret_value(), topology_for(settings), name="dlq-test")
    await broker.connect()
    await broker.declare()
    try:
        yield broker
    finally:
        await broker.close()


async def _next(broker: Broker, queue: str) -> aio_pika.abc.AbstractIncomingMessage:
    for _ in range(100):
        message = await broker.get(queue)
        if message is not None:
            return message
        await asyncio.sleep(0.05)
    raise AssertionError(f"nothing arrived on {queue}")


async def _depth(broker: Broker, queue: str, expected: int) -> None:
    """Wait until ``queue`` holds ``expected`` messages (settlements land asynchronously)."""
    for _ in range(100):
        if await broker.queue_depth(queue) == expected:
            return
        await asyncio.sleep(0.05)
    actual = await broker.queue_depth(queue)
    raise AssertionError(f"{queue} holds {actual}, not {expected}")


async def _kill(
    broker: Broker,
    key: str,
    body: bytes,
    *,
    headers: dict[str, Any] | None = None,
    message_id: str | None = None,
) -> None:
    """Publish under ``key`` and reject it from its queue as poison, as settle does."""
    await broker.publish(key, body, headers=headers, message_id=message_id)
    queue = _queue_of(broker.topology, key)
    message = await _next(broker, queue)
    await message.reject(requeue=False)


def _queue_of(t: Topology, key: str) -> str:
    head = key.split(".")[0]
    return {"batch": t.batches_queue, "hook": t.webhooks_queue}.get(head) or t.provider_queue(head)


async def _straight_to_dlx(
    settings: Settings, key: str, body: bytes, headers: dict[str, Any]
) -> None:
    """Publish to the dead-letter exchange directly, as any client of the vhost can."""
    t = topology_for(settings)
    raw = Broker(settings.amqp.url.get_secret_value(), Topology(exchange=t.dead_letter_exchange))
    await raw.connect()
    try:
        await raw.publish(key, body, headers=headers)
    finally:
        await raw.close()


async def test_a_listing_describes_every_dead_letter_and_leaves_them_all(
    settings: Settings, dlq: Broker
) -> None:
    """Rejected and delivery-limit deaths alike are listed with their reason and origin;
    listing twice shows the same letters, and none left the queue."""
    t = dlq.topology
    rejected = dispatch_key("sg", uuid.uuid1())
    await _kill(dlq, rejected, b"rejected one")
    looping = batch_key(uuid.uuid1())
    await dlq.publish(looping, b"looping one")
    for _ in range(t.delivery_limit + 1):
        message = await dlq.get(t.batches_queue)
        if message is None:
            break
        await message.nack(requeue=True)
    await _depth(dlq, t.dead_letter_queue, 2)

    first = await drain_dead_letters(settings, replay=False, limit=10)
    await _depth(dlq, t.dead_letter_queue, 2)
    second = await drain_dead_letters(settings, replay=False, limit=10)

    assert sorted(first) == sorted(second)
    by_key = {line.split()[0]: line for line in first}
    assert set(by_key) == {rejected, looping}
    assert f"reason=rejected queue={t.provider_queue('sg')}" in by_key[rejected]
    assert f"reason=delivery_limit queue={t.batches_queue}" in by_key[looping]
    await _depth(dlq, t.dead_letter_queue, 2)


async def test_an_empty_dead_letter_queue_lists_nothing(settings: Settings, dlq: Broker) -> None:
    assert await drain_dead_letters(settings, replay=False, limit=10) == []
    assert await drain_dead_letters(settings, replay=True, limit=10) == []


async def test_the_limit_bounds_both_listing_and_replay(settings: Settings, dlq: Broker) -> None:
    t = dlq.topology
    for n in range(3):
        await _kill(dlq, dispatch_key("mg", uuid.uuid1()), f"letter {n}".encode())
    await _depth(dlq, t.dead_letter_queue, 3)

    assert len(await drain_dead_letters(settings, replay=False, limit=2)) == 2
    assert await drain_dead_letters(settings, replay=False, limit=0) == []
    await _depth(dlq, t.dead_letter_queue, 3)

    assert len(await drain_dead_letters(settings, replay=True, limit=1)) == 1
    await _depth(dlq, t.dead_letter_queue, 2)
    await _depth(dlq, t.provider_queue("mg"), 1)


async def test_an_undecodable_body_is_listed_escaped_and_replayed_byte_for_byte(
    settings: Settings, dlq: Broker
) -> None:
    """Poison is often not JSON at all: the tool never decodes it, and the replay sends the
    very bytes back with their message id."""
    t = dlq.topology
    key = dispatch_key("sg", uuid.uuid1())
    body = b"\xff\xfe\x00\n{not json"
    await _kill(dlq, key, body, message_id="m-1")
    await _depth(dlq, t.dead_letter_queue, 1)

    (line,) = await drain_dead_letters(settings, replay=False, limit=5)
    assert line.endswith("body=b'\\xff\\xfe\\x00\\n{not json'")

    await drain_dead_letters(settings, replay=True, limit=5)
    back = await _next(dlq, t.provider_queue("sg"))
    assert (back.routing_key, back.body, back.message_id) == (key, body, "m-1")
    await back.ack()
    await _depth(dlq, t.dead_letter_queue, 0)


async def test_an_unroutable_dead_letter_stops_the_replay_and_stays_dead(
    settings: Settings, dlq: Broker
) -> None:
    """A letter whose key no queue is bound to any more cannot go back: the replay fails
    there, letters before it are back in their queues and the rest are still dead."""
    t = dlq.topology
    before, after = dispatch_key("sg", uuid.uuid1()), dispatch_key("sg", uuid.uuid1())
    await _kill(dlq, before, b"before")
    await _depth(dlq, t.dead_letter_queue, 1)  # dead-lettering is asynchronous: keep the order
    await _straight_to_dlx(settings, "gone.provider.key", b"orphan", {})
    await _depth(dlq, t.dead_letter_queue, 2)
    await _kill(dlq, after, b"after")
    await _depth(dlq, t.dead_letter_queue, 3)

    with pytest.raises(PublishError, match="unroutable"):
        await drain_dead_letters(settings, replay=True, limit=10)

    back = await _next(dlq, t.provider_queue("sg"))
    assert back.body == b"before"
    await back.ack()
    await _depth(dlq, t.dead_letter_queue, 2)
    listed = await drain_dead_letters(settings, replay=False, limit=10)
    assert sorted(line.split()[0] for line in listed) == sorted(["gone.provider.key", after])


async def test_a_hostile_x_death_header_does_not_hide_the_other_dead_letters(
    settings: Settings, dlq: Broker
) -> None:
    t = dlq.topology
    await _kill(dlq, dispatch_key("sg", uuid.uuid1()), b"ordinary")
    await _straight_to_dlx(settings, "sg.hostile", b"x", {"x-death": {"reason": "forged"}})
    await _depth(dlq, t.dead_letter_queue, 2)

    listed = await drain_dead_letters(settings, replay=False, limit=10)

    assert len(listed) == 2


async def test_a_replayed_webhook_delivery_keeps_the_time_it_was_received(
    settings: Settings, dlq: Broker
) -> None:
    """Webhook deliveries queued while Cassandra was down carry their receive time in a
    header; events without a timestamp of their own are dated by it."""
    t = dlq.topology
    received = {"x-safedelivr-received-at": "1767225600.5"}
    await _kill(dlq, "hook.sg", b'[{"event": "processed"}]', headers=received)
    await _depth(dlq, t.dead_letter_queue, 1)

    await drain_dead_letters(settings, replay=True, limit=5)

    back = await _next(dlq, t.webhooks_queue)
    await back.ack()
    assert (back.headers or {}).get("x-safedelivr-received-at") == "1767225600.5"
