"""Control endpoints, the app factory and the signing helpers."""

from __future__ import annotations

from dataclasses import replace

import pytest
from pydantic import SecretStr

from sandbox import signing
from sandbox.app import create_app
from shared.core.errors import ConfigError
from tests.unit.sandbox.conftest import (
    FAST,
    SENDGRID_AUTH,
    Harness,
    running,
    sandbox_settings,
    sendgrid_mail,
)
from tests.unit.sandbox.receiver import verify_mailgun, verify_sendgrid

SEND = "/sendgrid/v3/mail/send"


async def test_healthz(sandbox: Harness) -> None:
    """``GET /healthz`` answers ok."""
    response = await sandbox.client.get("/healthz")

    assert response.json() == {"status": "ok"}


async def test_sends_can_be_filtered_and_reset(sandbox: Harness) -> None:
    """``?email=`` narrows the counts, and ``DELETE`` resets them."""
    await sandbox.client.post(SEND, json=sendgrid_mail("a@x.com", "b@x.com"), headers=SENDGRID_AUTH)

    one = (await sandbox.client.get("/_control/sends", params={"email": "A@x.com"})).json()
    reset = await sandbox.client.delete("/_control/sends")
    after = (await sandbox.client.get("/_control/sends")).json()

    assert one["sendgrid"]["by_recipient"] == {"a@x.com": 1}
    assert reset.status_code == 204
    assert after["sendgrid"] == {
        "requests": 0,
        "recipients": 0,
        "untracked_recipients": 0,
        "by_recipient": {},
        "recent": [],
    }


async def test_recent_requests_are_bounded() -> None:
    """Only the last ``recent_requests`` accepted requests are kept."""
    async with running(tuning=replace(FAST, recent_requests=2)) as sandbox:
        for name in ("a", "b", "c"):
            await sandbox.client.post(
                SEND, json=sendgrid_mail(f"{name}@x.com"), headers=SENDGRID_AUTH
            )

        recent = (await sandbox.client.get("/_control/sends")).json()["sendgrid"]["recent"]

    assert [r["request"]["personalizations"][0]["to"][0]["email"] for r in recent] == [
        "b@x.com",
        "c@x.com",
    ]


async def test_tracked_recipients_are_bounded() -> None:
    """Beyond ``max_tracked_recipients`` addresses only the totals grow."""
    async with running(tuning=replace(FAST, max_tracked_recipients=1)) as sandbox:
        await sandbox.client.post(
            SEND, json=sendgrid_mail("a@x.com", "b@x.com"), headers=SENDGRID_AUTH
        )

        sends = (await sandbox.client.get("/_control/sends")).json()["sendgrid"]

    assert (sends["by_recipient"], sends["untracked_recipients"], sends["recipients"]) == (
        {"a@x.com": 1},
        1,
        2,
    )


async def test_configured_key_is_used_and_published() -> None:
    """A configured PEM key signs the events; its public key is what the control API shows."""
    private = signing.private_key_pem(signing.generate_private_key())
    settings = sandbox_settings(sendgrid_private_key=SecretStr(private))

    async with running(settings) as sandbox:
        shown = (await sandbox.client.get("/_control/sendgrid/public-key")).json()["public_key"]
        await sandbox.client.post(SEND, json=sendgrid_mail("a@x.com"), headers=SENDGRID_AUTH)
        await sandbox.settle()

    assert shown == signing.sendgrid_public_key(private)
    assert len(sandbox.receiver.sendgrid) == 2


def test_invalid_private_key_names_the_variable() -> None:
    """A key that is not a P-256 PEM is a ConfigError naming the environment variable."""
    settings = sandbox_settings(sendgrid_private_key=SecretStr("not a key"))

    with pytest.raises(ConfigError, match="SAFEDELIVR_SANDBOX_SENDGRID_PRIVATE_KEY"):
        create_app(settings)


def test_signatures_verify_and_detect_tampering() -> None:
    """ECDSA and HMAC signatures verify for the signed bytes only."""
    key = signing.generate_private_key()
    public = signing.public_key_base64(key)
    signature = signing.sign_sendgrid(key, "1700000000", b"[]")
    mailgun = signing.mailgun_signature("k", 1_700_000_000)

    assert verify_sendgrid(public, "1700000000", b"[]", signature)
    assert not verify_sendgrid(public, "1700000001", b"[]", signature)
    assert verify_mailgun("k", mailgun)
    assert not verify_mailgun("other", mailgun)


def test_mailgun_tokens_are_fresh() -> None:
    """Each Mailgun signature has its own random token."""
    tokens = {signing.mailgun_signature("k", 1)["token"] for _ in range(10)}

    assert len(tokens) == 10


async def test_each_address_shows_what_it_was_sent_newest_first(sandbox: Harness) -> None:
    for subject in ("first", "second"):
        mail = sendgrid_mail("Ann@example.org", subject=subject)
        assert (
            await sandbox.client.post(SEND, json=mail, headers=SENDGRID_AUTH)
        ).status_code == 202

    shown = (
        await sandbox.client.get("/_control/messages", params={"to": "ann@example.org"})
    ).json()
    missing = await sandbox.client.get("/_control/messages")

    assert [m["subject"] for m in shown] == ["second", "first"]
    assert shown[0]["provider"] == "sendgrid"
    assert missing.status_code == 400
