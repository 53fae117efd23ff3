"""Both adapters against the project's sandbox providers, served by uvicorn on a random port.

The sandbox applies SendGrid's and Mailgun's request rules, so these tests show our payloads
pass them, in bulk and shared form, and that accepted recipients are recorded.
"""

from __future__ import annotations

import asyncio
import base64
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette

from sandbox.app import create_app
from shared.core.errors import ProviderMisconfigured, TransientProviderError
from shared.core.models import Address, Attachment, Chunk
from shared.infra.config import SandboxSettings
from shared.providers.base import LookupQuery, Provider
from shared.providers.mailgun import MailgunProvider
from shared.providers.sendgrid import SendGridProvider
from tests.unit.providers.fakes import BATCH_ID, FakeProviderServer, Reply, chunk, recipient

PEOPLE = [
    recipient("ann@example.org", "Ann", {"-first-": "Ann"}),
    recipient("bob@example.org", "Doe, Bob", {"-first-": "Bob"}),
]


@dataclass
class Served:
    """The sandbox at ``url``, posting its webhooks to ``receiver``."""

    url: str
    receiver: FakeProviderServer
    app: Starlette

    async def posted(self) -> None:
        """Wait until every webhook of the accepted mail has been posted."""
        assert await self.app.state.sandbox.dispatcher.wait_idle(5.0)


@asynccontextmanager
async def served(**settings: Any) -> AsyncIterator[Served]:
    # The sandbox posts signed webhooks after accepting mail; a fake receiver takes them.
    receiver = FakeProviderServer(default=Reply(status=200))
    await receiver.start()
    app = create_app(SandboxSettings(webhook_url=receiver.url, webhook_delay=0, **settings))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    for _ in range(500):  # uvicorn offers no event; give it up to 5 s
        if server.started or task.done():
            break
        await asyncio.sleep(0.01)
    assert server.started, "the sandbox did not start"
    host, port = sock.getsockname()
    try:
        yield Served(f"http://{host}:{port}", receiver, app)
    finally:
        server.should_exit = True
        await task
        sock.close()
        await receiver.stop()


@pytest.fixture
async def sandbox_url() -> AsyncIterator[str]:
    async with served() as sandbox:
        yield sandbox.url


def providers(url: str, key: str = "sandbox-key") -> list[Provider]:
    return [
        SendGridProvider(api_key=key, base_url=f"{url}/sendgrid", timeout=5),
        MailgunProvider(
            api_key=key,
            domain="sandbox.safedelivr.local",
            base_url=f"{url}/mailgun",
            timeout=5,
        ),
    ]


def sample(bulk: bool) -> Chunk:
    return chunk(
        PEOPLE,
        bulk=bulk,
        subject="Hello -first-",
        text="Hi -first-",
        html="<p>Hi -first-</p>",
        reply_to=Address(email="help@example.com", name="Help"),
        headers={"X-Campaign": "spring"},
        categories=["news"],
        # cc cannot go with bulk (see shared.providers.envelope).
        cc=[] if bulk else [Address(email="boss@example.com", name="Boss")],
    )


@pytest.mark.parametrize("bulk", [True, False], ids=["bulk", "shared"])
@pytest.mark.parametrize("index", [0, 1], ids=["sendgrid", "mailgun"])
async def test_sandbox_accepts_chunk(sandbox_url: str, index: int, bulk: bool) -> None:
    """The sandbox accepts the chunk, returns a message id and records every recipient."""
    provider = providers(sandbox_url)[index]
    try:
        receipt = await provider.send(sample(bulk))
    finally:
        await provider.aclose()

    async with httpx.AsyncClient() as client:
        sends = (await client.get(f"{sandbox_url}/_control/sends")).json()
    recorded = sends["sendgrid" if provider.code == "sg" else "mailgun"]["by_recipient"]
    assert receipt.provider == provider.code
    assert receipt.message_id
    assert {"ann@example.org", "bob@example.org"} <= set(recorded)


FILES = (
    Attachment(
        filename='Zoë "final", v2.pdf',
        content_type="application/pdf",
        content=base64.b64encode(b"%PDF-1.4 " + bytes(range(256)) * 40).decode(),
    ),
    Attachment(
        filename="logo.png",
        content_type="image/png",
        content=base64.b64encode(b"\x89PNG\r\n").decode(),
        disposition="inline",
        content_id="logo@example.com",
    ),
)


