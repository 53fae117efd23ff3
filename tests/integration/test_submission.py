"""SMTP submission on the real stack: our SMTP server on loopback, the API in process
(Cassandra, RabbitMQ), consumers sending through the sandbox. Mail handed over with Python's
``smtplib`` and with ``aiosmtplib`` (a second client) becomes a batch through
``POST /v1/batches``, answered ``250`` only once the batch is stored, and is delivered like any
other batch; what cannot be stored now is a ``451``, what is refused a ``5xx``."""

from __future__ import annotations

import asyncio
import smtplib
import ssl
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from email import policy
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import aiosmtplib
import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from services.submission.server import Submissions, serve
from shared.delivery.stats import batch_day
from shared.delivery.validation import MAX_SUBJECT_LENGTH
from shared.infra.config import Settings, SubmissionSettings
from shared.infra.db import Database
from shared.infra.gil import CpuLane
from tests.integration.stack import Stack, emails, fast_settings, full_stack


@pytest.fixture
async def stack(settings: Settings, db: Database) -> AsyncIterator[Stack]:
    async with full_stack(fast_settings(settings), db) as s:
        yield s


@asynccontextmanager
async def smtp_server(api: httpx.AsyncClient, **settings: Any) -> AsyncIterator[int]:
    """Our SMTP server on a free loopback port, submitting through ``api``; its port."""
    cpu = CpuLane("mime")
    options = SubmissionSettings(**settings)
    listening = await serve(Submissions(api, options, cpu), options, port=0)
    try:
        yield listening.port
    finally:
        await listening.close(5.0)
        await cpu.aclose()


def _message(to: list[str], subject: str = "Over SMTP", **headers: str) -> EmailMessage:
    message = EmailMessage()
    message["From"] = "Shop <shop@example.com>"
    message["To"] = ", ".join(to)
    message["Subject"] = subject
    for name, value in headers.items():
        message[name.replace("_", "-")] = value
    message.set_content("Hello from an application that speaks SMTP")
    return message


def _smtplib(port: int, key: str, message: EmailMessage, to: list[str]) -> tuple[int, bytes]:
    """One submission with the standard library (in a thread: it blocks): the DATA answer."""
    with smtplib.SMTP("127.0.0.1", port, timeout=30) as client:
        client.login("api", key)  # PLAIN, as smtplib prefers it
        client.mail("shop@example.com")
        for address in to:
            client.rcpt(address)
        return client.data(message.as_bytes(policy=policy.SMTP))


def _batch_of(reply: tuple[int, bytes]) -> str:
    code, text = reply
    assert code == 250, text
    return text.decode().rsplit(" ", 1)[1]


async def test_a_message_sent_with_smtplib_becomes_a_delivered_batch(stack: Stack) -> None:
    to = emails(2)
    async with stack.consuming(), smtp_server(stack.api) as port:
        reply = await asyncio.to_thread(_smtplib, port, stack.key, _message(to), to)
        batch_id = _batch_of(reply)
        logs = await stack.final(batch_id, 2)
        received = await stack.received(to[0])

    assert {r["state"] for r in logs.values()} == {"success"}
    assert received["subject"] == "Over SMTP"


async def test_a_message_s_attachment_reaches_the_provider(stack: Stack) -> None:
    """An smtplib message with a file becomes a batch whose attachment the sandbox saw."""
    to = emails(1, "smtp-file")
    message = _message(to)
    message.add_attachment(b"%PDF-1.4 x", maintype="application", subtype="pdf", filename="a.pdf")
    async with stack.consuming(), smtp_server(stack.api) as port:
        reply = await asyncio.to_thread(_smtplib, port, stack.key, message, to)
        batch_id = _batch_of(reply)
        logs = await stack.final(batch_id, 1)
        received = await stack.received(to[0])

    assert [r["state"] for r in logs.values()] == ["success"]
    assert received["text"].startswith("Hello from an application")
    assert [(a["filename"], a["content_type"], a["size"]) for a in received["attachments"]] == [
        ("a.pdf", "application/pdf", 10)
    ]


async def test_a_second_client_s_message_has_the_same_logs_and_stats_as_http(stack: Stack) -> None:
    """aiosmtplib with AUTH LOGIN, beside the same message posted over HTTP."""
    over_smtp, over_http = emails(1, "smtp"), emails(1, "http")
    async with stack.consuming(), smtp_server(stack.api) as port:
        client = aiosmtplib.SMTP(hostname="127.0.0.1", port=port, start_tls=False)
        async with client:
            await client.ehlo()
            await client.auth_login("api", stack.key)
            _, reply = await client.send_message(_message(over_smtp))
        smtp_batch = reply.rsplit(" ", 1)[1]
        text = "Hello from an application that speaks SMTP"
        http_batch = await stack.submit(over_http, subject="Over SMTP", text=text)
        smtp_logs = await stack.final(smtp_batch, 1)
        http_logs = await stack.final(http_batch, 1)
        accepted_on = {batch_day(uuid.UUID(b)) for b in (smtp_batch, http_batch)}
        counted = [await stack.stats(day.isoformat()) for day in accepted_on]

    def shape(logs: dict[str, Any]) -> list[tuple[str, str, dict[str, str]]]:
        return [(r["state"], r["event"], r["providers"]) for r in logs.values()]

    assert shape(smtp_logs) == shape(http_logs)
    assert [state for state, _, _ in shape(smtp_logs)] == ["success"]
    assert sum(day["success"] for day in counted) == 2  # the test's user: no one else's


