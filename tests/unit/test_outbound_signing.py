"""Standard Webhooks signing of the events we push (``shared.outbound.outbound_signing``)."""

from __future__ import annotations

import base64

import pytest

from shared.outbound.outbound_signing import (
    PREFIX,
    SecretError,
    headers,
    key_of,
    new_secret,
    signature,
    verify,
)

#: The specification's own example (standard-webhooks spec, "Signature scheme").
SPEC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SPEC_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SPEC_TS = 1614265330
SPEC_BODY = b'{"test": 2432232314}'
SPEC_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
NOW = SPEC_TS + 10


def test_the_signature_is_the_specifications_example() -> None:
    assert signature(SPEC_ID, SPEC_TS, SPEC_BODY, SPEC_SECRET) == SPEC_SIGNATURE


def test_a_new_secret_is_whsec_and_32_random_bytes() -> None:
    first, second = new_secret(), new_secret()

    assert first.startswith(PREFIX) and first != second
    assert len(key_of(first)) == 32


@pytest.mark.parametrize(
    "bad",
    [
        "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "whsec_%%%",
        "whsec_" + base64.b64encode(b"short").decode(),
    ],
)
def test_a_malformed_secret_is_refused(bad: str) -> None:
    with pytest.raises(SecretError):
        key_of(bad)


def test_while_a_secret_rotates_both_sign_and_either_verifies() -> None:
    old, new = new_secret(), new_secret()
    sent = headers("msg_1", SPEC_TS, SPEC_BODY, [new, old])

    assert len(sent["webhook-signature"].split(" ")) == 2
    assert verify(sent, SPEC_BODY, old, now=NOW) is None
    assert verify(sent, SPEC_BODY, new, now=NOW) is None


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"webhook-id": "msg_2"}, "no signature matches"),
        ({"webhook-timestamp": str(SPEC_TS + 1)}, "no signature matches"),
        ({"webhook-timestamp": str(NOW - 301)}, "too far from now"),
        ({"webhook-timestamp": "soon"}, "not Unix seconds"),
        ({"webhook-signature": ""}, "missing"),
    ],
)
def test_a_changed_or_stale_delivery_does_not_verify(change: dict[str, str], why: str) -> None:
    sent = {**headers(SPEC_ID, SPEC_TS, SPEC_BODY, [SPEC_SECRET]), **change}

    assert why in (verify(sent, SPEC_BODY, SPEC_SECRET, now=NOW) or "")


def test_a_changed_body_does_not_verify() -> None:
    sent = headers(SPEC_ID, SPEC_TS, SPEC_BODY, [SPEC_SECRET])

    assert verify(sent, SPEC_BODY + b" ", SPEC_SECRET, now=NOW) == "no signature matches"
