"""``POST /webhooks/sendgrid``, ``POST /webhooks/mailgun`` and ``POST /webhooks/ses``: verify
over the raw bytes, then hand the delivery to the intake (``intake``), which answers only once
it is durable: applied to Cassandra, or queued in RabbitMQ for when Cassandra is back.

SES (through SNS): the body is capped, its envelope parsed, its ``TopicArn`` must be one of
``SAFEDELIVR_WEBHOOKS_SES_TOPIC_ARNS`` and its ``SigningCertURL`` SNS's own (else 401), and
the signature must verify with that certificate (``services.webhooks.sns``; else 401). A
``SubscriptionConfirmation`` is confirmed by a GET of its ``SubscribeURL`` only when that is
SNS's own ``ConfirmSubscription`` address (else 400, nothing fetched); an
``UnsubscribeConfirmation`` is an alert to the operators (``ses_unsubscribed``: events stop
coming) and answered 200; a
``Notification`` goes to the intake. The ``Timestamp`` is not held against a notification:
SNS redelivers the same signed message for up to an hour, and a replay changes nothing (its
events' ids are SNS's ``MessageId``).

Status codes: 401 bad or stale signature (nothing stored), 400 malformed body, 413 too large,
200 applied or queued (orphans included, so the provider stops retrying), 503 only when
neither Cassandra nor RabbitMQ takes the delivery, so the provider retries later.
"""

from __future__ import annotations

import base64
import hmac
import logging
import time

from starlette.requests import Request
from starlette.responses import Response

from shared.core.webhook_events import MalformedPayload, timestamp_fresh
from shared.infra.config import Settings
from shared.infra.http import JSON, ApiError, read_capped
from shared.ops.alerts import Alert, Alerter
from shared.providers import mailgun_events, sendgrid_events, ses_events

log = logging.getLogger(__name__)

#: Largest SendGrid body accepted (it batches events, up to 768 KB); read only once the
#: signature headers are there.
MAX_BODY = 5 * 1024 * 1024
#: Largest Mailgun body: one event per post, a few KB. Its signature is inside the body, so
#: this much is read before anything is authenticated, and no more.
MAILGUN_MAX_BODY = 256 * 1024
#: Largest SNS body: a message is at most 256 KB, with its envelope around it. Its signature
#: is inside the body, so this much is read before anything is authenticated.
SES_MAX_BODY = 300 * 1024
#: Seconds a webhook body may take to arrive (providers send at once; a trickle is an attack).
BODY_TIMEOUT = 10.0

SG_SIGNATURE = "x-twilio-email-event-webhook-signature"
SG_TIMESTAMP = "x-twilio-email-event-webhook-timestamp"


def _unauthorized(why: str) -> ApiError:
    return ApiError(401, "bad_signature", why)


def _basic_configured(settings: Settings) -> bool:
    w = settings.webhooks
    return bool(w.sendgrid_basic_user) and w.sendgrid_basic_password is not None


def _check_basic(request: Request, settings: Settings) -> None:
    user = settings.webhooks.sendgrid_basic_user
    password = settings.webhooks.sendgrid_basic_password
    if not user or password is None:
        return
    expected = base64.b64encode(f"{user}:{password.get_secret_value()}".encode()).decode()
    given = request.headers.get("authorization", "")
    if not hmac.compare_digest(given.encode(), f"Basic {expected}".encode()):
        raise _unauthorized("bad basic auth credentials")


