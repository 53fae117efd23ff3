"""Webhook bodies for the parser tests, in the providers' real shapes.

Most are produced end to end by our own code: a chunk goes through the real payload builder
(``shared.providers.sendgrid.build_payload`` / ``shared.providers.mailgun.build_form``), the
sandbox turns the accepted request into events (``sandbox.events``) and signs them
(``sandbox.signing``), so the correlation ids we send are the ones we read back.
The docs samples from the brief are kept verbatim beside them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import orjson

from sandbox import signing
from sandbox.events import mailgun_events, sendgrid_events
from sandbox.mailgun import parse_message
from shared.core.models import Chunk
from shared.core.webhook_events import Kind, ProviderEvent
from shared.providers.mailgun import build_form
from shared.providers.sendgrid import build_payload
from tests.unit.providers.fakes import chunk, recipient

#: The sandbox's signing key pair for SendGrid, and another one that must not verify.
SG_PRIVATE = signing.generate_private_key()
SG_PUBLIC = signing.public_key_base64(SG_PRIVATE)
OTHER_PRIVATE = signing.generate_private_key()
MG_SIGNING_KEY = "test-mailgun-signing-key"

#: What the send APIs answered: SendGrid's X-Message-Id and Mailgun's ``id``.
X_MESSAGE_ID = "W2Xb3yQ1Sx2ZLcS9r1NuEw"
MAILGUN_ID = "<20240301120000.7.2A6098970A380E12@mg.example.org>"
ACCEPTED_AT = 1_709_294_400
NOW = 1_709_294_460


def provider_event(
    kind: Kind,
    *,
    provider: str = "sg",
    at: datetime = datetime(2026, 11, 20, 12, 0, 0, tzinfo=UTC),
    provider_side: bool = False,
    suppress: bool = False,
) -> ProviderEvent:
    """A normalised event with no correlation ids, for state-machine and ranking tests."""
    return ProviderEvent(
        provider=provider,
        event_id="e-1",
        kind=kind,
        raw_event=kind,
        email="a@x.com",
        occurred_at=at,
        batch_id=None,
        chunk=None,
        log_id=None,
        attempt=None,
        message_id=None,
        reason=None,
        provider_side=provider_side,
        suppress=suppress,
    )


def bulk_chunk(*addresses: str, index: int = 2) -> Chunk:
    """A bulk chunk (one message per recipient, log ids sent) to ``addresses``."""
    return chunk([recipient(a) for a in addresses], index=index, bulk=True)


def shared_chunk(*addresses: str, index: int = 2) -> Chunk:
    """A shared chunk (one message to everyone, no log ids) to ``addresses``."""
    return chunk([recipient(a) for a in addresses], index=index)


def sendgrid_body(sent: Chunk) -> bytes:
    """The Event Webhook body the sandbox posts for ``sent``."""
    payload = build_payload(sent)
    return orjson.dumps(sendgrid_events(payload, X_MESSAGE_ID, ACCEPTED_AT, NOW))


def sign_sendgrid(body: bytes, timestamp: str = str(NOW), key: Any = SG_PRIVATE) -> str:
    """The signature header for ``timestamp + body``."""
    return signing.sign_sendgrid(key, timestamp, body)


def mailgun_event_data(sent: Chunk, address: str) -> list[dict[str, Any]]:
    """The ``event-data`` objects the sandbox posts for ``address`` of ``sent``."""
    message = parse_message(build_form(sent))
    assert not isinstance(message, str), message
    return mailgun_events(message, MAILGUN_ID, address, float(NOW) + 0.25)


def mailgun_body(event_data: dict[str, Any], timestamp: int = NOW) -> bytes:
    """A signed Mailgun webhook body carrying ``event_data``."""
    signature = signing.mailgun_signature(MG_SIGNING_KEY, timestamp)
    return orjson.dumps({"signature": signature, "event-data": event_data})


def sendgrid_event(**fields: Any) -> dict[str, Any]:
    """A hand-written SendGrid event; ``fields`` override the defaults."""
    event: dict[str, Any] = {
        "email": "someone@example.com",
        "timestamp": NOW,
        "event": "delivered",
        "sg_event_id": "ZGVsaXZlcmVkLTAtMTIzNDU2Nzg5MA",
        "sg_message_id": f"{X_MESSAGE_ID}.filter0001.16648.5515E0B88.0",
    }
    event.update(fields)
    return {k: v for k, v in event.items() if v is not None}


def mailgun_failure(**fields: Any) -> dict[str, Any]:
    """A hand-written permanent Mailgun failure; ``fields`` override (None removes)."""
    event: dict[str, Any] = {
        "event": "failed",
        "id": "G9Bn5sl1TC6nu79C8C0bwg",
        "timestamp": 1_709_294_460.123456,
        "severity": "permanent",
        "reason": "bounce",
        "recipient": "someone@example.com",
        "delivery-status": {"code": 550, "message": "5.1.1 No such user", "description": ""},
    }
    event.update(fields)
    return {k: v for k, v in event.items() if v is not None}


def by_email(events: Sequence[Any]) -> dict[str, list[Any]]:
    """Parsed events grouped by recipient, in order."""
    grouped: dict[str, list[Any]] = {}
    for event in events:
        grouped.setdefault(event.email, []).append(event)
    return grouped


#: The bounce sample from SendGrid's Event Webhook reference (brief B1).
SENDGRID_DOCS_BOUNCE = b"""[{"email":"example@test.com","timestamp":1513299569,
"smtp-id":"<14c5d75ce93.dfd.64b469@ismtpd-555>","event":"bounce","category":"cat facts",
"sg_event_id":"6g4ZI7SA-xmRDv57GoPIPw==",
"sg_message_id":"14c5d75ce93.dfd.64b469.filter0001.16648.5515E0B88.0",
"reason":"500 unknown recipient","status":"5.0.0","type":"bounce"}]"""

#: Mailgun's "Failed (Permanent)" docs example in the user-manual envelope (brief B2),
#: signature recomputed with our key.
MAILGUN_DOCS_EVENT: dict[str, Any] = orjson.loads(
    b"""{"event":"failed","id":"pl271FzxTTmGRW8Uj3dUWw","timestamp":1529701969.818328,
"log-level":"error","severity":"permanent","reason":"suppress-bounce",
"envelope":{"sender":"john@example.org","transport":"smtp","targets":"joan@example.com"},
"flags":{"is-routed":false,"is-authenticated":true,"is-system-test":false,"is-test-mode":false},
"delivery-status":{"attempt-no":1,"message":"","code":605,
"description":"Not delivering to previously bounced address","session-seconds":0.0},
"message":{"headers":{"to":"joan@example.com",
"message-id":"20180622211249.1.2A6098970A380E12@example.org","from":"john@example.org",
"subject":"Test Subject"},"attachments":[],"size":867},
"recipient":"joan@example.com","recipient-domain":"example.com","campaigns":[],"tags":[],
"user-variables":{"batch_id":"b-123","recipient_id":"r-9"}}"""
)
MAILGUN_DOCS_TOKEN = "a8ce0edb2dd8301dee6c2405235584e45aa91d1e9f979f3de0"
MAILGUN_DOCS_BODY = orjson.dumps(
    {
        "signature": {
            "timestamp": "1529701969",
            "token": MAILGUN_DOCS_TOKEN,
            "signature": signing.sign_mailgun(MG_SIGNING_KEY, "1529701969", MAILGUN_DOCS_TOKEN),
        },
        "event-data": MAILGUN_DOCS_EVENT,
    }
)
