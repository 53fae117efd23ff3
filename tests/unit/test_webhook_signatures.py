"""Webhook signature checks under attack: SendGrid's ECDSA P-256 over ``timestamp + raw body``
(``shared.providers.sendgrid_events``), Mailgun's HMAC-SHA256 over ``timestamp + token``
(``shared.providers.mailgun_events``), and the receivers that apply them
(``services.webhooks.receivers``) over the in-memory world.

Covered here: signatures in the wrong encoding or form, truncated or padded, over another
message or with another hash, replays under a refreshed or skewed timestamp, missing headers,
the Basic-auth-only configuration, and refused deliveries leaving no trace (not even a used
Mailgun token).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
import uuid
from collections.abc import AsyncIterator, Callable

import httpx
import orjson
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from sandbox import signing
from services.webhooks import receivers
from shared.core.webhook_events import timestamp_fresh
from shared.delivery.batchstore import NewBatch
from shared.delivery.recipients import log_id_for
from shared.infra.config import WebhookSettings
from shared.providers import mailgun_events, sendgrid_events
from tests.fakes.world import World

KEY = signing.generate_private_key()
PUBLIC = sendgrid_events.load_public_key(signing.public_key_base64(KEY))
MG_KEY = "signature-tests-mailgun-key"
TOLERANCE = 300
A = "ann@example.org"
BODY = b'[{"email":"ann@example.org","event":"delivered","sg_event_id":"x1"}]'
STAMP = "1709294460"


def der_signature(body: bytes = BODY, stamp: str = STAMP) -> bytes:
    return base64.b64decode(signing.sign_sendgrid(KEY, stamp, body))


def sg_verifies(signature: str | bytes, body: bytes = BODY, stamp: str = STAMP) -> bool:
    if isinstance(signature, bytes):
        signature = base64.b64encode(signature).decode()
    return sendgrid_events.verify_signature_with_key(PUBLIC, signature, stamp, body)


# -- SendGrid: the signature itself -----------------------------------------------------------


@settings(max_examples=60, deadline=None, database=None)
@given(st.binary(max_size=200).filter(lambda b: b != BODY))
def test_a_sendgrid_signature_verifies_no_other_body(other: bytes) -> None:
    """A signature is bound to the exact bytes it was made over."""
    signature = der_signature()

    assert sg_verifies(signature)
    assert not sg_verifies(signature, body=other)


def test_a_raw_r_s_signature_is_not_accepted_for_der() -> None:
    """SendGrid sends DER; the same signature as raw 64-byte r||s (P1363) is refused."""
    r, s = decode_dss_signature(der_signature())
    raw = r.to_bytes(32, "big") + s.to_bytes(32, "big")

    assert not sg_verifies(raw)


@pytest.mark.parametrize(
    "mangle",
    [
        lambda der: der[:-1],
        lambda der: der[: len(der) // 2],
        lambda der: der[:8],
        lambda der: der + b"\x00",
        lambda der: b"\x00" + der,
    ],
    ids=["last-byte-cut", "halved", "header-only", "trailing-byte", "leading-byte"],
)
def test_a_truncated_or_padded_der_signature_is_refused(mangle: Callable[[bytes], bytes]) -> None:
    """DER is parsed strictly: a byte missing or extra anywhere voids the signature."""
    assert not sg_verifies(mangle(der_signature()))


@pytest.mark.parametrize("cut", [1, 4, 20])
def test_truncated_base64_text_is_refused(cut: int) -> None:
    """The header value cut short (valid base64 or not) is not a signature."""
    text = base64.b64encode(der_signature()).decode()

    assert not sg_verifies(text[:-cut])


def test_the_url_safe_base64_alphabet_is_not_accepted() -> None:
    """Only standard base64 is read: '-' and '_' are not characters of the alphabet."""
    text = ""
    while not {"+", "/"} & set(text):  # ECDSA signatures are random: find one that differs
        text = signing.sign_sendgrid(KEY, STAMP, BODY)
    urlsafe = text.replace("+", "-").replace("/", "_")

    assert sg_verifies(text)
    assert not sg_verifies(urlsafe)


@pytest.mark.parametrize(
    "message",
    [BODY + STAMP.encode(), BODY, STAMP.encode(), (STAMP + " ").encode() + BODY],
    ids=["body-then-timestamp", "body-only", "timestamp-only", "separator"],
)
def test_a_signature_over_another_message_is_refused(message: bytes) -> None:
    """Only ``timestamp + body``, concatenated in that order with nothing between, is signed."""
    signature = KEY.sign(message, ec.ECDSA(hashes.SHA256()))

    assert not sg_verifies(signature)


def test_a_signature_with_another_hash_is_refused() -> None:
    """ECDSA with SHA-384 over the right message is not SendGrid's SHA-256 signature."""
    signature = KEY.sign(STAMP.encode() + BODY, ec.ECDSA(hashes.SHA384()))

    assert not sg_verifies(signature)