@pytest.mark.parametrize("bulk", [True, False], ids=["bulk", "shared"])
@pytest.mark.parametrize("index", [0, 1], ids=["sendgrid", "mailgun"])
async def test_sandbox_records_each_attachment_by_name_and_size(
    sandbox_url: str, index: int, bulk: bool
) -> None:
    """A chunk's files reach the provider: the sandbox accepts them and records each one's
    name, type and decoded size, in its ledger and in each recipient's mailbox."""
    provider = providers(sandbox_url)[index]
    files = sample(bulk).message.model_copy(update={"attachments": FILES})
    try:
        await provider.send(sample(bulk).model_copy(update={"message": files}))
    finally:
        await provider.aclose()

    name = "sendgrid" if provider.code == "sg" else "mailgun"
    async with httpx.AsyncClient() as client:
        sends = (await client.get(f"{sandbox_url}/_control/sends")).json()
        inbox = (
            await client.get(f"{sandbox_url}/_control/messages", params={"to": "bob@example.org"})
        ).json()
    recorded = [
        (a["filename"], a["content_type"], a["disposition"], a["size"])
        for a in sends[name]["recent"][-1]["attachments"]
    ]
    # Mailgun names an inline file by its Content-ID.
    inline_name = "logo.png" if provider.code == "sg" else "logo@example.com"
    expected = [
        ('Zoë "final", v2.pdf', "application/pdf", "attachment", 9 + 256 * 40),
        (inline_name, "image/png", "inline", 6),
    ]
    assert recorded == expected
    mailbox = inbox["messages"] if isinstance(inbox, dict) else inbox
    seen = [(a["filename"], a["size"]) for a in mailbox[-1]["attachments"]]
    assert seen == [(f, size) for f, _, _, size in expected]


@pytest.mark.parametrize("index", [0, 1], ids=["sendgrid", "mailgun"])
async def test_sandbox_refuses_invalid_key(sandbox_url: str, index: int) -> None:
    """The sandbox's 401 for a revoked key surfaces as ProviderMisconfigured."""
    provider = providers(sandbox_url, key="invalid")[index]
    try:
        with pytest.raises(ProviderMisconfigured) as caught:
            await provider.send(sample(bulk=True))
    finally:
        await provider.aclose()

    assert caught.value.status == 401


@pytest.mark.parametrize(
    ("index", "status"),
    [(0, 500), (0, 503), (1, 502), (1, 504)],
    ids=["sendgrid-500", "sendgrid-503", "mailgun-502", "mailgun-504"],
)
async def test_mail_accepted_before_a_5xx_answer_is_accepted_mail(index: int, status: int) -> None:
    """A provider that accepts and then answers a 5xx (a sandbox fault with ``accept``): our
    adapter reports an unknown outcome, and the mail is accepted like any other: recorded,
    found by the adapter's query API lookup for the attempt, and reported by webhooks."""
    async with served(query_delay=0.0) as sandbox:
        provider = providers(sandbox.url)[index]
        name = "sendgrid" if provider.code == "sg" else "mailgun"
        fault = {"provider": name, "status": status, "accept": True, "count": 1}
        async with httpx.AsyncClient(base_url=sandbox.url) as client:
            (await client.post("/_control/faults", json=fault)).raise_for_status()
            since = datetime.now(UTC)
            try:
                with pytest.raises(TransientProviderError) as caught:
                    await provider.send(sample(bulk=True).model_copy(update={"attempt": "c.0"}))
                emails = frozenset(p.email for p in PEOPLE)
                query = LookupQuery(BATCH_ID, 0, "c.0", since, emails)
                found = await provider.lookup(query)
            finally:
                await provider.aclose()
            sends = (await client.get("/_control/sends")).json()[name]["by_recipient"]
            await sandbox.posted()

    assert (caught.value.status, caught.value.outcome_unknown) == (status, True)
    assert found == emails
    assert {e: sends.get(e) for e in emails} == dict.fromkeys(emails, 1)
    hooks = b"".join(r.body for r in sandbox.receiver.received)
    assert all(e.encode() in hooks for e in emails)
