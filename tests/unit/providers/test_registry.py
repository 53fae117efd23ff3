"""Building the configured provider chain and closing it."""

from __future__ import annotations

import pytest

from shared.core.models import Chunk
from shared.infra.config import ProviderSettings
from shared.providers.base import Gate, LookupQuery, Provider, Receipt
from shared.providers.mailgun import MailgunProvider
from shared.providers.registry import build_providers, close_all
from shared.providers.sendgrid import SendGridProvider
from tests.unit.providers.fakes import FakeProviderServer, Reply, chunk


class ClosingProvider:
    """A provider that records aclose and may fail it."""

    code = "xx"
    name = "Closing"
    max_recipients = 1

    def __init__(self, error: Exception | None = None) -> None:
        self.closed = False
        self.error = error

    async def send(self, chunk: Chunk, gate: Gate | None = None) -> Receipt:
        raise NotImplementedError

    async def lookup(self, query: LookupQuery) -> frozenset[str] | None:
        return None

    async def lookup_available(self) -> bool:
        return False

    async def aclose(self) -> None:
        self.closed = True
        if self.error:
            raise self.error


async def test_chain_order_and_codes() -> None:
    """Providers come keyed by code, in the configured failover order."""
    providers = build_providers(ProviderSettings(chain="mg,sg"))
    try:
        assert list(providers) == ["mg", "sg"]
        assert isinstance(providers["mg"], MailgunProvider)
        assert isinstance(providers["sg"], SendGridProvider)
    finally:
        await close_all(providers)


async def test_single_provider_chain() -> None:
    """A chain of one provider builds just that one."""
    providers = build_providers(ProviderSettings(chain="sg"))
    try:
        assert list(providers) == ["sg"]
    finally:
        await close_all(providers)


async def test_providers_use_configured_endpoints(server: FakeProviderServer) -> None:
    """Base URLs, domain and keys come from the settings."""
    server.script(Reply(status=202), Reply(status=200, body=b'{"id":"<x@d>"}'))
    settings = ProviderSettings(
        sendgrid_base_url=f"{server.url}/sendgrid",
        mailgun_base_url=f"{server.url}/mailgun",
        mailgun_domain="mg.example.com",
        timeout=2,
    )
    providers = build_providers(settings)
    try:
        for provider in providers.values():
            await provider.send(chunk())
    finally:
        await close_all(providers)

    assert [r.path for r in server.received] == [
        "/sendgrid/v3/mail/send",
        "/mailgun/v3/mg.example.com/messages",
    ]


async def test_close_all_closes_everyone_then_raises_first_failure() -> None:
    """A failing aclose does not stop the others from closing; its error is raised after."""
    failing = ClosingProvider(RuntimeError("boom"))
    fine = ClosingProvider()
    providers: dict[str, Provider] = {"a": failing, "b": fine}

    with pytest.raises(RuntimeError, match="boom"):
        await close_all(providers)

    assert failing.closed and fine.closed


async def test_closed_sendgrid_refuses_to_send() -> None:
    """After close_all a SendGrid provider no longer accepts work."""
    providers = build_providers(ProviderSettings(chain="sg"))
    await close_all(providers)

    with pytest.raises(RuntimeError, match="client has been closed"):
        await providers["sg"].send(chunk())
