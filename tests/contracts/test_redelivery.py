"""The redelivery contract the simulator's broker (``simulation.broker``) keeps with RabbitMQ:
what happens to a message whose consumer loses its connection while it is still working on
it, asserted identically of the simulated broker and of a real quorum queue.

* the message goes to another consumer, marked redelivered, while the first consumer is
  still running (two deliveries of one message at once);
* it comes back ahead of messages published after it;
* the first consumer's ack of it goes nowhere: the second delivery stays unacked until its
  own consumer settles it.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any, Protocol

import aio_pika
import pytest

from shared.infra.config import AmqpSettings
from shared.infra.topology import Topology, dispatch_key
from simulation.broker import SimBroker
from simulation.faults import Schedule
from simulation.processes import Gate, Process

IMPLEMENTATIONS = ["sim", pytest.param("real", marks=pytest.mark.integration)]


class Consumers(Protocol):
    """Two consumers of one queue, and a publisher."""

    async def publish(self, body: bytes) -> None: ...
    async def take(self, consumer: str) -> Any:
        """The next message for ``consumer`` (``a`` or ``b``), or None within ten seconds."""

    async def drop(self, consumer: str) -> None:
        """``consumer``'s broker connection is lost (its process goes on)."""

    async def ack(self, message: Any) -> None: ...
    async def unacked(self) -> int:
        """Messages delivered and not yet settled (the queue's view)."""


class SimConsumers:
    def __init__(self) -> None:
        self.gate = Gate(Schedule("contract"))
        self.broker = SimBroker(Topology(exchange="contract"), self.gate)
        self.queue = self.broker.topology.provider_queue("sg")
        self.process = {name: Process(f"consumer-{name}") for name in ("a", "b")}

    async def publish(self, body: bytes) -> None:
        await self.broker.publish(dispatch_key("sg", uuid.uuid1()), body)

    async def take(self, consumer: str) -> Any:
        task = self.process[consumer].spawn(self.broker.take(self.queue))
        done, _ = await asyncio.wait({task}, timeout=10.0)
        if not done:
            task.cancel()
            return None
        return task.result()

    async def drop(self, consumer: str) -> None:
        self.broker.disconnected(self.process[consumer].current)

    async def ack(self, message: Any) -> None:
        await message.ack()

    async def unacked(self) -> int:
        return len(self.broker.unacked)


class RealConsumers:
    def __init__(self, url: str, queue: str) -> None:
        self.url, self.queue = url, queue
        self.connections: dict[str, aio_pika.abc.AbstractConnection] = {}
        self.queues: dict[str, aio_pika.abc.AbstractQueue] = {}

    async def open(self) -> None:
        for name in ("a", "b", "publisher"):
            connection = await aio_pika.connect(self.url)
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=1)
            self.connections[name] = connection
            self.queues[name] = await channel.declare_queue(
                self.queue, durable=True, arguments={"x-queue-type": "quorum"}
            )

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.queues["publisher"].delete(if_unused=False, if_empty=False)
        for connection in self.connections.values():
            with contextlib.suppress(Exception):
                await connection.close()

    async def publish(self, body: bytes) -> None:
        channel = await self.connections["publisher"].channel()
        await channel.default_exchange.publish(
            aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
            routing_key=self.queue,
        )

    async def take(self, consumer: str) -> Any:
        # A loaded broker may take a while to requeue what a closed channel held.
        for _ in range(100):
            message = await self.queues[consumer].get(no_ack=False, fail=False)
            if message is not None:
                return message
            await asyncio.sleep(0.1)
        return None

    async def drop(self, consumer: str) -> None:
        await self.connections[consumer].close()

    async def ack(self, message: Any) -> None:
        with contextlib.suppress(Exception):  # its channel is closed: the ack goes nowhere
            await message.ack()

    async def unacked(self) -> int:
        channel = await self.connections["publisher"].channel()
        declared = await channel.declare_queue(
            self.queue, durable=True, passive=True, arguments={"x-queue-type": "quorum"}
        )
        ready = declared.declaration_result.message_count or 0
        return 3 - ready  # every test here publishes three messages


@pytest.fixture(params=IMPLEMENTATIONS)
async def consumers(request: pytest.FixtureRequest) -> AsyncIterator[Consumers]:
    if request.param == "sim":
        yield SimConsumers()
        return
    request.getfixturevalue("services_up")
    real = RealConsumers(
        AmqpSettings().url.get_secret_value(), f"redelivery-{uuid.uuid4().hex[:8]}"
    )
    await real.open()
    yield real
    await real.close()


async def test_a_message_whose_consumer_lost_its_connection_goes_to_another_while_the_first_works(
    consumers: Consumers,
) -> None:
    """A takes m0 and loses its connection (it is still working on m0): B gets m0 again,
    marked redelivered, before m1 published after it; A's late ack changes nothing."""
    for n in range(3):
        await consumers.publish(f"m{n}".encode())
    first = await consumers.take("a")
    assert (first.body, first.redelivered) == (b"m0", False)

    await consumers.drop("a")
    again = await consumers.take("b")
    await consumers.ack(first)  # A finishes its work, unaware

    assert (again.body, again.redelivered) == (b"m0", True)
    assert await consumers.unacked() == 1  # B's delivery of m0 is still its to settle
    await consumers.ack(again)
    after = await consumers.take("b")
    assert (after.body, after.redelivered) == (b"m1", False)
