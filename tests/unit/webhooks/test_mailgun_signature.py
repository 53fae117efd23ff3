"""Mailgun's JSON webhook envelope and its HMAC-SHA256 over ``timestamp + token`` (brief A4)."""

from __future__ import annotations

import hashlib

import orjson
import pytest

from sandbox import signing
from shared.core.webhook_events import MalformedPayload
from shared.providers.mailgun_events import (
    parse_envelope,
    timestamp_fresh,
    verify_signature,
)
from tests.unit.webhooks.fixtures import (
    MAILGUN_DOCS_BODY,
    MAILGUN_DOCS_EVENT,
    MAILGUN_DOCS_TOKEN,
    MG_SIGNING_KEY,
    NOW,
    bulk_chunk,
    mailgun_body,
    mailgun_event_data,
)

SIGNATURE = signing.mailgun_signature(MG_SIGNING_KEY, NOW)


def test_sandbox_signature_verifies() -> None:
    """The sandbox's signature verifies with the same signing key."""
    assert verify_signature(
        MG_SIGNING_KEY, SIGNATURE["timestamp"], SIGNATURE["token"], SIGNATURE["signature"]
    )


def test_another_signing_key_fails() -> None:
    """A signature made with another key does not verify."""
    assert not verify_signature(
        "other-key", SIGNATURE["timestamp"], SIGNATURE["token"], SIGNATURE["signature"]
    )


def test_another_token_fails() -> None:
    """The token is signed: another token does not verify."""
    token = SIGNATURE["token"][:-1] + ("0" if SIGNATURE["token"][-1] != "0" else "1")

    assert not verify_signature(
        MG_SIGNING_KEY, SIGNATURE["timestamp"], token, SIGNATURE["signature"]
    )


def test_another_timestamp_fails() -> None:
    """The timestamp is signed: another timestamp does not verify."""
    assert not verify_signature(
        MG_SIGNING_KEY, str(NOW + 1), SIGNATURE["token"], SIGNATURE["signature"]
    )


def test_an_empty_signing_key_never_verifies() -> None:
    """An unset signing key verifies nothing, not even a signature made with it."""
    signature = signing.sign_mailgun("", "1", "t")

    assert not verify_signature("", "1", "t", signature)


@pytest.mark.parametrize("signature", ["", "zz", "é" * 64, "\ud800"])
def test_malformed_signature_fails_without_raising(signature: str) -> None:
    """Empty, short, non-hex or unencodable signatures are simply not valid."""
    assert not verify_signature(MG_SIGNING_KEY, SIGNATURE["timestamp"], "t", signature)


def test_docs_envelope_parses() -> None:
    """The docs sample's envelope yields its signature parts, event and body hash."""
    envelope = parse_envelope(MAILGUN_DOCS_BODY)

    assert (envelope.timestamp, envelope.token) == ("1529701969", MAILGUN_DOCS_TOKEN)
    assert envelope.event_data == MAILGUN_DOCS_EVENT
    assert envelope.body_hash == hashlib.sha256(MAILGUN_DOCS_BODY).digest()
    assert verify_signature(MG_SIGNING_KEY, envelope.timestamp, envelope.token, envelope.signature)


def test_a_replayed_signature_with_another_body_has_another_hash() -> None:
    """Reusing signature{} with different event-data verifies, but its body hash differs
    (what lets the receiver tell a replay from a forgery, W4)."""
    first, second = mailgun_event_data(bulk_chunk("ann@example.org"), "ann@example.org")
    genuine = parse_envelope(orjson.dumps({"signature": SIGNATURE, "event-data": first}))
    forged = parse_envelope(orjson.dumps({"signature": SIGNATURE, "event-data": second}))

    assert forged.token == genuine.token
    assert verify_signature(MG_SIGNING_KEY, forged.timestamp, forged.token, forged.signature)
    assert forged.body_hash != genuine.body_hash


def test_the_same_body_has_the_same_hash() -> None:
    """An identical redelivery has an identical body hash (a replay no-op): the SHA-256 of
    the raw bytes, whichever request object carries them."""
    body = mailgun_body(MAILGUN_DOCS_EVENT)
    first = parse_envelope(body)
    redelivery = parse_envelope(bytes(bytearray(body)))  # equal bytes, another object

    assert first.body_hash == hashlib.sha256(body).digest()
    assert redelivery.body_hash == first.body_hash


def test_integer_timestamp_is_read_as_its_digits() -> None:
    """A numeric timestamp is taken as the string that was signed."""
    signature = {**SIGNATURE, "timestamp": NOW}
    body = orjson.dumps({"signature": signature, "event-data": {}})

    assert parse_envelope(body).timestamp == str(NOW)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b"[]",
        b'{"event-data": {}}',
        orjson.dumps({"signature": SIGNATURE}),
        orjson.dumps({"signature": "x", "event-data": {}}),
        orjson.dumps({"signature": SIGNATURE, "event-data": []}),
        orjson.dumps({"signature": {**SIGNATURE, "token": 5}, "event-data": {}}),
        orjson.dumps({"signature": {**SIGNATURE, "timestamp": True}, "event-data": {}}),
        orjson.dumps({"signature": {**SIGNATURE, "timestamp": None}, "event-data": {}}),
        orjson.dumps({"signature": {**SIGNATURE, "signature": None}, "event-data": {}}),
        orjson.dumps({"signature": {**SIGNATURE, "token": ""}, "event-data": {}}),
    ],
)
def test_anything_but_an_envelope_is_malformed(body: bytes) -> None:
    """Non-JSON, non-objects, or missing/ill-typed/empty signature parts are malformed."""
    with pytest.raises(MalformedPayload):
        parse_envelope(body)


def test_a_ten_minute_old_timestamp_is_stale() -> None:
    """A correctly signed but 10-minute-old timestamp is outside a 300 s tolerance (W2)."""
    old = signing.mailgun_signature(MG_SIGNING_KEY, NOW - 600)

    assert verify_signature(MG_SIGNING_KEY, old["timestamp"], old["token"], old["signature"])
    assert not timestamp_fresh(old["timestamp"], now=NOW, tolerance=300)
    assert timestamp_fresh(SIGNATURE["timestamp"], now=NOW, tolerance=300)
