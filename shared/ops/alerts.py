"""Alerts to operators: a Slack/Discord-compatible incoming webhook (the live setting
``alerts.webhook_url``) and e-mail to the operators (``alerts.email_to``, from
``alerts.email_from``), for circuits opening, error bursts, dead letters, deep queues,
sending domains at their capacity and an SES event feed unsubscribed. Every service builds
its alerter the one way :func:`alerter_for` does, configured from the live settings
(:func:`alert_config`).

The e-mail goes through Safedelivr itself (:class:`AlertMail`): a batch accepted like any
other (stored, then published through the outbox, so a crash after storing still sends it),
owned by the system account :data:`SYSTEM_LOGIN`, whose batches and logs are there to read
like anyone's. That login cannot be a GitHub login (``:`` is not allowed in one), so nobody
can sign in as it.

The sink is an operator's setting, but whoever holds an operator key or session can change it
live, so it is guarded like users' webhook endpoints (``shared.outbound.ssrf``): https only (http
where ``SAFEDELIVR_ALERTS_ALLOW_HTTP`` allows it), no credentials, and every address its host
resolves to public (or in ``SAFEDELIVR_ALERTS_ALLOWED_NETWORKS``), checked when it is set
(:func:`vet_sink`) and again at every post, which connects to the address vetted (no second
lookup a rebinding name server could answer differently) without following redirects.

An alert is a kind and a subject (``circuit_open`` / ``sg``) with a sentence. The same alert is
sent at most once per cool-off (``alerts.cool_off``) across every process: the first to claim
it in ``alerts_sent`` (a lightweight transaction whose row lives as long as the cool-off)
posts it; the others find it claimed. The body carries both ``text`` (Slack) and ``content``
(Discord). Sending never raises: an alert that cannot be claimed or posted is logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

from shared.accounts.accounts import ensure_user
from shared.core.errors import DependencyUnavailable
from shared.delivery.acceptance import Acceptance
from shared.delivery.batchstore import BatchStore, NewBatch, new_batch_id
from shared.delivery.outbox import Outbox, tell_relays
from shared.delivery.stats import StatsStore, tell_rollups
from shared.delivery.validation import InvalidRequest, parse_batch_request
from shared.infra.config import Settings
from shared.infra.db import Database
from shared.infra.resources import Resources
from shared.ops.livesettings import LiveSettings
from shared.outbound import ssrf
from shared.outbound.hook_delivery import Resolve, host_header, pinned_url, resolve, vet
from shared.outbound.ssrf import IPAddress, Network, Target, TargetError

log = logging.getLogger(__name__)

#: Seconds an alert post may take.
POST_TIMEOUT = 5.0


@dataclass(frozen=True, slots=True)
class Alert:
    kind: str
    """``circuit_open``, ``error_burst``, ``dead_letters``, ``queue_depth``, ``capacity``."""
    subject: str
    """What it is about (a provider code, a queue)."""
    text: str


#: The account that owns alert mail.
SYSTEM_LOGIN = "safedelivr:alerts"
#: Chunk size of alert mail (far fewer operators than any provider's limit).
ALERT_CHUNK = 100


@dataclass(frozen=True, slots=True)
class AlertConfig:
    url: str
    cool_off: int
    email_to: tuple[str, ...] = ()
    email_from: str = ""

    @property
    def mails(self) -> bool:
        return bool(self.email_to and self.email_from)


def mail_body(alert: Alert, scope: str, at: datetime) -> dict[str, Any]:
    """The ``POST /v1/batches``-shaped body of an alert's e-mail (without from and to)."""
    return {
        "subject": f"[Safedelivr {scope}] {alert.kind}: {alert.subject}"[:200],
        "text": (
            f"{alert.text}\n\nKind: {alert.kind}\nAbout: {alert.subject}\n"
            f"Deployment: {scope}\nAt: {at.isoformat()}\n\n"
            "The same alert is not sent again during the cool-off (alerts.cool_off)."
        ),
        "categories": ["safedelivr-alert"],
    }


MailAlert = Callable[[Alert, AlertConfig, datetime], Awaitable[bool]]


@dataclass
class AlertMail:
    """Mails alerts through Safedelivr: an accepted batch of the system account."""

    db: Database
    acceptance: Acceptance
    scope: str

    async def __call__(self, alert: Alert, config: AlertConfig, at: datetime) -> bool:
        try:
            parsed = parse_batch_request(
                {
                    "from": config.email_from,
                    "to": list(config.email_to),
                    **mail_body(alert, self.scope, at),
                },
                max_recipients=ALERT_CHUNK,
            )
        except InvalidRequest as exc:
            log.warning("alert not mailed: %s", exc)
            return False
        try:
            user = await ensure_user(self.db, SYSTEM_LOGIN)
            batch = NewBatch(
                batch_id=new_batch_id(at.timestamp()),
                user_id=user,
                message=parsed.message,
                recipients=parsed.recipients,
                chunk_size=ALERT_CHUNK,
            )
            await self.acceptance.store(batch)
        except DependencyUnavailable as exc:
            log.warning("alert not mailed (not stored): %s", exc)
            return False
        if await self.acceptance.publish(batch.batch_id):  # else the outbox relay will
            # Not marked: the relay publishes it again, and the splitter absorbs that.
            with contextlib.suppress(DependencyUnavailable):
                await self.acceptance.outbox.done(batch.batch_id)
        log.info("alert %s/%s mailed as batch %s", alert.kind, alert.subject, batch.batch_id)
        return True