def test_a_signature_from_a_key_on_another_curve_is_refused() -> None:
    """A P-384 key's signature over the right message does not verify with ours."""
    other = ec.generate_private_key(ec.SECP384R1())

    assert not sg_verifies(other.sign(STAMP.encode() + BODY, ec.ECDSA(hashes.SHA256())))


def other_digits(zero: int) -> str:
    """``STAMP`` in another script's decimal digits (``zero`` is its digit zero)."""
    return "".join(chr(zero + int(d)) for d in STAMP)


@pytest.mark.parametrize(
    "stamp",
    [
        other_digits(0xFF10),
        other_digits(0x0660),
        "+1709294460",
        "1_709_294_460",
        "1.70929446e9",
        "0x65e1c37c",
    ],
    ids=["fullwidth", "arabic-indic", "plus-sign", "underscores", "exponent", "hex"],
)
def test_only_plain_ascii_digits_are_a_fresh_timestamp(stamp: str) -> None:
    """Other spellings of the same instant are not fresh: int() would accept several."""
    assert not timestamp_fresh(stamp, now=1_709_294_460, tolerance=TOLERANCE)


# -- Mailgun: the HMAC ------------------------------------------------------------------------


def mg_hex(message: bytes, digest: str = "sha256", key: str = MG_KEY) -> str:
    return hmac.new(key.encode(), message, digest).hexdigest()


@pytest.mark.parametrize(
    "signature",
    [
        lambda ts, tok: mg_hex((tok + ts).encode()),
        lambda ts, tok: mg_hex((ts + tok).encode(), "sha1"),
        lambda ts, tok: mg_hex((ts + tok).encode(), "sha512"),
        lambda ts, tok: hashlib.sha256((MG_KEY + ts + tok).encode()).hexdigest(),
        lambda ts, tok: mg_hex((ts + tok).encode())[:-1],
        lambda ts, tok: mg_hex((ts + tok).encode())[:32],
        lambda ts, tok: mg_hex((ts + tok).encode()) + "0",
        lambda ts, tok: base64.b64encode(
            hmac.digest(MG_KEY.encode(), (ts + tok).encode(), "sha256")
        ).decode(),
    ],
    ids=[
        "token-then-timestamp",
        "sha1",
        "sha512",
        "plain-hash-with-key",
        "last-digit-cut",
        "half",
        "extra-digit",
        "base64-not-hex",
    ],
)
def test_a_mailgun_signature_in_any_other_form_is_refused(
    signature: Callable[[str, str], str],
) -> None:
    """Only the full hex HMAC-SHA256 of ``timestamp + token`` verifies."""
    stamp, token = "1709294460", uuid.uuid4().hex

    assert mailgun_events.verify_signature(MG_KEY, stamp, token, mg_hex((stamp + token).encode()))
    assert not mailgun_events.verify_signature(MG_KEY, stamp, token, signature(stamp, token))


def test_shifting_digits_from_timestamp_to_token_keeps_the_hmac() -> None:
    """The HMAC covers only the concatenation, so moving the boundary keeps it valid: the
    timestamp's freshness is what stops this (see the receiver test below)."""
    stamp, token = "1709294460", "7" + uuid.uuid4().hex
    signature = mg_hex((stamp + token).encode())
    shifted_stamp, shifted_token = stamp + token[0], token[1:]

    assert mailgun_events.verify_signature(MG_KEY, shifted_stamp, shifted_token, signature)
    assert not timestamp_fresh(shifted_stamp, now=1_709_294_460, tolerance=TOLERANCE)