async def sendgrid(request: Request) -> Response:
    state = request.app.state
    settings: Settings = state.settings
    # Everything that needs no body is checked before the body is read, so an unauthenticated
    # sender cannot make us buffer anything.
    _check_basic(request, settings)
    key = state.sendgrid_key
    if key is None:
        # Fail closed: Basic auth alone is a shared password in every request, not proof that
        # SendGrid sent this body. Without the signature key the provider gets a 503 and
        # retries (for 72 hours), so nothing is lost while the operator configures it.
        if not (settings.webhooks.sendgrid_insecure_basic_only and _basic_configured(settings)):
            raise ApiError(
                503,
                "not_configured",
                "SendGrid webhook signature verification is not configured "
                "(SAFEDELIVR_WEBHOOKS_SENDGRID_PUBLIC_KEY)",
            )
        return JSON(
            await state.intake.receive(
                "sg", await read_capped(request, MAX_BODY, timeout=BODY_TIMEOUT)
            )
        )
    signature = request.headers.get(SG_SIGNATURE, "")
    stamp = request.headers.get(SG_TIMESTAMP, "")
    if not signature or not timestamp_fresh(
        stamp, time.time(), settings.webhooks.timestamp_tolerance
    ):
        raise _unauthorized("missing signature, or missing or stale signature timestamp")
    raw = await read_capped(request, MAX_BODY, timeout=BODY_TIMEOUT)
    if not sendgrid_events.verify_signature_with_key(key, signature, stamp, raw):
        raise _unauthorized("signature does not match")
    return JSON(await state.intake.receive("sg", raw))


async def mailgun(request: Request) -> Response:
    state = request.app.state
    settings: Settings = state.settings
    raw = await read_capped(request, MAILGUN_MAX_BODY, timeout=BODY_TIMEOUT)
    signing_key = settings.webhooks.mailgun_signing_key
    if signing_key is None:
        raise ApiError(503, "not_configured", "Mailgun webhook signing key is not configured")
    try:
        envelope = mailgun_events.parse_envelope(raw)
    except MalformedPayload as exc:
        raise ApiError(400, "malformed_body", str(exc)) from exc
    if not timestamp_fresh(envelope.timestamp, time.time(), settings.webhooks.timestamp_tolerance):
        raise _unauthorized("stale signature timestamp")
    if not mailgun_events.verify_signature(
        signing_key.get_secret_value(), envelope.timestamp, envelope.token, envelope.signature
    ):
        raise _unauthorized("signature does not match")
    return JSON(await state.intake.receive("mg", raw))


async def ses(request: Request) -> Response:
    state = request.app.state
    topics: frozenset[str] = state.ses_topics
    if not topics:
        raise ApiError(
            503,
            "not_configured",
            "no SNS topic is allowed for SES events (SAFEDELIVR_WEBHOOKS_SES_TOPIC_ARNS)",
        )
    raw = await read_capped(request, SES_MAX_BODY, timeout=BODY_TIMEOUT)
    try:
        envelope = ses_events.parse_envelope(raw)
    except MalformedPayload as exc:
        raise ApiError(400, "malformed_body", str(exc)) from exc
    if not ses_events.topic_allowed(envelope, topics):
        raise _unauthorized("the SNS topic is not one of SAFEDELIVR_WEBHOOKS_SES_TOPIC_ARNS")
    if not ses_events.cert_url_allowed(envelope.signing_cert_url, envelope.topic_arn):
        raise _unauthorized("the signing certificate is not SNS's own (https, its region)")
    key = await state.sns.key(envelope.signing_cert_url)
    if key is None or not ses_events.verify_signature(envelope, key):
        raise _unauthorized("signature does not match")
    if envelope.type == "SubscriptionConfirmation":
        url = envelope.subscribe_url or ""
        if not ses_events.subscribe_url_allowed(url, envelope.topic_arn):
            raise ApiError(
                400, "subscribe_url_refused", "the SubscribeURL is not SNS's ConfirmSubscription"
            )
        await state.sns.confirm(url)
        log.info("confirmed the SNS subscription to %s", envelope.topic_arn)
        return JSON({"confirmed": True})
    if envelope.type == "UnsubscribeConfirmation":
        # Deliveries, bounces and complaints of SES stop coming: an operator must know.
        text = (
            f"the SNS subscription to {envelope.topic_arn} was cancelled: SES events stop "
            "coming until it is subscribed again (SES recipients then wait out the webhook "
            "window)"
        )
        alerter: Alerter = state.alerter
        await alerter.send(Alert("ses_unsubscribed", envelope.topic_arn, text))
        return JSON({"unsubscribed": True})
    return JSON(await state.intake.receive("ses", raw))