def body(alert: Alert, scope: str, at: datetime) -> dict[str, Any]:
    """The JSON posted for ``alert`` (Slack reads ``text``, Discord ``content``)."""
    line = f"[Safedelivr {scope}] {alert.text}"
    return {
        "text": line,
        "content": line,
        "kind": alert.kind,
        "subject": alert.subject,
        "deployment": scope,
        "at": at.isoformat(),
    }


async def vet_sink(
    url: str,
    *,
    allow_http: bool = False,
    allowed: Sequence[Network] = (),
    resolver: Resolve = resolve,
) -> tuple[Target, IPAddress]:
    """Where a post to the sink ``url`` may connect; TargetError saying why it may not."""
    target = ssrf.parse_target(url, allow_http=allow_http)
    try:
        async with asyncio.timeout(POST_TIMEOUT):
            return target, await vet(target, allowed, resolver)
    except TimeoutError:
        raise TargetError(f"{target.host} did not resolve within {POST_TIMEOUT:g}s") from None


@dataclass
class Alerter:
    db: Database
    scope: str
    http: httpx.AsyncClient
    config: Callable[[], AlertConfig]
    mail: MailAlert | None = None
    allow_http: bool = False
    """Whether the sink may be plain http (``SAFEDELIVR_ALERTS_ALLOW_HTTP``)."""
    allowed: Sequence[Network] = ()
    """Networks the sink may resolve to although not public."""
    resolver: Resolve = resolve
    _recent: dict[str, float] = field(default_factory=dict, repr=False)
    """Alerts this process raised (or found claimed) within their cool-off: not asked again."""

    async def send(self, alert: Alert) -> bool:
        """Post and mail ``alert`` unless it was sent within the cool-off; True when this call
        delivered it somewhere."""
        config = self.config()
        key = f"{alert.kind}:{alert.subject}"
        mails = config.mails and self.mail is not None
        sinkless = not config.url and not mails
        # With no sink the log line is the alert, and it keeps the cool-off too (a burst of
        # failures logged it once a second), apart: a sink set during the burst hears of it.
        recent = f"log:{key}" if sinkless else key
        if time.monotonic() - self._recent.get(recent, -1e12) < config.cool_off:
            return False  # a burst goes on: one alert per cool-off
        log.warning("alert %s/%s: %s", alert.kind, alert.subject, alert.text)
        if sinkless:
            self._recent[recent] = time.monotonic()
            return False
        now = datetime.now(UTC)
        try:
            row = await self.db.one(
                "INSERT INTO alerts_sent (scope, alert, sent_at) VALUES (?, ?, ?) "
                "IF NOT EXISTS USING TTL ?",
                (self.scope, key, now, config.cool_off),
            )
        except DependencyUnavailable as exc:
            log.warning("alert not sent (cannot claim it): %s", exc)
            return False
        self._recent[key] = time.monotonic()
        if not (row and row["[applied]"]):
            return False  # sent within the cool-off, by this process or another
        mailed = await self.mail(alert, config, now) if mails and self.mail else False
        return await self._post(alert, config, now) or mailed

    async def _post(self, alert: Alert, config: AlertConfig, now: datetime) -> bool:
        if not config.url:
            return False
        try:
            target, address = await vet_sink(
                config.url, allow_http=self.allow_http, allowed=self.allowed, resolver=self.resolver
            )
        except TargetError as exc:
            # Not the URL itself: an incoming webhook's URL is its secret.
            log.warning("alert not posted: the sink (alerts.webhook_url) is refused: %s", exc)
            return False
        request = self.http.build_request(
            "POST",
            pinned_url(target, address, config.url),
            json=body(alert, self.scope, now),
            headers={"host": host_header(target)},
            extensions={"sni_hostname": target.host} if target.scheme == "https" else {},
            timeout=POST_TIMEOUT,
        )
        try:
            answer = await self.http.send(request, follow_redirects=False)
        except httpx.HTTPError as exc:
            log.warning("alert not delivered to the sink: %s", exc)
            return False
        if answer.status_code >= 300:
            log.warning("the alert sink answered %d", answer.status_code)
            return False
        return True


def alert_config(live: LiveSettings | None) -> AlertConfig:
    """Where alerts go and their cool-off, as ``live`` says (no sink before it is read)."""
    if live is None:
        return AlertConfig("", 600)
    return AlertConfig(
        live.alert_url, live.alert_cool_off, live.alert_email_to, live.alert_email_from
    )


def alerter_for(
    settings: Settings,
    res: Resources,
    http: httpx.AsyncClient,
    config: Callable[[], AlertConfig],
) -> Alerter:
    """A service's alerter: posts through ``http`` (no proxy from the environment, no kept
    connection: see :class:`Alerter`), mails as batches whose outbox rows every API's relay
    is told of."""
    exchange = settings.amqp.exchange
    batches = BatchStore(
        res.db, tell_rollups(StatsStore(res.db, settings.stats.buckets), res.broker)
    )
    outbox = tell_relays(Outbox(res.db, exchange), res.broker, settings.api.outbox_relay_interval)
    return Alerter(
        res.db,
        exchange,
        http,
        config,
        mail=AlertMail(res.db, Acceptance(batches, outbox, res.broker), exchange),
        allow_http=settings.alerts.allow_http,
        allowed=settings.alerts.networks,
    )


def alert_http() -> httpx.AsyncClient:
    """The client :func:`alerter_for` posts through: the vetted address is connected to, so
    no proxy from the environment and no connection kept for a host the sink may no longer
    resolve to."""
    return httpx.AsyncClient(trust_env=False, limits=httpx.Limits(max_keepalive_connections=0))