# -- the receivers ----------------------------------------------------------------------------


def webhook_settings(**overrides: object) -> WebhookSettings:
    values: dict[str, object] = {
        "sendgrid_public_key": signing.public_key_base64(KEY),
        "mailgun_signing_key": SecretStr(MG_KEY),
        "timestamp_tolerance": TOLERANCE,
    }
    values.update(overrides)
    return WebhookSettings(**values)  # type: ignore[arg-type]


@pytest.fixture
def world() -> World:
    return World(webhooks=webhook_settings())


@pytest.fixture
async def client(world: World) -> AsyncIterator[httpx.AsyncClient]:
    async with world.webhooks() as c:
        yield c


def sg_body(batch: NewBatch) -> bytes:
    return orjson.dumps(
        [
            {
                "email": A,
                "timestamp": int(time.time()),
                "event": "delivered",
                "sg_event_id": uuid.uuid4().hex,
                "batch_id": str(batch.batch_id),
                "log_id": str(log_id_for(batch.batch_id, A)),
                "chunk": "0",
            }
        ]
    )


def mg_body(batch: NewBatch, signature: dict[str, object]) -> bytes:
    event = {
        "event": "delivered",
        "id": uuid.uuid4().hex,
        "timestamp": time.time(),
        "recipient": A,
        "user-variables": {
            "batch_id": str(batch.batch_id),
            "log_id": str(log_id_for(batch.batch_id, A)),
            "chunk": "0",
        },
    }
    return orjson.dumps({"signature": signature, "event-data": event})


def mg_signature(stamp: str, token: str | None = None) -> dict[str, object]:
    token = token or uuid.uuid4().hex
    return {"timestamp": stamp, "token": token, "signature": mg_hex((stamp + token).encode())}


def truncated(signature: dict[str, object]) -> dict[str, object]:
    return {**signature, "signature": str(signature["signature"])[:-2]}


def now() -> int:
    return int(time.time())


SG_HEADERS: dict[str, Callable[[bytes], dict[str, str]]] = {
    "signature-only": lambda body: {
        receivers.SG_SIGNATURE: signing.sign_sendgrid(KEY, str(now()), body)
    },
    "timestamp-only": lambda body: {receivers.SG_TIMESTAMP: str(now())},
    "empty-signature": lambda body: {
        receivers.SG_TIMESTAMP: str(now()),
        receivers.SG_SIGNATURE: "",
    },
    "empty-timestamp": lambda body: {
        receivers.SG_TIMESTAMP: "",
        receivers.SG_SIGNATURE: signing.sign_sendgrid(KEY, "", body),
    },
    "not-base64": lambda body: {
        receivers.SG_TIMESTAMP: str(now()),
        receivers.SG_SIGNATURE: "not*base64",
    },
    "truncated": lambda body: {
        receivers.SG_TIMESTAMP: str(now()),
        receivers.SG_SIGNATURE: signing.sign_sendgrid(KEY, str(now()), body)[:-8],
    },
    "old-signature-fresh-timestamp": lambda body: {
        receivers.SG_TIMESTAMP: str(now()),
        receivers.SG_SIGNATURE: signing.sign_sendgrid(KEY, str(now() - 3600), body),
    },
    "signed-too-far-ahead": lambda body: {
        receivers.SG_TIMESTAMP: str(now() + TOLERANCE + 60),
        receivers.SG_SIGNATURE: signing.sign_sendgrid(KEY, str(now() + TOLERANCE + 60), body),
    },
}


@pytest.mark.parametrize("headers", SG_HEADERS.values(), ids=SG_HEADERS.keys())
async def test_a_sendgrid_delivery_without_a_valid_fresh_signature_is_401(
    world: World, client: httpx.AsyncClient, headers: Callable[[bytes], dict[str, str]]
) -> None:
    """Missing, empty, garbled, truncated, re-dated or future signatures: 401, nothing
    applied."""
    batch = await world.sent(A)
    body = sg_body(batch)

    response = await client.post("/webhooks/sendgrid", content=body, headers=headers(body))

    assert (response.status_code, response.json()["error"]["code"]) == (401, "bad_signature")
    assert await world.states(batch) == {A: "queued"}


