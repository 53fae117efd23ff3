"""Webhook signatures: SendGrid's ECDSA P-256 Signed Event Webhook, Mailgun's HMAC-SHA256, and
Amazon SNS's RSA signature (SignatureVersion 2, SHA256withRSA) with a self-signed certificate.

Pure functions over keys and bytes. The SendGrid public key is rendered the way SendGrid's
console shows it (base64 DER SubjectPublicKeyInfo, no PEM armour), so the webhook service
can be configured with exactly what it would copy from SendGrid.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import secrets
from collections.abc import Mapping

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.x509.oid import NameOID

#: Header carrying the base64 DER ECDSA signature of ``timestamp + body``.
SENDGRID_SIGNATURE_HEADER = "X-Twilio-Email-Event-Webhook-Signature"
#: Header carrying the timestamp that was signed.
SENDGRID_TIMESTAMP_HEADER = "X-Twilio-Email-Event-Webhook-Timestamp"


def generate_private_key() -> ec.EllipticCurvePrivateKey:
    """A fresh P-256 key, as SendGrid makes when the signed webhook is enabled."""
    return ec.generate_private_key(ec.SECP256R1())


def load_private_key(pem: str) -> ec.EllipticCurvePrivateKey:
    """Load a PEM P-256 private key; raise ValueError for anything else."""
    key = serialization.load_pem_private_key(pem.encode(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
        raise ValueError("the SendGrid signing key must be an ECDSA P-256 private key")
    return key


def private_key_pem(key: ec.EllipticCurvePrivateKey) -> str:
    """The PEM (PKCS#8) text of ``key``, for ``SAFEDELIVR_SANDBOX_SENDGRID_PRIVATE_KEY``."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def public_key_base64(key: ec.EllipticCurvePrivateKey) -> str:
    """The verification key as SendGrid shows it: base64 DER SubjectPublicKeyInfo."""
    der = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return base64.b64encode(der).decode()


def sendgrid_public_key(private_pem: str) -> str:
    """The base64 DER public key that verifies events signed with ``private_pem``."""
    return public_key_base64(load_private_key(private_pem))


def generate_key_pair() -> tuple[str, str]:
    """A fresh ``(private PEM, base64 DER public key)`` pair: the first for the sandbox's
    ``SAFEDELIVR_SANDBOX_SENDGRID_PRIVATE_KEY``, the second for the webhook service's
    ``SAFEDELIVR_WEBHOOKS_SENDGRID_PUBLIC_KEY``."""
    key = generate_private_key()
    return private_key_pem(key), public_key_base64(key)


def sign_sendgrid(key: ec.EllipticCurvePrivateKey, timestamp: str, body: bytes) -> str:
    """The ``X-Twilio-Email-Event-Webhook-Signature`` value for ``timestamp + body``."""
    signature = key.sign(timestamp.encode() + body, ec.ECDSA(hashes.SHA256()))
    return base64.b64encode(signature).decode()


def sign_mailgun(signing_key: str, timestamp: str, token: str) -> str:
    """Mailgun's webhook signature: hex HMAC-SHA256 of ``timestamp + token``."""
    digest = hmac.new(signing_key.encode(), (timestamp + token).encode(), hashlib.sha256)
    return digest.hexdigest()


def mailgun_signature(signing_key: str, timestamp: int) -> dict[str, str]:
    """A Mailgun ``signature`` object with a fresh random token."""
    stamp = str(timestamp)
    token = secrets.token_hex(25)
    return {
        "timestamp": stamp,
        "token": token,
        "signature": sign_mailgun(signing_key, stamp, token),
    }


#: The fields SNS signs, in order: a Notification's (``Subject`` only when present), and a
#: subscription confirmation's (https://docs.aws.amazon.com/sns/latest/dg/sns-verify-signature-of-message-verify-message-signature.html).
SNS_NOTIFICATION_FIELDS = ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type")
SNS_CONFIRMATION_FIELDS = (
    "Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type",
)  # fmt: skip


def generate_sns_key() -> rsa.RSAPrivateKey:
    """A fresh RSA-2048 key, as SNS signs with."""
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def load_sns_key(pem: str) -> rsa.RSAPrivateKey:
    """Load a PEM RSA private key; raise ValueError for anything else."""
    key = serialization.load_pem_private_key(pem.encode(), password=None)
    if not isinstance(key, rsa.RSAPrivateKey):
        raise ValueError("the SNS signing key must be an RSA private key")
    return key


def rsa_key_pem(key: rsa.RSAPrivateKey) -> str:
    """The PEM (PKCS#8) text of ``key``, for ``SAFEDELIVR_SANDBOX_SES_SIGNING_KEY``."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def sns_certificate(key: rsa.RSAPrivateKey) -> str:
    """A self-signed PEM certificate for ``key`` (the sandbox's stand-in for SNS's signing
    certificate: the webhook service pins it in development)."""
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sns.amazonaws.com")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .sign(key, hashes.SHA256())
    )
    return certificate.public_bytes(serialization.Encoding.PEM).decode()


def generate_sns_pair() -> tuple[str, str]:
    """A fresh ``(private PEM, certificate PEM)`` pair: the first for the sandbox's
    ``SAFEDELIVR_SANDBOX_SES_SIGNING_KEY``, the second for the webhook service's
    ``SAFEDELIVR_WEBHOOKS_SES_CERT_PEM``."""
    key = generate_sns_key()
    return rsa_key_pem(key), sns_certificate(key)


def sign_sns(key: rsa.RSAPrivateKey, fields: Mapping[str, str]) -> str:
    """The base64 ``Signature`` (SignatureVersion 2: SHA256withRSA) of an SNS message:
    ``Key\nValue\n`` over its signed fields, in SNS's order."""
    names = SNS_NOTIFICATION_FIELDS if fields["Type"] == "Notification" else SNS_CONFIRMATION_FIELDS
    signed = "".join(f"{name}\n{fields[name]}\n" for name in names if name in fields)
    signature = key.sign(signed.encode(), padding.PKCS1v15(), hashes.SHA256())
    return base64.b64encode(signature).decode()
