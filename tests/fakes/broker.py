"""An in-memory twin of :class:`shared.infra.broker.Broker` (dramatiq's stub broker, for our
topology): publishes are routed by the same topology data the real broker declares, a
message published with a delay waits in its tier's queue until :meth:`FakeBroker.expire`,
and an unroutable key raises ``PublishError`` as a mandatory publish does. ``fail`` makes the
next publish raise (the broker is down, or the confirm never came).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from shared.core.errors import PublishError
from shared.infra.topology import DELAY_HEADER, Topology


def topic_matches(pattern: str, key: str) -> bool:
    """AMQP topic matching: ``*`` is exactly one word, ``#`` zero or more."""

    def match(p: list[str], k: list[str]) -> bool:
        if not p:
            return not k
        if p[0] == "#":
            return any(match(p[1:], k[i:]) for i in range(len(k) + 1))
        return bool(k) and p[0] in ("*", k[0]) and match(p[1:], k[1:])

    return match(pattern.split("."), key.split("."))


@dataclass
class FakeMessage:
    """A published message, and how its delivery was settled (``ack``, ``nack``, ``reject``)."""

    routing_key: str
    body: bytes
    headers: dict[str, Any] = field(default_factory=dict)
    message_id: str | None = None
    delay: int | None = None
    settled: str | None = None
    due: datetime | None = None
    """When a delayed message's time is up (by the broker's clock)."""
    deliveries: int = 0
    """How many times it was delivered before (RabbitMQ's x-delivery-count)."""

    async def ack(self) -> None:
        self.settled = "ack"

    async def nack(self, requeue: bool = True) -> None:
        self.settled = "nack"

    async def reject(self, requeue: bool = False) -> None:
        self.settled = "reject"


class FakeBroker:
    def __init__(
        self,
        topology: Topology | None = None,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.topology = topology or Topology(exchange="fake", delay_tiers=(1, 5, 30))
        self.now = now
        self.queues: dict[str, deque[FakeMessage]] = defaultdict(deque)
        self.published: list[FakeMessage] = []
        self._failures: list[tuple[Exception, bool]] = []
        self.declared = False
        self.consumers: dict[str, tuple[Any, int]] = {}
        self.listeners: list[Callable[[bytes], None]] = []
        self._routes = [
            (key, spec.name) for spec in self.topology.work_queues() for _, key in spec.bindings
        ]

    async def declare(self) -> None:
        """The topology is data here: nothing to declare."""
        self.declared = True

    async def consume(self, queue_name: str, handler: Any, *, prefetch: int) -> None:
        """Remember who consumes what (tests deliver with ``World.deliver``)."""
        self.consumers[queue_name] = (handler, prefetch)

    async def cancel(self, queue_name: str) -> None:
        """Stop consuming ``queue_name``."""
        self.consumers.pop(queue_name, None)

    async def announce(self, body: bytes) -> None:
        """Every listener hears it at once, as over the fanout exchange."""
        for listener in list(self.listeners):
            listener(body)

    async def listen(self, on_message: Callable[[bytes], None]) -> None:
        self.listeners.append(on_message)

    def fail(self, error: Exception | None = None, *, delivered: bool = False) -> None:
        """Make the next publish raise (default: not confirmed); with ``delivered`` the message
        is routed all the same (the broker took it, the confirm was lost)."""
        self._failures.append((error or PublishError("not confirmed"), delivered))

    async def publish(
        self,
        routing_key: str,
        body: bytes,
        *,
        delay: int | None = None,
        headers: Mapping[str, Any] | None = None,
        message_id: str | None = None,
    ) -> None:
        failure = self._failures.pop(0) if self._failures else None
        if failure is not None and not failure[1]:
            raise failure[0]
        message = FakeMessage(routing_key, body, dict(headers or {}), message_id, delay)
        self._take(message)
        if failure is not None:
            raise failure[0]

    def _take(self, message: FakeMessage) -> None:
        delay = message.delay
        if delay is not None:
            if delay not in self.topology.all_delay_tiers:
                raise PublishError(f"unroutable: {message.routing_key} (no delay tier {delay})")
            message.headers[DELAY_HEADER] = str(delay)
            message.due = self.now() + timedelta(seconds=delay)
            self.published.append(message)
            self.queues[self.topology.delay_queue(delay)].append(message)
            return
        self._route(message)
        self.published.append(message)

    def _route(self, message: FakeMessage) -> None:
        key = message.routing_key
        targets = [name for pattern, name in self._routes if topic_matches(pattern, key)]
        if not targets:
            raise PublishError(f"unroutable: {message.routing_key}")
        for name in targets:
            self.queues[name].append(message)

    async def get(self, queue_name: str) -> FakeMessage | None:
        """Take the oldest message of a queue (None when it is empty)."""
        queue = self.queues.get(queue_name)
        return queue.popleft() if queue else None

    async def queue_depth(self, queue_name: str) -> int:
        return len(self.queues.get(queue_name, ()))

    def _delayed(self) -> list[FakeMessage]:
        return [
            m
            for tier in self.topology.all_delay_tiers
            for m in self.queues.get(self.topology.delay_queue(tier), ())
        ]

    def next_due(self) -> datetime | None:
        """When the next delayed message's time is up (None: nothing is delayed)."""
        return min((m.due for m in self._delayed() if m.due is not None), default=None)

    def expire(self, until: datetime | None = None) -> None:
        """Delayed messages whose time is up by ``until`` (default: all) go back to the main
        exchange under their own key; one nobody is bound to is dropped, as RabbitMQ drops
        an unroutable dead-lettered message."""
        for tier in self.topology.all_delay_tiers:
            name = self.topology.delay_queue(tier)
            waiting = self.queues.get(name, deque())
            due = [m for m in waiting if until is None or (m.due is not None and m.due <= until)]
            self.queues[name] = deque(m for m in waiting if m not in due)
            for message in due:
                with contextlib.suppress(PublishError):
                    self._route(message)

    def take(self) -> list[FakeMessage]:
        """Everything published so far (and forget it)."""
        out, self.published = self.published, []
        return out
