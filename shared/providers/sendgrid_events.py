"""SendGrid's Event Webhook: the Signed Event Webhook check and the events, normalised.

Owns (pure; no I/O):

* signature verification -- ECDSA P-256 / SHA-256 over ``timestamp + raw body``, the
  signature base64 DER in ``X-Twilio-Email-Event-Webhook-Signature``, the public key base64
  DER SubjectPublicKeyInfo as SendGrid's console shows it (:func:`load_public_key` validates
  it once at start-up; :func:`verify_signature_with_key` uses the loaded key);
* :func:`parse_events` -- the JSON array into :class:`~shared.core.webhook_events.ProviderEvent`.
  Our ``custom_args`` (``batch_id``, ``chunk`` and, in bulk mode, ``log_id``) come back as
  top-level keys of each event; SendGrid's reserved keys win over custom args of the same
  name, so reading the top-level keys is all there is to it.

Mapping (``provider_side`` = another provider may get through; ``suppress`` = final, and the
address joins the user's suppression list):

===============================  ==============  =============  ========
SendGrid                         kind            provider_side  suppress
===============================  ==============  =============  ========
processed                        sent
delivered                        delivered
deferred                         deferred        (the service applies a deadline)
bounce, type bounce or none      bounced                        yes
bounce, type blocked             dropped         yes            (the receiver blocked SendGrid)
bounce, type expired             dropped         yes            (SendGrid gave up after 72 h)
dropped, address on a list [1]   dropped                        yes
dropped, any other reason        dropped         yes
open / click                     opened/clicked
spamreport                       complained                     yes
unsubscribe, group_unsubscribe   unsubscribed                   yes
anything else                    unknown
===============================  ==============  =============  ========

[1] ``Bounced Address``, ``Unsubscribed Address``, ``Spam Reporting Address``, ``Invalid``.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import orjson
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from shared.core.webhook_events import (
    MalformedPayload,
    ParseResult,
    ProviderEvent,
    Verdict,
    build_event,
    content_id,
    parse_email,
    parse_time,
    text,
)
from shared.core.webhook_events import timestamp_fresh as timestamp_fresh

#: Our code for SendGrid (as in ``shared.providers.sendgrid``, which needs the SDK to import).
CODE = "sg"
#: Header carrying the base64 DER ECDSA signature of ``timestamp + body``.
SIGNATURE_HEADER = "X-Twilio-Email-Event-Webhook-Signature"
#: Header carrying the timestamp that was signed.
TIMESTAMP_HEADER = "X-Twilio-Email-Event-Webhook-Timestamp"

#: Drop reasons meaning the address itself is on a SendGrid list: the recipient's doing.
_RECIPIENT_DROPS = ("bounced address", "unsubscribed address", "spam reporting address")
_INVALID_DROPS = ("invalid", "invalid address")

#: Bounce ``type`` values that are not the recipient's doing.
_PROVIDER_BOUNCES = ("blocked", "expired")


_SIMPLE: dict[str, Verdict] = {
    "processed": Verdict("sent", "processed"),
    "delivered": Verdict("delivered", "delivered"),
    "open": Verdict("opened", "open"),
    "click": Verdict("clicked", "click"),
    "spamreport": Verdict("complained", "spamreport", suppress=True),
    "unsubscribe": Verdict("unsubscribed", "unsubscribe", suppress=True),
    "group_unsubscribe": Verdict("unsubscribed", "group_unsubscribe", suppress=True),
}


# -- signatures ---------------------------------------------------------------------------------


def load_public_key(public_key_b64: str) -> ec.EllipticCurvePublicKey:
    """The verification key from SendGrid's base64 DER (PEM is accepted too).

    Raises ValueError, naming the problem, for anything but an ECDSA P-256 public key.
    """
    try:
        if "-----BEGIN" in public_key_b64:
            key = serialization.load_pem_public_key(public_key_b64.strip().encode())
        else:
            der = base64.b64decode("".join(public_key_b64.split()), validate=True)
            key = serialization.load_der_public_key(der)
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise ValueError(f"not a base64 DER public key: {exc}") from exc
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp256r1":
        raise ValueError("the SendGrid verification key must be an ECDSA P-256 public key")
    return key


def verify_signature_with_key(
    key: ec.EllipticCurvePublicKey, signature_b64: str, timestamp: str, raw_body: bytes
) -> bool:
    """Whether ``signature_b64`` signs ``timestamp + raw_body`` with ``key``; never raises."""
    try:
        signature = base64.b64decode(signature_b64.strip(), validate=True)
        key.verify(signature, timestamp.encode() + raw_body, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError):
        return False
    return True


def verify_signature(
    public_key_b64: str, signature_b64: str, timestamp: str, raw_body: bytes
) -> bool:
    """Like :func:`verify_signature_with_key`, loading the key first; False if it is bad."""
    try:
        key = load_public_key(public_key_b64)
    except ValueError:
        return False
    return verify_signature_with_key(key, signature_b64, timestamp, raw_body)


# -- events -------------------------------------------------------------------------------------


def parse_events(raw_body: bytes, *, received_at: datetime | None = None) -> ParseResult:
    """The events of one Event Webhook POST; raises MalformedPayload unless it is a JSON
    array of objects. Events without a recipient address are skipped and counted.

    ``received_at`` stands in for an event without a usable timestamp (default: now).
    """
    try:
        data = orjson.loads(raw_body)
    except orjson.JSONDecodeError as exc:
        raise MalformedPayload(f"the body is not JSON: {exc}") from exc
    if not isinstance(data, list):
        raise MalformedPayload("the body must be a JSON array of events")
    if not all(isinstance(item, dict) for item in data):
        raise MalformedPayload("every event must be a JSON object")
    fallback = received_at or datetime.now(UTC)
    events = [parse_event(item, received_at=fallback) for item in data]
    found = tuple(event for event in events if event is not None)
    return ParseResult(found, skipped=len(events) - len(found))


def parse_event(item: Mapping[str, Any], *, received_at: datetime) -> ProviderEvent | None:
    """One SendGrid event, normalised; None when it names no recipient."""
    email = parse_email(item.get("email"))
    if email is None:
        return None
    verdict = _classify(item)
    return build_event(
        verdict,
        provider=CODE,
        event_id=text(item.get("sg_event_id")) or content_id(item),
        email=email,
        occurred_at=parse_time(item.get("timestamp")) or received_at,
        ids=item,
        message_id=_message_id(item.get("sg_message_id")),
        url=item.get("url"),
    )


def _classify(item: Mapping[str, Any]) -> Verdict:
    event = text(item.get("event"), limit=100) or ""
    if event in _SIMPLE:
        return _SIMPLE[event]
    if event == "deferred":
        return Verdict("deferred", event, reason=text(item.get("response")))
    if event == "bounce":
        return _bounce(item)
    if event == "dropped":
        return _dropped(item)
    return Verdict("unknown", event)


def _bounce(item: Mapping[str, Any]) -> Verdict:
    kind = text(item.get("type"), limit=100)
    raw = f"bounce/{kind}" if kind else "bounce"
    reason = text(item.get("reason")) or text(item.get("status"))
    if kind in _PROVIDER_BOUNCES:
        return Verdict("dropped", raw, reason, provider_side=True)
    return Verdict("bounced", raw, reason, suppress=True)


def _dropped(item: Mapping[str, Any]) -> Verdict:
    reason = text(item.get("reason"))
    normalised = (reason or "").lower()
    if normalised.startswith(_RECIPIENT_DROPS) or normalised in _INVALID_DROPS:
        return Verdict("dropped", "dropped", reason, suppress=True)
    return Verdict("dropped", "dropped", reason, provider_side=True)


def _message_id(value: object) -> str | None:
    """``sg_message_id`` up to its first dot: the ``X-Message-Id`` of the send response."""
    full = text(value)
    if full is None:
        return None
    return full.partition(".")[0] or None