async def test_a_sendgrid_signature_slightly_ahead_of_our_clock_is_accepted(
    world: World, client: httpx.AsyncClient
) -> None:
    """Clock skew within the tolerance, either way, is not a replay."""
    batch = await world.sent(A)
    body = sg_body(batch)
    stamp = str(now() + TOLERANCE - 30)
    headers = {
        receivers.SG_TIMESTAMP: stamp,
        receivers.SG_SIGNATURE: signing.sign_sendgrid(KEY, stamp, body),
    }

    response = await client.post("/webhooks/sendgrid", content=body, headers=headers)

    assert response.status_code == 200, response.text
    assert await world.states(batch) == {A: "success"}


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer s3cret", "Basic " + base64.b64encode(b"hooks:guess").decode(), "Basic !!!"],
    ids=["missing", "bearer", "wrong-password", "not-base64"],
)
async def test_basic_auth_alone_refuses_anything_but_the_right_credentials(
    authorization: str | None,
) -> None:
    """Explicitly allowed to take Basic auth alone (development only), the credentials are
    the only guard."""
    w = World(
        webhooks=webhook_settings(
            sendgrid_public_key=None,
            sendgrid_basic_user="hooks",
            sendgrid_basic_password=SecretStr("s3cret"),
            sendgrid_insecure_basic_only=True,
        )
    )
    batch = await w.sent(A)
    headers = {} if authorization is None else {"Authorization": authorization}
    async with w.webhooks() as client:
        refused = await client.post("/webhooks/sendgrid", content=sg_body(batch), headers=headers)
        assert await w.states(batch) == {A: "queued"}
        accepted = await client.post(
            "/webhooks/sendgrid", content=sg_body(batch), auth=("hooks", "s3cret")
        )

    assert (refused.status_code, accepted.status_code) == (401, 200)
    assert await w.states(batch) == {A: "success"}


async def test_a_basic_user_without_a_password_does_not_open_the_endpoint() -> None:
    """A half-configured Basic auth (user, no password, no key) must not fail open."""
    w = World(webhooks=webhook_settings(sendgrid_public_key=None, sendgrid_basic_user="hooks"))
    batch = await w.sent(A)
    async with w.webhooks() as client:
        response = await client.post("/webhooks/sendgrid", content=sg_body(batch))

    assert response.status_code in (401, 503)
    assert await w.states(batch) == {A: "queued"}


MG_SIGNATURES: dict[str, Callable[[str], dict[str, object]]] = {
    "not-hex": lambda token: {**mg_signature(str(now()), token), "signature": "z" * 64},
    "truncated": lambda token: truncated(mg_signature(str(now()), token)),
    "digits-shifted": lambda token: {
        **mg_signature(str(now()), "7" + token),
        "timestamp": str(now()) + "7",
        "token": token,
    },
    "too-far-ahead": lambda token: mg_signature(str(now() + TOLERANCE + 60), token),
    "words": lambda token: mg_signature("soon", token),
    "exponent": lambda token: mg_signature(f"{now() / 1e9}e9", token),
}


@pytest.mark.parametrize("signature", MG_SIGNATURES.values(), ids=MG_SIGNATURES.keys())
async def test_a_refused_mailgun_delivery_leaves_its_token_unused(
    world: World, client: httpx.AsyncClient, signature: Callable[[str], dict[str, object]]
) -> None:
    """A bad, shifted, future or non-numeric signature is a 401 that records nothing, so
    the genuine delivery with that token is still accepted afterwards."""
    batch = await world.sent(A)
    token = uuid.uuid4().hex

    refused = await client.post("/webhooks/mailgun", content=mg_body(batch, signature(token)))

    assert (refused.status_code, refused.json()["error"]["code"]) == (401, "bad_signature")
    assert await world.states(batch) == {A: "queued"}
    genuine = await client.post(
        "/webhooks/mailgun", content=mg_body(batch, mg_signature(str(now()), token))
    )
    assert (genuine.status_code, genuine.json()["applied"]) == (200, 1)
