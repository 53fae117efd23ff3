"""The sandbox's SMTP relay (``sandbox.relay``) over a real socket, driven by aiosmtplib."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiosmtplib
import pytest

from shared.infra.config import SandboxSettings
from tests.unit.sandbox.conftest import Harness

#: The relay's default user and password.
USER = SandboxSettings().smtp_user
PASSWORD = SandboxSettings().smtp_password.get_secret_value()
MESSAGE = b"From: a@example.com\r\nTo: ann@example.org\r\nSubject: Hi\r\n\r\nHello\r\n"


@asynccontextmanager
async def client(sandbox: Harness, password: str = PASSWORD) -> AsyncIterator[aiosmtplib.SMTP]:
    port = (await sandbox.client.get("/_control/smtp")).json()["port"]
    smtp = aiosmtplib.SMTP(hostname="127.0.0.1", port=port, use_tls=False, start_tls=False)
    await smtp.connect()
    try:
        if password:
            await smtp.login(USER, password)
        yield smtp
    finally:
        if smtp.is_connected:
            await smtp.quit()


async def fault(sandbox: Harness, **fields: Any) -> None:
    answer = await sandbox.client.post("/_control/faults", json={"provider": "smtp", **fields})
    assert answer.status_code == 201, answer.text


async def accepted(sandbox: Harness, address: str) -> int:
    sends = (await sandbox.client.get("/_control/sends")).json()
    count: int = sends["smtp"]["by_recipient"].get(address, 0)
    return count


async def test_accepted_transaction_is_recorded(sandbox: Harness) -> None:
    """A transaction the relay accepts is counted by recipient, with its headers kept."""
    async with client(sandbox) as smtp:
        await smtp.mail("a@example.com")
        await smtp.rcpt("ann@example.org")
        code, _ = await smtp.data(MESSAGE)

    assert code == 250
    assert await accepted(sandbox, "ann@example.org") == 1
    recent = (await sandbox.client.get("/_control/sends")).json()["smtp"]["recent"]
    assert recent[-1]["request"]["headers"]["Subject"] == "Hi"


@pytest.mark.parametrize(
    ("address", "code", "status"),
    [("rcpt4xx.a@example.org", 451, "4.2.1"), ("rcpt5xx.b@example.org", 550, "5.1.1")],
)
async def test_recipient_prefix_gets_its_answer(
    sandbox: Harness, address: str, code: int, status: str
) -> None:
    """A recipient named ``rcpt4xx…``/``rcpt5xx…`` is refused with that answer."""
    async with client(sandbox) as smtp:
        await smtp.mail("a@example.com")
        with pytest.raises(aiosmtplib.SMTPRecipientRefused) as refused:
            await smtp.rcpt(address)

    assert (refused.value.code, refused.value.message[:5]) == (code, status)


async def test_wrong_password_gets_535(sandbox: Harness) -> None:
    """AUTH with another password is refused with 535."""
    with pytest.raises(aiosmtplib.SMTPAuthenticationError) as refused:
        async with client(sandbox, password="wrong"):
            pass

    assert refused.value.code == 535


async def test_mail_before_auth_gets_530(sandbox: Harness) -> None:
    """Nothing is relayed for a client that did not authenticate."""
    async with client(sandbox, password="") as smtp:
        with pytest.raises(aiosmtplib.SMTPSenderRefused) as refused:
            await smtp.mail("a@example.com")

    assert refused.value.code == 530


async def test_fault_status_refuses_mail(sandbox: Harness) -> None:
    """A fault with status 421 is the answer to MAIL, and nothing is recorded."""
    await fault(sandbox, status=421, count=1)
    async with client(sandbox) as smtp:
        with pytest.raises(aiosmtplib.SMTPResponseException) as refused:
            await smtp.mail("a@example.com")

    assert refused.value.code == 421
    assert (await sandbox.client.get("/_control/sends")).json()["smtp"]["requests"] == 0


async def test_lose_after_data_records_then_drops(sandbox: Harness) -> None:
    """``accept`` + ``reset``: the message is recorded and the client hears nothing."""
    await fault(sandbox, accept=True, reset=True, count=1)
    async with client(sandbox) as smtp:
        await smtp.mail("a@example.com")
        await smtp.rcpt("ann@example.org")
        with pytest.raises(aiosmtplib.SMTPServerDisconnected):
            await smtp.data(MESSAGE)

    assert await accepted(sandbox, "ann@example.org") == 1


async def test_connections_are_counted(sandbox: Harness) -> None:
    """Each connection is counted once, however many transactions it carries."""
    async with client(sandbox) as smtp:
        for _ in range(2):
            await smtp.mail("a@example.com")
            await smtp.rcpt("ann@example.org")
            await smtp.data(MESSAGE)

    info = (await sandbox.client.get("/_control/smtp")).json()
    assert info["connections"] == 1
    assert await accepted(sandbox, "ann@example.org") == 2


async def test_smtp_fault_status_must_be_a_reply_code(sandbox: Harness) -> None:
    """An smtp fault's status is an SMTP failure code (400-599)."""
    answer = await sandbox.client.post("/_control/faults", json={"provider": "smtp", "status": 250})
    assert answer.status_code == 400
