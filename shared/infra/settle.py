"""How every consumer settles a delivery: ack on success, hold on outages, dead-letter poison.

A handler returns normally once all its effects are durable; the delivery is then acked.
``DependencyUnavailable`` (Cassandra or RabbitMQ briefly down) is retried in place with
backoff while the message stays unacked, because requeueing would burn the quorum queue's
delivery limit and dead-letter good work during an outage. Each retry gets the same
:class:`Delivery`, so a handler knows it is retrying (and, for example, that a conditional
write whose outcome was unknown may have applied for it). A message that cannot be decoded
is rejected without requeue, which the queue dead-letters for an operator to inspect.
Anything else is a bug: the delivery is requeued and the delivery limit eventually parks it.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aio_pika.abc
from pydantic import ValidationError

from shared.core.errors import DependencyUnavailable
from shared.infra import waits

log = logging.getLogger(__name__)

#: Longest pause between retries while a dependency is down.
MAX_OUTAGE_BACKOFF = 15.0
#: After this long in an outage, requeue instead of holding the delivery.
MAX_OUTAGE_HOLD = 600.0


@dataclass
class Delivery:
    """What one delivery of a message keeps across the retries of its handler."""

    owner: uuid.UUID = field(default_factory=uuid.uuid4)
    """Identifies this delivery in the records it claims (stable across retries)."""
    retries: int = 0
    """How many times the handler was retried after a dependency failure."""
    scratch: dict[str, Any] = field(default_factory=dict)
    """Handler state that must survive a retry (e.g. "the provider was called")."""


Process = Callable[[aio_pika.abc.AbstractIncomingMessage, Delivery], Awaitable[None]]
Handler = Callable[[aio_pika.abc.AbstractIncomingMessage], Awaitable[None]]


class Poison(Exception):
    """The delivery can never be processed (bad routing key, undecodable body, no batch)."""


class InFlight:
    """Counts deliveries being processed so shutdown can wait for them."""

    def __init__(self) -> None:
        self.count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def enter(self) -> None:
        self.count += 1
        self._idle.clear()

    def leave(self) -> None:
        self.count -= 1
        if self.count == 0:
            self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no delivery is in flight, ``timeout`` seconds at most: whether none is."""
        return await waits.set_within(self._idle, timeout)


def settling(
    process: Process, inflight: InFlight, *, hold: float | None = MAX_OUTAGE_HOLD
) -> Handler:
    """Wrap ``process`` with the settlement rules of this module.

    ``hold`` is how long a delivery is held through an outage before it is requeued; None
    holds it until the outage ends (for work that must not reach the delivery limit).
    """

    async def handle(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        inflight.enter()
        try:
            await run(process, message, hold=hold)
        finally:
            inflight.leave()

    return handle


async def run(
    process: Process,
    message: aio_pika.abc.AbstractIncomingMessage,
    *,
    hold: float | None = MAX_OUTAGE_HOLD,
) -> None:
    """Process one delivery and settle it."""
    delivery = Delivery()
    delay, held = 0.5, 0.0
    while True:
        try:
            await process(message, delivery)
        except (Poison, ValidationError, ValueError) as exc:
            log.error("dead-lettering %s: %s", message.routing_key, exc)
            await _quietly(message.reject(requeue=False))
            return
        except DependencyUnavailable as exc:
            if hold is not None and held >= hold:
                log.warning("requeueing %s after %.0fs outage", message.routing_key, held)
                await _quietly(message.nack(requeue=True))
                return
            log.warning("%s; retrying %s in %.1fs", exc, message.routing_key, delay)
            await asyncio.sleep(delay)
            held += delay
            delay = min(delay * 2, MAX_OUTAGE_BACKOFF)
            delivery.retries += 1
            continue
        except Exception:
            log.exception("unexpected error on %s; requeueing", message.routing_key)
            await _quietly(message.nack(requeue=True))
            return
        await _quietly(message.ack())
        return


async def _quietly(settle: Awaitable[None]) -> None:
    # A channel lost mid-processing cannot settle; the broker redelivers the message anyway
    # and the handlers are idempotent, so the failure is logged and not raised.
    try:
        await settle
    except Exception as exc:  # noqa: BLE001 - any settle failure has the same remedy
        log.warning("could not settle delivery: %s", exc)
