"""The simulated RabbitMQ: our topology's routing, delay tiers, consumers with manual acks,
and redelivery when a consumer's process dies, with every publish and ack a step.

What it keeps of RabbitMQ (``reliability-and-providers.md`` A1): a publish is routed by the
topic bindings of ``shared.infra.topology`` (an unroutable key raises, as a mandatory publish with
``on_return_raises`` does) and confirmed or not (a lost confirm may hide a message the broker
did route); a delayed message waits in its tier's queue for the tier's TTL, then goes back
to the exchange under its own key; a delivery stays unacked until acked, and when its
consumer's process dies (or an ack is lost) it is delivered again, marked redelivered, at
the head of its queue, and dead-lettered once it reaches the queue's delivery limit; a
rejected message is dead-lettered. Consumers take one message at a time (prefetch 1 per
queue per process), and a message goes to the consumer that has waited longest.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.core.errors import PublishError
from shared.infra.topology import DELAY_HEADER, Topology
from simulation.processes import Gate, Incarnation, current
from tests.fakes.broker import topic_matches


@dataclass(eq=False)
class Envelope:
    """A message as the broker holds it, across its deliveries."""

    routing_key: str
    body: bytes
    headers: dict[str, Any]
    message_id: str | None
    deliveries: int = 0


@dataclass(eq=False)
class SimMessage:
    """One delivery of an envelope, with the settlement API the consumers use."""

    broker: SimBroker
    envelope: Envelope
    queue: str
    holder: Incarnation
    settled: str | None = None

    @property
    def routing_key(self) -> str:
        return self.envelope.routing_key

    @property
    def body(self) -> bytes:
        return self.envelope.body

    @property
    def headers(self) -> dict[str, Any]:
        return self.envelope.headers

    @property
    def message_id(self) -> str | None:
        return self.envelope.message_id

    @property
    def redelivered(self) -> bool:
        return self.envelope.deliveries > 1

    async def ack(self) -> None:
        await self.broker.settle(self, "ack")

    async def nack(self, requeue: bool = True) -> None:
        await self.broker.settle(self, "nack" if requeue else "reject")

    async def reject(self, requeue: bool = False) -> None:
        await self.broker.settle(self, "nack" if requeue else "reject")


class _Queue:
    def __init__(self, name: str) -> None:
        self.name = name
        self.ready: deque[Envelope] = deque()
        self.waiters: deque[tuple[asyncio.Future[SimMessage], Incarnation]] = deque()


@dataclass
class DeadLetter:
    envelope: Envelope
    queue: str
    reason: str


Handler = Callable[[SimMessage], Awaitable[None]]


@dataclass
class SimBroker:
    topology: Topology
    gate: Gate
    dead: list[DeadLetter] = field(default_factory=list)
    published: int = 0

    def __post_init__(self) -> None:
        self._queues: dict[str, _Queue] = {}
        self._routes = [
            (key, spec.name) for spec in self.topology.work_queues() for _, key in spec.bindings
        ]
        self.unacked: dict[SimMessage, None] = {}
        self.delayed: dict[Envelope, float] = {}
        """Messages waiting in a delay tier, and when (loop time) they go back."""

    # -- the publisher's side ---------------------------------------------------------------

    async def declare(self) -> None:
        return None

    async def publish(
        self,
        routing_key: str,
        body: bytes,
        *,
        delay: int | None = None,
        headers: Mapping[str, Any] | None = None,
        message_id: str | None = None,
    ) -> None:
        fault = self.gate.enter(f"publish:{_shape(routing_key)}", "publish")
        await self.gate.pause()
        if fault == "lost":
            raise PublishError(f"(simulated) {routing_key}: not confirmed")
        envelope = Envelope(routing_key, body, dict(headers or {}), message_id)
        if delay is not None:
            if delay not in self.topology.all_delay_tiers:
                raise PublishError(f"unroutable: {routing_key} (no delay tier {delay})")
            envelope.headers[DELAY_HEADER] = str(delay)
            self._delay(envelope, delay)
        else:
            self._route(envelope)
        self.published += 1
        if fault == "unconfirmed":
            raise PublishError(f"(simulated) {routing_key}: the confirm was lost")
        self.gate.die_if(fault)

    def _delay(self, envelope: Envelope, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        self.delayed[envelope] = loop.time() + seconds
        loop.call_later(seconds, self._expire, envelope)

    def _expire(self, envelope: Envelope) -> None:
        # Back to the exchange under its own key; nobody bound to it: dropped, as RabbitMQ
        # drops an unroutable dead-lettered message.
        self.delayed.pop(envelope, None)
        envelope.headers.pop(DELAY_HEADER, None)
        try:
            self._route(envelope)
        except PublishError:
            self.dead.append(DeadLetter(envelope, "delay", "unroutable after its delay"))

    def _route(self, envelope: Envelope) -> None:
        key = envelope.routing_key
        targets = [name for pattern, name in self._routes if topic_matches(pattern, key)]
        if not targets:
            raise PublishError(f"unroutable: {key}")
        for i, name in enumerate(targets):
            copy = (
                envelope
                if i == 0
                else Envelope(key, envelope.body, dict(envelope.headers), envelope.message_id)
            )
            self._put(name, copy)

    def _queue(self, name: str) -> _Queue:
        q = self._queues.get(name)
        if q is None:
            q = self._queues[name] = _Queue(name)
        return q

    def _put(self, name: str, envelope: Envelope, *, head: bool = False) -> None:
        q = self._queue(name)
        while q.waiters:
            future, inc = q.waiters.popleft()
            if future.done() or not inc.alive:
                continue
            future.set_result(self._deliver(q, envelope, inc))
            return
        if head:
            q.ready.appendleft(envelope)
        else:
            q.ready.append(envelope)

    def _deliver(self, q: _Queue, envelope: Envelope, inc: Incarnation) -> SimMessage:
        envelope.deliveries += 1
        message = SimMessage(self, envelope, q.name, inc)
        self.unacked[message] = None
        return message

    # -- the consumer's side ----------------------------------------------------------------

    async def take(self, queue: str) -> SimMessage:
        """The next message of ``queue`` for the running process (waits for one)."""
        inc = current()
        assert inc is not None, "only a simulated process consumes"  # noqa: S101
        inc.check()
        q = self._queue(queue)
        if q.ready:
            return self._deliver(q, q.ready.popleft(), inc)
        future: asyncio.Future[SimMessage] = asyncio.get_running_loop().create_future()
        q.waiters.append((future, inc))
        return await future

    async def consume(self, queue: str, handler: Handler) -> None:
        """Deliver ``queue``'s messages to ``handler`` one at a time, for ever."""
        while True:
            message = await self.take(queue)
            await handler(message)

    async def settle(self, message: SimMessage, how: str) -> None:
        if message.settled is not None:
            return
        fault = self.gate.enter(f"{how}:{_shape(message.routing_key)}", "ack")
        await self.gate.pause()
        message.settled = how
        self.unacked.pop(message, None)
        if fault == "lost":
            self._again(message, "ack lost")
            return
        if how == "reject":
            self.dead.append(DeadLetter(message.envelope, message.queue, "rejected"))
        elif how == "nack":
            self._again(message, "nacked")
        self.gate.die_if(fault)

    def _again(self, message: SimMessage, why: str) -> None:
        envelope = message.envelope
        if envelope.deliveries >= self.topology.delivery_limit:
            self.dead.append(DeadLetter(envelope, message.queue, f"delivery limit ({why})"))
            return
        self._put(message.queue, envelope, head=True)

    def died(self, inc: Incarnation) -> None:
        """A process died: what it had not settled is delivered again (its own waiting
        consumers are gone with it)."""
        for message in [m for m in self.unacked if m.holder is inc]:
            self.unacked.pop(message, None)
            message.settled = "lost with its process"
            self._again(message, "process died")

    def disconnected(self, inc: Incarnation) -> None:
        """A process's connection dropped: what it had not settled is delivered again, to
        whoever consumes next, while it carries on (its later acks go nowhere)."""
        for message in [m for m in self.unacked if m.holder is inc]:
            self.unacked.pop(message, None)
            message.settled = "connection lost"
            self._again(message, "connection lost")

    # -- what the world asks ----------------------------------------------------------------

    def depth(self, queue: str) -> int:
        q = self._queues.get(queue)
        return len(q.ready) if q else 0

    async def queue_depth(self, queue: str) -> int:
        return self.depth(queue)

    def busy(self) -> bool:
        """Whether any message is ready, unacked or delayed."""
        return bool(self.unacked or self.delayed or any(q.ready for q in self._queues.values()))

    def next_due(self) -> float | None:
        return min(self.delayed.values(), default=None)

    def leftovers(self) -> dict[str, int]:
        """Messages still ready in each queue (at quiescence: messages held for ever)."""
        return {name: len(q.ready) for name, q in self._queues.items() if q.ready}


def _shape(routing_key: str) -> str:
    """A routing key with its ids left out, so step names read alike across runs."""
    parts = routing_key.split(".")
    return ".".join("*" if len(p) > 20 else p for p in parts)