async def test_a_wrong_key_is_refused_at_auth(stack: Stack) -> None:
    async with smtp_server(stack.api) as port:
        with pytest.raises(smtplib.SMTPAuthenticationError) as refused:
            await asyncio.to_thread(
                _smtplib, port, "sd_live_nope_nope", _message(["a@x.org"]), ["a@x.org"]
            )
    assert refused.value.smtp_code == 535


async def test_nothing_is_taken_before_auth(stack: Stack) -> None:
    def unauthenticated(port: int) -> tuple[int, bytes]:
        with smtplib.SMTP("127.0.0.1", port, timeout=30) as client:
            client.ehlo()
            return client.mail("shop@example.com")

    async with smtp_server(stack.api) as port:
        code, _ = await asyncio.to_thread(unauthenticated, port)
    assert code == 530


async def test_the_same_message_id_twice_is_one_batch(stack: Stack) -> None:
    """A client that retries after a lost answer gets the batch it already made."""
    to = emails(1)
    message = _message(to, Message_ID=f"<{uuid.uuid4().hex}@app.example>")
    async with smtp_server(stack.api) as port:
        first = await asyncio.to_thread(_smtplib, port, stack.key, message, to)
        again = await asyncio.to_thread(_smtplib, port, stack.key, message, to)
    assert _batch_of(first) == _batch_of(again)


async def test_a_message_over_the_size_limit_is_refused_552(stack: Stack) -> None:
    to = emails(1)
    message = _message(to)
    message.set_content("\n".join(["x" * 70] * 300))  # 21 KB of ordinary lines
    async with smtp_server(stack.api, max_message_bytes=10_000) as port:
        code, text = await asyncio.to_thread(_smtplib, port, stack.key, message, to)
    assert code == 552, text


async def test_an_api_that_cannot_take_the_batch_now_is_a_451(stack: Stack) -> None:
    """The key was checked; then the API went away: the client is told to try again (and
    nothing was stored, so its retry makes the batch once)."""
    to = emails(1)
    answers = _Switch(stack.api)
    async with (
        httpx.AsyncClient(transport=answers, base_url="http://api") as api,
        smtp_server(api) as port,
    ):
        before = await _batches(stack)
        reply = await asyncio.to_thread(
            _smtplib_then, port, stack.key, _message(to), to, answers.cut
        )
    assert reply[0] == 451
    assert await _batches(stack) == before


async def _batches(stack: Stack) -> int:
    resp = await stack.api.get("/v1/batches", params={"limit": "100"}, headers=stack.auth)
    return len(resp.json()["data"])


async def test_a_batch_the_api_refuses_is_a_550_with_its_reason(stack: Stack) -> None:
    """A message we can read but the API refuses (its subject is over the API's limit): the
    client is told why, in the API's words."""
    to = emails(1)
    message = _message(to, subject="s" * (MAX_SUBJECT_LENGTH + 1))
    async with smtp_server(stack.api) as port:
        code, text = await asyncio.to_thread(
            _smtplib_raw, port, stack.key, message.as_bytes(policy=policy.SMTP), to
        )
    assert code == 550, text
    assert text.startswith(b"5.6.0") and b"subject" in text


def _smtplib_raw(port: int, key: str, raw: bytes, to: list[str]) -> tuple[int, bytes]:
    with smtplib.SMTP("127.0.0.1", port, timeout=30) as client:
        client.login("api", key)
        client.mail("shop@example.com")
        for address in to:
            client.rcpt(address)
        return client.data(raw)


def _smtplib_then(
    port: int, key: str, message: EmailMessage, to: list[str], before_data: Callable[[], None]
) -> tuple[int, bytes]:
    with smtplib.SMTP("127.0.0.1", port, timeout=30) as client:
        client.login("api", key)
        client.mail("shop@example.com")
        for address in to:
            client.rcpt(address)
        before_data()
        return client.data(message.as_bytes(policy=policy.SMTP))


class _Switch(httpx.AsyncBaseTransport):
    """The real API until ``cut()``; after it, a connection that cannot be made (as when the
    API process is gone)."""

    def __init__(self, api: httpx.AsyncClient) -> None:
        self._api = api
        self._cut = False

    def cut(self) -> None:
        self._cut = True

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._cut:
            raise httpx.ConnectError("connection refused", request=request)
        response = await self._api.request(
            request.method, request.url.path, headers=request.headers, content=request.content
        )
        return httpx.Response(
            response.status_code, headers=response.headers, content=response.content
        )


def _certificate(directory: Path) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1))
        .not_valid_after(now + timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "cert.pem", directory / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(cert_file), str(key_file)


async def test_with_a_certificate_auth_waits_for_starttls(stack: Stack, tmp_path: Path) -> None:
    """As in production: no AUTH is offered in the clear, and after STARTTLS the key works."""
    cert_file, key_file = _certificate(tmp_path)
    to = emails(1)

    def clear_then_tls(port: int) -> tuple[bool, bool, tuple[int, bytes]]:
        with smtplib.SMTP("127.0.0.1", port, timeout=30) as client:
            client.ehlo()
            offered_in_clear = client.has_extn("auth")
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE  # our own self-signed certificate
            client.starttls(context=context)
            client.ehlo()
            offered_after = client.has_extn("auth")
            client.login("api", stack.key)
            client.mail("shop@example.com")
            client.rcpt(to[0])
            return (
                offered_in_clear,
                offered_after,
                client.data(_message(to).as_bytes(policy=policy.SMTP)),
            )

    async with smtp_server(stack.api, tls_cert_file=cert_file, tls_key_file=key_file) as port:
        in_clear, after, reply = await asyncio.to_thread(clear_then_tls, port)

    assert (in_clear, after) == (False, True)
    assert _batch_of(reply)
