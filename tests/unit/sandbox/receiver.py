"""A tiny webhook service for the tests: verifies signatures the way the providers specify."""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass, field
from typing import Any

import orjson
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


def verify_sendgrid(public_key_b64: str, timestamp: str, body: bytes, signature: str) -> bool:
    """SendGrid's check: ECDSA P-256/SHA-256 over ``timestamp + body`` with the DER key."""
    key = serialization.load_der_public_key(base64.b64decode(public_key_b64))
    assert isinstance(key, ec.EllipticCurvePublicKey)
    try:
        key.verify(
            base64.b64decode(signature), timestamp.encode() + body, ec.ECDSA(hashes.SHA256())
        )
    except InvalidSignature:
        return False
    return True


def verify_mailgun(signing_key: str, signature: dict[str, str]) -> bool:
    """Mailgun's check: hex HMAC-SHA256 of ``timestamp + token``."""
    expected = hmac.new(
        signing_key.encode(),
        (signature["timestamp"] + signature["token"]).encode(),
        hashlib.sha256,
    ).hexdigest()
    return hmac.compare_digest(expected, signature["signature"])


@dataclass
class Receiver:
    """Collects verified events; answers ``script`` statuses first, then 200."""

    mailgun_signing_key: str
    sendgrid_public_key: str = ""
    sendgrid: list[dict[str, Any]] = field(default_factory=list)
    mailgun: list[dict[str, Any]] = field(default_factory=list)
    raw_sendgrid: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    bad_signatures: int = 0
    script: list[int] = field(default_factory=list)
    answered: list[int] = field(default_factory=list)

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/webhooks/sendgrid", self._sendgrid, methods=["POST"]),
                Route("/webhooks/mailgun", self._mailgun, methods=["POST"]),
            ]
        )

    def events_for(self, email: str) -> list[str]:
        """The SendGrid ``event`` values received for ``email``, in order."""
        return [e["event"] for e in self.sendgrid if e["email"] == email]

    def mailgun_for(self, recipient: str) -> list[dict[str, Any]]:
        return [e for e in self.mailgun if e["recipient"] == recipient]

    def _answer(self) -> int | None:
        status = self.script.pop(0) if self.script else None
        if status is not None:
            self.answered.append(status)
        return status

    async def _sendgrid(self, request: Request) -> Response:
        scripted = self._answer()
        if scripted is not None:
            return Response(status_code=scripted)
        body = await request.body()
        ok = verify_sendgrid(
            self.sendgrid_public_key,
            request.headers["X-Twilio-Email-Event-Webhook-Timestamp"],
            body,
            request.headers["X-Twilio-Email-Event-Webhook-Signature"],
        )
        if not ok:
            self.bad_signatures += 1
            return Response(status_code=401)
        self.raw_sendgrid.append((dict(request.headers), body))
        self.sendgrid.extend(orjson.loads(body))
        return Response(status_code=200)

    async def _mailgun(self, request: Request) -> Response:
        scripted = self._answer()
        if scripted is not None:
            return Response(status_code=scripted)
        document = orjson.loads(await request.body())
        if not verify_mailgun(self.mailgun_signing_key, document["signature"]):
            self.bad_signatures += 1
            return Response(status_code=406)
        self.mailgun.append(document["event-data"])
        return Response(status_code=200)
