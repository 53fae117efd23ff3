"""Signing the events we push to users' webhook endpoints, per the Standard Webhooks
specification (https://www.standardwebhooks.com/, version 1.0.0).

Each delivery carries ``webhook-id`` (the message id, the same on every retry so that the
receiver can de-duplicate), ``webhook-timestamp`` (Unix seconds of this attempt) and
``webhook-signature``: space-separated ``v1,<base64 HMAC-SHA256>`` entries over
``<id>.<timestamp>.<raw body>``, one per secret in force. A secret is ``whsec_`` and the
base64 of its key bytes. Rotating one keeps the old secret valid beside the new one for a
while: both sign, so a receiver that knows either accepts the delivery.

Pure functions; verifying is here too, for the sandbox's receiver and for users' tests.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Mapping, Sequence
from typing import Final

PREFIX: Final = "whsec_"
#: Key bytes of a new secret (the spec asks for 24 to 64).
KEY_BYTES: Final = 32
#: Seconds a timestamp may be away from the verifier's clock (the spec's five minutes).
TOLERANCE: Final = 300


class SecretError(ValueError):
    """Not a ``whsec_`` secret."""


def new_secret() -> str:
    return PREFIX + base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode()


def key_of(secret: str) -> bytes:
    """The HMAC key of a ``whsec_`` secret."""
    if not secret.startswith(PREFIX):
        raise SecretError("a signing secret starts with whsec_")
    try:
        key = base64.b64decode(secret[len(PREFIX) :], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise SecretError("a signing secret is whsec_ and base64") from exc
    if not 24 <= len(key) <= 64:
        raise SecretError("a signing secret's key has 24 to 64 bytes")
    return key


def signature(msg_id: str, timestamp: int, body: bytes, secret: str) -> str:
    """One ``v1,<base64>`` entry."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(key_of(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers(
    msg_id: str, timestamp: int, body: bytes, secrets_in_force: Sequence[str]
) -> dict[str, str]:
    """The three headers of a delivery signed with every secret in force (newest first)."""
    if not secrets_in_force:
        raise SecretError("an endpoint has at least one secret")
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(
            signature(msg_id, timestamp, body, s) for s in secrets_in_force
        ),
    }


def verify(
    received: Mapping[str, str],
    body: bytes,
    secret: str,
    *,
    now: float,
    tolerance: float = TOLERANCE,
) -> str | None:
    """Why a delivery is not authentic for ``secret`` (None when it is). ``received`` are
    its headers, names in lower case."""
    msg_id = received.get("webhook-id")
    stamp = received.get("webhook-timestamp")
    signatures = received.get("webhook-signature")
    if not msg_id or not stamp or not signatures:
        return "missing webhook-id, webhook-timestamp or webhook-signature"
    if not stamp.isascii() or not stamp.isdecimal():
        return "webhook-timestamp is not Unix seconds"
    if abs(now - int(stamp)) > tolerance:
        return "webhook-timestamp is too far from now (a replay?)"
    expected = signature(msg_id, int(stamp), body, secret)
    offered = signatures.split(" ")
    if any(hmac.compare_digest(expected, entry) for entry in offered):
        return None
    return "no signature matches"
