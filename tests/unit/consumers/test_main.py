"""The consumer process's wiring: which queues it consumes, and what it says at start-up
about providers whose query API cannot settle an unknown outcome."""

from __future__ import annotations

import asyncio
import logging

import pytest
from pydantic import SecretStr

from services.consumers.main import _background, _probe_query_apis, start_consumers
from shared.core.errors import TransientProviderError
from shared.infra.config import ProviderSettings, Settings
from shared.infra.resources import Resources
from shared.infra.settle import InFlight
from tests.fakes.broker import FakeBroker
from tests.fakes.world import ScriptedProvider


class NoStoredSettings:
    """A database holding no live settings (the only thing start-up reads)."""

    async def rows(self, query: str, params: object = None) -> list[dict[str, object]]:
        assert "live_settings" in query
        return []


async def test_the_consumers_read_the_batches_queue_each_providers_queues_and_the_dead() -> None:
    broker = FakeBroker()
    nowhere = "http://127.0.0.1:9"  # the discard port: the start-up probe reaches no provider
    settings = Settings(
        providers=ProviderSettings(
            chain="mg,sg",
            sendgrid_base_url=nowhere,
            mailgun_base_url=nowhere,
            sendgrid_api_key=SecretStr("unit"),
            mailgun_api_key=SecretStr("unit"),
        )
    )
    res = Resources(db=NoStoredSettings(), broker=broker)  # type: ignore[arg-type]
    dispatcher = (await start_consumers(settings, res, InFlight())).dispatcher
    t = broker.topology
    assert broker.declared
    assert set(broker.consumers) == {
        t.batches_queue,
        t.provider_queue("mg"),
        t.bulk_queue("mg"),
        t.log_queue("mg"),
        t.provider_queue("sg"),
        t.bulk_queue("sg"),
        t.log_queue("sg"),
        t.dead_letter_queue,  # archived for operators
    }
    # The bulk lane takes fewer deliveries at once than the transactional one.
    assert broker.consumers[t.bulk_queue("sg")][1] == settings.consumers.bulk_prefetch
    assert broker.consumers[t.provider_queue("sg")][1] == settings.consumers.prefetch
    assert settings.consumers.bulk_prefetch < settings.consumers.prefetch
    assert list(dispatcher.providers) == ["mg", "sg"]
    await asyncio.wait_for(asyncio.gather(*_background), 10)  # the start-up probe finishes
    assert not _background  # and is let go
    for provider in dispatcher.providers.values():
        await provider.aclose()


async def test_start_up_names_each_provider_without_a_query_api(
    caplog: pytest.LogCaptureFixture,
) -> None:
    providers = {
        "sg": ScriptedProvider("sg", "SendGrid", available=False),
        "mg": ScriptedProvider("mg", "Mailgun", available=TransientProviderError("mg", "503")),
    }
    with caplog.at_level(logging.WARNING):
        await _probe_query_apis(providers, Settings())
    messages = [r.getMessage() for r in caplog.records]
    assert any("SendGrid (sg) has no query API" in m for m in messages)
    assert any("could not check Mailgun's query API" in m for m in messages)
    assert not any("Mailgun (mg) has no query API" in m for m in messages)


async def test_the_domain_checks_ask_the_configured_resolver_on_the_configured_schedule() -> None:
    """The consumers look verified domains up through ``SAFEDELIVR_API_DNS_URL``, every
    ``_DOMAIN_RECHECK_EVERY`` with ``_DOMAIN_GRACE``, under a lease of their namespace."""
    import httpx

    from services.consumers.main import domain_checker_of
    from shared.accounts.domain_checks import CheckRules
    from shared.infra.config import AmqpSettings, ApiSettings

    asked: list[str] = []

    def resolver(request: httpx.Request) -> httpx.Response:
        asked.append(str(request.url))
        return httpx.Response(200, json={"Status": 3})

    settings = Settings(
        amqp=AmqpSettings(exchange="shop"),
        api=ApiSettings(
            dns_url="https://dns.test/dns-query", domain_recheck_every=60, domain_grace=600
        ),
    )
    async with httpx.AsyncClient(transport=httpx.MockTransport(resolver)) as http:
        checker = domain_checker_of(settings, Resources(None, None), http)  # type: ignore[arg-type]
        found = await checker.resolver.txt("_safedelivr.example.com")

    assert checker.rules == CheckRules.of(settings.api)
    assert checker.rules.every.total_seconds() == 60 and checker.rules.grace.total_seconds() == 600
    assert found == [] and asked[0].startswith("https://dns.test/dns-query?name=_safedelivr.")
    assert checker.leases.namespace == "shop:domains"  # type: ignore[attr-defined]
