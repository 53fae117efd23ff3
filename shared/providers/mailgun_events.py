"""Mailgun's JSON webhooks: the envelope, its HMAC signature, and the event, normalised.

Owns (pure; no I/O):

* :func:`parse_envelope` -- ``{"signature": {timestamp, token, signature}, "event-data": {...}}``
  with the SHA-256 of the raw body. Mailgun's HMAC covers only ``timestamp + token``, not the
  body, so the receiver must make each token single-use: the same token with the same body
  hash is a replay (a no-op), with another body it is a forgery;
* :func:`verify_signature` -- hex HMAC-SHA256(signing key, ``timestamp + token``), compared in
  constant time;
* :func:`parse_event` -- ``event-data`` into a :class:`~shared.core.webhook_events.ProviderEvent`.
  Our ``v:batch_id``, ``v:chunk`` and (bulk) ``v:log_id`` come back in ``user-variables``.
  The dedupe key is ``"{id}:{timestamp}"``: Mailgun's ``id`` is unique only within a day.

Mapping (``provider_side`` = another provider may get through; ``suppress`` = final, and the
address joins the user's suppression list):

===================================================  ============  =============  ========
Mailgun ``event`` (``severity``, ``reason``)         kind          provider_side  suppress
===================================================  ============  =============  ========
accepted                                             sent
delivered                                            delivered
failed, temporary                                    deferred      (the service applies a deadline)
failed, permanent, suppress-bounce/-unsubscribe/     dropped                      yes
-complaint
failed, permanent, bounce or no reason, a delayed    bounced                      yes
bounce, or a 5xx code (unless ``old``)
failed, permanent, ``old`` (retries given up),       dropped       yes
``generic`` and any other reason
rejected                                             dropped       yes
opened / clicked                                     opened/clicked
complained                                           complained                   yes
unsubscribed                                         unsubscribed                 yes
anything else                                        unknown
===================================================  ============  =============  ========
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from shared.core.webhook_events import (
    MalformedPayload,
    ProviderEvent,
    Verdict,
    build_event,
    content_id,
    event_key,
    parse_email,
    parse_time,
    text,
)
from shared.core.webhook_events import timestamp_fresh as timestamp_fresh

#: Our code for Mailgun (as in ``shared.providers.mailgun``).
CODE = "mg"

#: Permanent-failure reasons meaning Mailgun's own list holds the address: the recipient's doing.
_SUPPRESSED = frozenset({"suppress-bounce", "suppress-unsubscribe", "suppress-complaint"})
#: Mailgun gave up retrying temporary failures: not the recipient's doing.
_GAVE_UP = "old"


@dataclass(frozen=True, slots=True)
class MailgunEnvelope:
    """One webhook POST: its signature parts, its event and the SHA-256 of its raw body."""

    timestamp: str
    token: str
    signature: str
    event_data: dict[str, Any]
    body_hash: bytes


_SIMPLE: dict[str, Verdict] = {
    "accepted": Verdict("sent", "accepted"),
    "delivered": Verdict("delivered", "delivered"),
    "opened": Verdict("opened", "opened"),
    "clicked": Verdict("clicked", "clicked"),
    "complained": Verdict("complained", "complained", suppress=True),
    "unsubscribed": Verdict("unsubscribed", "unsubscribed", suppress=True),
}


# -- envelope and signature ---------------------------------------------------------------------


def parse_envelope(raw_body: bytes) -> MailgunEnvelope:
    """The envelope of one webhook POST; raises MalformedPayload if it is not one."""
    try:
        data = orjson.loads(raw_body)
    except orjson.JSONDecodeError as exc:
        raise MalformedPayload(f"the body is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise MalformedPayload("the body must be a JSON object")
    signature = data.get("signature")
    event_data = data.get("event-data")
    if not isinstance(signature, dict) or not isinstance(event_data, dict):
        raise MalformedPayload("the body needs a 'signature' and an 'event-data' object")
    timestamp = signature.get("timestamp")
    if isinstance(timestamp, int) and not isinstance(timestamp, bool):
        timestamp = str(timestamp)
    token = signature.get("token")
    value = signature.get("signature")
    if not (isinstance(timestamp, str) and isinstance(token, str) and isinstance(value, str)):
        raise MalformedPayload("'signature' needs string 'timestamp', 'token' and 'signature'")
    if not (timestamp and token and value):
        raise MalformedPayload("'signature' has an empty 'timestamp', 'token' or 'signature'")
    return MailgunEnvelope(
        timestamp=timestamp,
        token=token,
        signature=value,
        event_data=event_data,
        body_hash=hashlib.sha256(raw_body).digest(),
    )


def verify_signature(signing_key: str, timestamp: str, token: str, signature: str) -> bool:
    """Whether ``signature`` is the hex HMAC-SHA256 of ``timestamp + token``; never raises."""
    if not signing_key:
        return False
    try:
        expected = hmac.new(
            signing_key.encode(), (timestamp + token).encode(), hashlib.sha256
        ).hexdigest()
        return hmac.compare_digest(expected.encode(), signature.encode())
    except ValueError:  # a lone surrogate cannot be encoded
        return False


# -- events -------------------------------------------------------------------------------------


def parse_event(
    event_data: Mapping[str, Any], *, received_at: datetime | None = None
) -> ProviderEvent | None:
    """One ``event-data``, normalised; None when it names no recipient.

    ``received_at`` stands in for a missing or unusable timestamp (default: now).
    """
    email = parse_email(event_data.get("recipient"))
    if email is None:
        return None
    verdict = _classify(event_data)
    stamp = event_data.get("timestamp")
    event_id = text(event_data.get("id"), limit=200)
    key = event_key(stamp)
    return build_event(
        verdict,
        provider=CODE,
        event_id=f"{event_id}:{key}" if event_id and key else content_id(event_data),
        email=email,
        occurred_at=parse_time(stamp) or received_at or datetime.now(UTC),
        ids=_mapping(event_data.get("user-variables")),
        message_id=_message_id(event_data),
        url=event_data.get("url"),
    )


def _classify(data: Mapping[str, Any]) -> Verdict:
    event = text(data.get("event"), limit=100) or ""
    if event in _SIMPLE:
        return _SIMPLE[event]
    if event == "failed":
        return _failed(data)
    if event == "rejected":
        reject = _mapping(data.get("reject"))
        reason = text(reject.get("description")) or text(reject.get("reason"))
        return Verdict("dropped", event, reason, provider_side=True)
    return Verdict("unknown", event)


def _failed(data: Mapping[str, Any]) -> Verdict:
    severity = text(data.get("severity"), limit=100)
    reason = text(data.get("reason"), limit=100)
    raw = "/".join(part for part in ("failed", severity, reason) if part)
    status = _mapping(data.get("delivery-status"))
    why = _status_text(status) or reason
    if severity == "temporary":
        return Verdict("deferred", raw, why)
    if reason in _SUPPRESSED:
        return Verdict("dropped", raw, why, suppress=True)
    delayed = _mapping(data.get("flags")).get("is-delayed-bounce") is True
    code = status.get("code")
    hard = isinstance(code, int) and 500 <= code < 600 and reason != _GAVE_UP
    if delayed or reason in (None, "bounce") or hard:
        return Verdict("bounced", raw, why, suppress=True)
    return Verdict("dropped", raw, why, provider_side=True)


def _status_text(status: Mapping[str, Any]) -> str | None:
    """``"<code> <message>"`` from ``delivery-status`` (its description if no message)."""
    code = status.get("code")
    words = text(status.get("message")) or text(status.get("description"))
    number = str(code) if isinstance(code, int) and not isinstance(code, bool) else None
    return " ".join(part for part in (number, words) if part) or None


def _message_id(data: Mapping[str, Any]) -> str | None:
    headers = _mapping(_mapping(data.get("message")).get("headers"))
    value = text(headers.get("message-id"), limit=500)
    if value is None:
        return None
    return value.strip("<>") or None


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}
