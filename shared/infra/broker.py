"""RabbitMQ adapter: connect, declare the topology, publish with confirms, consume with manual acks.

Every publish is persistent, ``mandatory`` and confirmed; an unroutable message raises instead
of vanishing (``on_return_raises=True``), and every aio-pika/aiormq failure is translated to
:class:`~shared.core.errors.PublishError` or :class:`~shared.core.errors.DependencyUnavailable`
here, so services never see a library exception.

The URL may name several nodes of one cluster, separated by commas: the connection goes to
the first that answers, and when it is lost (or a reconnect attempt fails) the next attempt
goes to the next node, round the list. Quorum queues are reachable from any node, so a
consumer whose node died resumes on another one and its unacknowledged deliveries are
redelivered (our handlers are idempotent for exactly that reason).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aio_pika
import aio_pika.abc
import aio_pika.exceptions
import aiormq.exceptions
from yarl import URL

from shared.core.errors import DependencyUnavailable, PublishError
from shared.infra.topology import DELAY_HEADER, LEGACY_DELAY_HEADER, Topology

log = logging.getLogger(__name__)

Handler = Callable[[aio_pika.abc.AbstractIncomingMessage], Awaitable[None]]

#: Exceptions that mean "the broker or the connection failed", as opposed to our own bugs.
_AMQP_ERRORS: tuple[type[BaseException], ...] = (
    aio_pika.exceptions.AMQPError,
    aiormq.exceptions.AMQPError,
    # Raised (as a RuntimeError) when a channel is used while its connection is down.
    aiormq.exceptions.ChannelInvalidStateError,
    ConnectionError,
    OSError,
    asyncio.TimeoutError,
)


def node_urls(url: str) -> list[str]:
    """The node URLs of ``url``: one URL, or several separated by commas."""
    nodes = [part.strip() for part in url.split(",") if part.strip()]
    if not nodes:
        raise ValueError("no AMQP URL given")
    return nodes


class _Failover(aio_pika.RobustConnection):
    """A robust connection over the nodes of a cluster, that closes itself when its first
    connect fails.

    Every connect attempt after the first (after a loss, or after a failed attempt) goes to
    the next node. aio-pika's reconnect loop connects to ``self.url`` through its private
    ``__connect_transport``, the one place that sees every attempt, so that method is wrapped
    here (aio-pika is pinned by the lock file; ``test_broker`` fails if the hook stops being
    called). A failed first connect closes the connection: aio-pika leaves it to
    ``__del__``, which schedules ``close()`` on whatever loop is current when the object is
    collected, and with no loop running then the coroutine is never awaited.
    """

    def __init__(self, nodes: list[str], **kwargs: Any) -> None:
        self._nodes = [URL(node) for node in nodes]
        self._current = 0
        self._attempts = 0
        super().__init__(self._nodes[0], **kwargs)

    def _move_on(self) -> None:
        self._current = (self._current + 1) % len(self._nodes)
        self.url = self._nodes[self._current]

    async def connect(self, timeout: aio_pika.abc.TimeoutType = None) -> None:
        try:
            await super().connect(timeout)
        except BaseException:
            await self.close()
            raise

    async def _RobustConnection__connect_transport(self) -> None:
        if self._attempts:
            self._move_on()
        self._attempts += 1
        await super()._RobustConnection__connect_transport()  # type: ignore[misc]


async def connect_nodes(
    url: str, *, name: str = "", timeout: float = 10.0
) -> aio_pika.abc.AbstractRobustConnection:
    """A robust connection to the first node of ``url`` that answers (see the module doc)."""
    nodes = node_urls(url)
    failure: BaseException | None = None
    for first in range(len(nodes)):
        order = nodes[first:] + nodes[:first]
        connection = _Failover(order, client_properties={"connection_name": name})
        try:
            await connection.connect(timeout=timeout)
        except _AMQP_ERRORS as exc:
            failure = exc
            continue
        return connection
    assert failure is not None  # noqa: S101 - the loop ran at least once
    raise failure


class Broker:
    """One robust connection with a confirming publish channel and per-consumer channels."""

    def __init__(
        self, url: str, topology: Topology, *, publish_timeout: float = 10.0, name: str = ""
    ) -> None:
        self.url = url
        self.topology = topology
        self.publish_timeout = publish_timeout
        self.name = name
        self._connection: aio_pika.abc.AbstractRobustConnection | None = None
        self._channel: aio_pika.abc.AbstractChannel | None = None
        self._exchanges: dict[str, aio_pika.abc.AbstractExchange] = {}
        self._consumer_channels: list[aio_pika.abc.AbstractChannel] = []
        self._consumers: list[tuple[aio_pika.abc.AbstractQueue, str]] = []

    async def connect(self, *, timeout: float = 10.0) -> None:
        try:
            self._connection = await connect_nodes(self.url, name=self.name, timeout=timeout)
            self._channel = await self._connection.channel(
                publisher_confirms=True, on_return_raises=True
            )
        except _AMQP_ERRORS as exc:
            raise DependencyUnavailable("rabbitmq", _describe(exc)) from exc

    @property
    def connected(self) -> bool:
        return self._connection is not None and not self._connection.is_closed

    async def close(self) -> None:
        for channel in self._consumer_channels:
            with contextlib.suppress(*_AMQP_ERRORS):
                await channel.close()
        if self._connection is not None:
            with contextlib.suppress(*_AMQP_ERRORS):
                await self._connection.close()
        self._connection = self._channel = None
        self._exchanges.clear()

    async def declare(self) -> None:
        """Declare every exchange, queue and binding; harmless to repeat."""
        t = self.topology
        channel = self._require_channel()
        try:
            main = await channel.declare_exchange(
                t.exchange, aio_pika.ExchangeType.TOPIC, durable=True
            )
            dlx = await channel.declare_exchange(
                t.dead_letter_exchange, aio_pika.ExchangeType.FANOUT, durable=True
            )
            delay = await channel.declare_exchange(
                t.delay_exchange, aio_pika.ExchangeType.HEADERS, durable=True
            )
            await channel.declare_exchange(
                t.settings_exchange, aio_pika.ExchangeType.FANOUT, durable=True
            )
            by_name = {t.exchange: main, t.dead_letter_exchange: dlx, t.delay_exchange: delay}
            for spec in t.queues():
                queue = await channel.declare_queue(
                    spec.name, durable=True, arguments=spec.arguments
                )
                for exchange, key in spec.bindings:
                    await queue.bind(by_name[exchange], routing_key=key)
                if spec.header_binding is not None:
                    exchange, headers = spec.header_binding
                    await queue.bind(by_name[exchange], arguments=headers)
                    # Bindings of earlier releases matched every delayed message.
                    legacy = {"x-match": "all", LEGACY_DELAY_HEADER: headers[DELAY_HEADER]}
                    await queue.unbind(by_name[exchange], arguments=legacy)
        except _AMQP_ERRORS as exc:
            raise DependencyUnavailable("rabbitmq", _describe(exc)) from exc

    async def delete(self) -> None:
        """Delete every queue and exchange of this topology (tests and teardown)."""
        channel = self._require_channel()
        t = self.topology
        for spec in t.queues():
            with contextlib.suppress(*_AMQP_ERRORS):
                await channel.queue_delete(spec.name)
        for name in (t.exchange, t.dead_letter_exchange, t.delay_exchange, t.settings_exchange):
            with contextlib.suppress(*_AMQP_ERRORS):
                await channel.exchange_delete(name)

    async def publish(
        self,
        routing_key: str,
        body: bytes,
        *,
        delay: int | None = None,
        headers: Mapping[str, Any] | None = None,
        message_id: str | None = None,
    ) -> None:
        """Publish persistently and wait for the broker's confirm.

        With ``delay`` the message first sits in the delay queue of that tier (seconds, must
        be a declared tier) and then dead-letters back to the main exchange under
        ``routing_key``. Raises PublishError when the message is not confirmed or not routable.
        """
        all_headers: dict[str, Any] = dict(headers or {})
        exchange_name = self.topology.exchange
        if delay is not None:
            all_headers[DELAY_HEADER] = str(delay)
            exchange_name = self.topology.delay_exchange
        message = aio_pika.Message(
            body,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            content_type="application/json",
            headers=all_headers,
            message_id=message_id,
        )
        try:
            exchange = await self._exchange(exchange_name)
            await exchange.publish(
                message, routing_key, mandatory=True, timeout=self.publish_timeout
            )
        except aio_pika.exceptions.PublishError as exc:
            raise PublishError(f"unroutable: {routing_key}") from exc
        except aio_pika.exceptions.DeliveryError as exc:
            raise PublishError(f"not confirmed: {routing_key}") from exc
        except _AMQP_ERRORS as exc:
            raise PublishError(_describe(exc)) from exc

    async def consume(self, queue_name: str, handler: Handler, *, prefetch: int) -> None:
        """Start consuming ``queue_name`` on its own channel; the handler settles each message."""
        connection = self._require_connection()
        try:
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=prefetch)
            queue = await channel.get_queue(queue_name, ensure=True)
            tag = await queue.consume(handler)
        except _AMQP_ERRORS as exc:
            raise DependencyUnavailable("rabbitmq", _describe(exc)) from exc
        self._consumer_channels.append(channel)
        self._consumers.append((queue, tag))

    async def cancel(self, queue_name: str) -> None:
        """Stop consuming ``queue_name`` (deliveries in flight still settle)."""
        keep = []
        for queue, tag in self._consumers:
            if queue.name == queue_name:
                with contextlib.suppress(*_AMQP_ERRORS):
                    await queue.cancel(tag)
            else:
                keep.append((queue, tag))
        self._consumers = keep

    async def announce(self, body: bytes) -> None:
        """Publish ``body`` to the settings fanout exchange, confirmed (no queue is needed:
        a process that is not running reads the settings when it starts)."""
        message = aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.NOT_PERSISTENT)
        try:
            # Declared here too: publishing to a missing exchange would close the channel.
            exchange = await self._require_channel().declare_exchange(
                self.topology.settings_exchange, aio_pika.ExchangeType.FANOUT, durable=True
            )
            # Not mandatory: no process listening (none is running) is not a failure.
            await exchange.publish(message, "", mandatory=False, timeout=self.publish_timeout)
        except _AMQP_ERRORS as exc:
            raise DependencyUnavailable("rabbitmq", _describe(exc)) from exc

    async def listen(self, on_message: Callable[[bytes], None]) -> None:
        """Call ``on_message`` for every announcement from now on, through a server-named,
        exclusive queue of this connection (gone with it; re-made on reconnection)."""
        connection = self._require_connection()
        try:
            channel = await connection.channel()
            exchange = await channel.declare_exchange(
                self.topology.settings_exchange, aio_pika.ExchangeType.FANOUT, durable=True
            )
            queue = await channel.declare_queue("", exclusive=True, auto_delete=True)
            await queue.bind(exchange)

            async def deliver(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                on_message(message.body)

            await queue.consume(deliver, no_ack=True)
        except _AMQP_ERRORS as exc:
            raise DependencyUnavailable("rabbitmq", _describe(exc)) from exc
        self._consumer_channels.append(channel)

    async def stop_consuming(self) -> None:
        """Cancel every consumer so no new deliveries arrive; in-flight ones can still settle."""
        for queue, tag in self._consumers:
            with contextlib.suppress(*_AMQP_ERRORS):
                await queue.cancel(tag)
        self._consumers.clear()

    async def queue_depth(self, queue_name: str) -> int:
        """Messages ready in ``queue_name`` (DependencyUnavailable when it does not exist).

        A passive declare of a missing queue makes the broker close its channel: it runs on a
        channel of its own, so that a probe (``/readyz`` before the topology is declared)
        never closes the channel publishes go through, even for the moment aio-pika takes
        to reopen it. A raw declare: aio-pika's ``declare_queue`` may answer from its cache.
        """
        transport = self._require_connection().transport
        if transport is None:
            raise DependencyUnavailable("rabbitmq", "connection closed")
        try:
            raw = await transport.connection.channel(publisher_confirms=False)
            try:
                result = await raw.queue_declare(queue=queue_name, passive=True)
            finally:
                if not raw.is_closed:
                    await raw.close()
        except _AMQP_ERRORS as exc:
            raise DependencyUnavailable("rabbitmq", _describe(exc)) from exc
        return int(result.message_count or 0)

    async def get(self, queue_name: str) -> aio_pika.abc.AbstractIncomingMessage | None:
        """Fetch one message without a consumer (operator tools: dead-letter listing)."""
        channel = self._require_channel()
        try:
            queue = await channel.get_queue(queue_name, ensure=True)
            return await queue.get(no_ack=False, fail=False, timeout=self.publish_timeout)
        except _AMQP_ERRORS as exc:
            raise DependencyUnavailable("rabbitmq", _describe(exc)) from exc

    async def _exchange(self, name: str) -> aio_pika.abc.AbstractExchange:
        exchange = self._exchanges.get(name)
        if exchange is None:
            exchange = await self._require_channel().get_exchange(name, ensure=False)
            self._exchanges[name] = exchange
        return exchange

    def _require_connection(self) -> aio_pika.abc.AbstractRobustConnection:
        if self._connection is None:
            raise DependencyUnavailable("rabbitmq", "not connected")
        return self._connection

    def _require_channel(self) -> aio_pika.abc.AbstractChannel:
        if self._channel is None:
            raise DependencyUnavailable("rabbitmq", "not connected")
        return self._channel


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
