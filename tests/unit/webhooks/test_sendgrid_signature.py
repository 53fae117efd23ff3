"""SendGrid's Signed Event Webhook: ECDSA P-256 over ``timestamp + raw body`` (brief A4 W1/W2)."""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from sandbox import signing
from shared.providers.sendgrid_events import (
    load_public_key,
    timestamp_fresh,
    verify_signature,
    verify_signature_with_key,
)
from tests.unit.webhooks.fixtures import (
    NOW,
    OTHER_PRIVATE,
    SG_PRIVATE,
    SG_PUBLIC,
    bulk_chunk,
    sendgrid_body,
    sign_sendgrid,
)

BODY = sendgrid_body(bulk_chunk("ann@example.org", "bounce@example.org"))
STAMP = str(NOW)


def test_a_correctly_signed_body_verifies() -> None:
    """The sandbox's signature over the body it posts verifies with its public key."""
    assert verify_signature(SG_PUBLIC, sign_sendgrid(BODY), STAMP, BODY)


def test_one_byte_changed_in_the_body_fails() -> None:
    """Changing a single byte of the body breaks the signature."""
    tampered = BODY.replace(b"bounce@", b"bounde@", 1)
    assert tampered != BODY

    assert not verify_signature(SG_PUBLIC, sign_sendgrid(BODY), STAMP, tampered)


def test_reserialised_json_fails() -> None:
    """The signature covers the raw bytes: the same JSON re-serialised does not verify."""
    assert not verify_signature(SG_PUBLIC, sign_sendgrid(BODY), STAMP, BODY + b"\n")


def test_another_timestamp_fails() -> None:
    """The timestamp is signed: replacing it breaks the signature."""
    assert not verify_signature(SG_PUBLIC, sign_sendgrid(BODY), str(NOW + 1), BODY)


def test_signed_with_another_key_fails() -> None:
    """A body signed with another private key does not verify."""
    signature = sign_sendgrid(BODY, key=OTHER_PRIVATE)

    assert not verify_signature(SG_PUBLIC, signature, STAMP, BODY)


@pytest.mark.parametrize(
    "signature",
    ["", "not base64!", "AAAA====", base64.b64encode(b"not a DER signature").decode()],
)
def test_malformed_signature_fails_without_raising(signature: str) -> None:
    """A missing, non-base64 or non-DER signature is simply not valid."""
    assert not verify_signature(SG_PUBLIC, signature, STAMP, BODY)


@pytest.mark.parametrize("public_key", ["", "%%%", base64.b64encode(b"junk").decode()])
def test_malformed_public_key_fails_without_raising(public_key: str) -> None:
    """verify_signature answers False, never raises, when the key itself is bad."""
    assert not verify_signature(public_key, sign_sendgrid(BODY), STAMP, BODY)


def test_unencodable_timestamp_fails_without_raising() -> None:
    """A timestamp that cannot be encoded is not valid (and raises nothing)."""
    assert not verify_signature(SG_PUBLIC, sign_sendgrid(BODY), "\ud800", BODY)


def test_the_loaded_key_verifies_like_the_text() -> None:
    """The variant taking a loaded key gives the same answers."""
    key = load_public_key(SG_PUBLIC)

    assert verify_signature_with_key(key, sign_sendgrid(BODY), STAMP, BODY)
    assert not verify_signature_with_key(key, sign_sendgrid(BODY), STAMP, BODY[:-1])


def test_load_public_key_accepts_wrapped_base64() -> None:
    """Line breaks and spaces pasted into the key are ignored."""
    wrapped = "\n".join(SG_PUBLIC[i : i + 64] for i in range(0, len(SG_PUBLIC), 64)) + "\n"

    assert load_public_key(wrapped).public_numbers() == SG_PRIVATE.public_key().public_numbers()


def test_load_public_key_accepts_pem() -> None:
    """A PEM-armoured key works too."""
    pem = SG_PRIVATE.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )

    assert load_public_key(pem.decode()).public_numbers() == (
        SG_PRIVATE.public_key().public_numbers()
    )


@pytest.mark.parametrize("value", ["", "not base64!", base64.b64encode(b"junk").decode()])
def test_load_public_key_rejects_garbage(value: str) -> None:
    """A value that is no DER public key raises ValueError (for config validation)."""
    with pytest.raises(ValueError, match="not a base64 DER public key"):
        load_public_key(value)


def test_load_public_key_rejects_other_curves() -> None:
    """An ECDSA key on another curve than P-256 is refused."""
    p384 = ec.generate_private_key(ec.SECP384R1()).public_key()
    der = p384.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )

    with pytest.raises(ValueError, match="P-256"):
        load_public_key(base64.b64encode(der).decode())


def test_load_public_key_rejects_other_algorithms() -> None:
    """A non-ECDSA public key is refused."""
    der = (
        ed25519.Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    )

    with pytest.raises(ValueError, match="P-256"):
        load_public_key(base64.b64encode(der).decode())


def test_sandbox_key_pair_round_trips() -> None:
    """The key pair the sandbox generates for make run verifies its own signatures."""
    private_pem, public_b64 = signing.generate_key_pair()
    signature = signing.sign_sendgrid(signing.load_private_key(private_pem), STAMP, BODY)

    assert verify_signature(public_b64, signature, STAMP, BODY)


def test_a_ten_minute_old_timestamp_is_stale() -> None:
    """A correctly signed but 10-minute-old timestamp is outside a 300 s tolerance (W2)."""
    old = str(NOW - 600)

    assert verify_signature(SG_PUBLIC, sign_sendgrid(BODY, old), old, BODY)
    assert not timestamp_fresh(old, now=NOW, tolerance=300)
    assert timestamp_fresh(STAMP, now=NOW, tolerance=300)
