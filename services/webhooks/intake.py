"""Durable intake of verified webhook deliveries: applied now, or queued, before any 2xx.

A verified delivery is applied to Cassandra directly when Cassandra answers within
:data:`DIRECT_BUDGET` seconds (the usual case, and the provider then learns about orphans in
the answer). When it does not, the raw body is published with a confirm to the quorum queue
``<exchange>.webhooks`` (``hook.<ns>``) and answered 200: a consumer in this service applies it
once Cassandra is back, however long that takes. Only when both fail does the provider get a
503 (and retry). Mailgun never retries ``delivered`` webhooks, so this is what keeps a
Cassandra outage from losing deliveries.

Applying is idempotent (``ingest``), so a delivery that was partly applied directly and then
queued is simply applied again. Mailgun tokens are accepted once, for one body: checked
directly when Cassandra answers (a reused token with another body is a 401), and again by the
consumer for queued deliveries (where a forgery is dropped and counted).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import aio_pika.abc
from prometheus_client import CollectorRegistry, Counter

from services.webhooks.webhook_tokens import Tokens
from shared.core.catalog import CODES
from shared.core.errors import DependencyUnavailable
from shared.core.webhook_events import MalformedPayload
from shared.infra.broker import Broker
from shared.infra.gil import CpuLane
from shared.infra.http import ApiError
from shared.infra.logs import bound
from shared.infra.settle import Delivery
from shared.ingest.ingest import Ingest
from shared.providers import mailgun_events, sendgrid_events, ses_events

log = logging.getLogger(__name__)

#: Seconds a delivery may take to apply directly before it is queued instead.
DIRECT_BUDGET = 2.0
#: Header carrying when the delivery was received (unix seconds).
RECEIVED_AT = "x-safedelivr-received-at"
#: Bytes of a SendGrid delivery above which its events are parsed in a worker thread (about
#: 100 events, 2-3 ms of CPU), so a large one does not stall the event loop.
LARGE_DELIVERY = 32 * 1024


class TokenReused(Exception):
    """A Mailgun token already accepted with another body: a forgery."""


def intake_key(provider: str) -> str:
    """The routing key of a queued delivery from ``provider`` (``sg``, ``mg``)."""
    return f"hook.{provider}"


@dataclass(frozen=True)
class IntakeMetrics:
    queued: Counter
    forged: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> IntakeMetrics:
        return cls(
            Counter(
                "safedelivr_webhook_deliveries_queued",
                "Verified deliveries queued because Cassandra did not answer in time",
                ["provider"],
                registry=registry,
            ),
            Counter(
                "safedelivr_webhook_forgeries",
                "Mailgun deliveries dropped: their token was already used with another body",
                registry=registry,
            ),
        )


@dataclass
class Intake:
    tokens: Tokens
    broker: Broker
    ingest: Ingest
    metrics: IntakeMetrics
    budget: float = DIRECT_BUDGET
    cpu: CpuLane = field(default_factory=CpuLane)
    """The service's thread for long pure-Python work (``shared.infra.gil``)."""

    async def receive(self, provider: str, raw: bytes) -> dict[str, object]:
        """Make one verified, well-formed delivery durable; the answer's JSON body.

        Raises ApiError 400 for a malformed body, 401 for a reused Mailgun token, and
        DependencyUnavailable (503) when neither Cassandra nor RabbitMQ takes it.
        """
        received_at = time.time()
        try:
            async with asyncio.timeout(self.budget):
                return await self._apply(provider, raw, received_at)
        except TokenReused as exc:
            raise ApiError(401, "bad_signature", str(exc)) from exc
        except MalformedPayload as exc:
            raise ApiError(400, "malformed_body", str(exc)) from exc
        except (DependencyUnavailable, TimeoutError) as exc:
            reason = str(exc) or f"Cassandra did not answer within {self.budget:g} s"
            log.warning("queueing a %s delivery: %s", provider, reason)
        try:
            await self.broker.publish(
                intake_key(provider), raw, headers={RECEIVED_AT: str(received_at)}
            )
        except DependencyUnavailable as exc:
            raise DependencyUnavailable("cassandra and rabbitmq", exc.detail) from exc
        self.metrics.queued.labels(provider).inc()
        return {"received": 1, "queued": True}

    async def process(
        self, message: aio_pika.abc.AbstractIncomingMessage, delivery: Delivery
    ) -> None:
        """Apply one queued delivery (the consumer of ``<exchange>.webhooks``)."""
        key = message.routing_key or ""
        provider = key.removeprefix("hook.")
        if provider not in CODES:
            raise MalformedPayload(f"not a webhook intake key: {key}")
        headers = message.headers or {}
        try:
            received_at = float(str(headers.get(RECEIVED_AT, "")))
        except ValueError:
            received_at = time.time()
        try:
            with bound(provider=provider, webhook_received_at=received_at):
                await self._apply(provider, message.body, received_at)
        except TokenReused:
            self.metrics.forged.inc()
            log.warning("dropped a queued Mailgun delivery whose token was used with another body")

    async def _apply(self, provider: str, raw: bytes, received_at: float) -> dict[str, object]:
        parser = PARSERS.get(provider)
        if parser is None:
            raise MalformedPayload(f"no webhook intake for provider {provider!r}")
        return await parser(self, raw, received_at)


async def _sendgrid(intake: Intake, raw: bytes, received_at: float) -> dict[str, object]:
    """SendGrid: an array of events."""
    when = datetime.fromtimestamp(received_at, UTC)
    if len(raw) > LARGE_DELIVERY:
        # ~80 us an event: a 768 KB batch is 75 ms of CPU, 5 MB of small ones 2.6 s.
        parsed = await intake.cpu.run(sendgrid_events.parse_events, raw, received_at=when)
    else:
        parsed = sendgrid_events.parse_events(raw, received_at=when)
    counts = await intake.ingest.apply_all(parsed.events)
    return {"received": len(parsed.events) + parsed.skipped, **counts}


async def _mailgun(intake: Intake, raw: bytes, received_at: float) -> dict[str, object]:
    """Mailgun: one event, its token accepted once for one body."""
    envelope = mailgun_events.parse_envelope(raw)
    if not await intake.tokens.accept_once(envelope.token, envelope.body_hash):
        raise TokenReused("this token was already used with another body")
    event = mailgun_events.parse_event(envelope.event_data)
    if event is None:
        return {"received": 1, "applied": 0, "orphans": 0, "ignored": 1}
    return {"received": 1, **await intake.ingest.apply_all([event])}


async def _ses(intake: Intake, raw: bytes, received_at: float) -> dict[str, object]:
    """Amazon SES: one SNS notification carrying one SES event record (its events' ids are
    the SNS ``MessageId`` with the recipient, so a replay rewrites the same cells)."""
    envelope = ses_events.parse_envelope(raw)
    if envelope.type != "Notification":
        return {"received": 0, "applied": 0, "orphans": 0, "ignored": 1}
    when = datetime.fromtimestamp(received_at, UTC)
    parsed = ses_events.parse_events(envelope, received_at=when)
    counts = await intake.ingest.apply_all(parsed.events)
    return {"received": len(parsed.events) + parsed.skipped, **counts}


#: How each provider's verified delivery is parsed and applied, by provider code.
PARSERS: dict[str, Callable[[Intake, bytes, float], Awaitable[dict[str, object]]]] = {
    "sg": _sendgrid,
    "mg": _mailgun,
    "ses": _ses,
}
