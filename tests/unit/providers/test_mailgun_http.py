"""MailgunProvider over real HTTP against a scripted local server."""

from __future__ import annotations

import base64
import urllib.parse
from collections.abc import AsyncIterator

import httpx
import pytest

from shared.core.errors import (
    PermanentProviderError,
    ProviderMisconfigured,
    ProviderSkipped,
    TransientProviderError,
)
from shared.providers.base import Receipt
from shared.providers.mailgun import MailgunProvider
from tests.unit.loop_turns import MANY, turns_during
from tests.unit.providers.fakes import FakeProviderServer, Reply, chunk, recipient

QUEUED = Reply(
    status=200, body=b'{"id":"<20240101.1@mg.example.com>","message":"Queued. Thank you."}'
)


@pytest.fixture
async def provider(server: FakeProviderServer) -> AsyncIterator[MailgunProvider]:
    mailgun = MailgunProvider(
        api_key="key-test", domain="mg.example.com", base_url=f"{server.url}/mailgun/", timeout=2
    )
    yield mailgun
    await mailgun.aclose()


async def test_queued_chunk_returns_message_id(
    server: FakeProviderServer, provider: MailgunProvider
) -> None:
    """A 200 becomes a Receipt with the id stripped of angle brackets."""
    server.script(QUEUED)

    receipt = await provider.send(chunk())

    assert receipt == Receipt(provider="mg", status=200, message_id="20240101.1@mg.example.com")


async def test_request_is_form_post_with_basic_auth(
    server: FakeProviderServer, provider: MailgunProvider
) -> None:
    """The POST goes to {base}/v3/{domain}/messages, form-encoded, with basic auth api:key."""
    server.script(QUEUED)

    await provider.send(chunk([recipient("a@example.org"), recipient("b@example.org")]))

    request = server.received[0]
    assert (request.method, request.path) == ("POST", "/mailgun/v3/mg.example.com/messages")
    assert request.headers["content-type"] == "application/x-www-form-urlencoded"
    expected_auth = "Basic " + base64.b64encode(b"api:key-test").decode()
    assert request.headers["authorization"] == expected_auth
    form = urllib.parse.parse_qs(request.body.decode())
    assert form["to"] == ["a@example.org", "b@example.org"]


async def test_bad_request_is_permanent(
    server: FakeProviderServer, provider: MailgunProvider
) -> None:
    """A 400 becomes a PermanentProviderError quoting Mailgun's message."""
    server.script(Reply(status=400, body=b'{"message":"from parameter is missing"}'))

    with pytest.raises(PermanentProviderError) as caught:
        await provider.send(chunk())

    assert caught.value.message == "HTTP 400: from parameter is missing"


async def test_unauthorized_is_misconfigured(
    server: FakeProviderServer, provider: MailgunProvider
) -> None:
    """A 401 (plain-text 'Forbidden') is ProviderMisconfigured."""
    server.script(Reply(status=401, body=b"Forbidden"))

    with pytest.raises(ProviderMisconfigured, match="Forbidden"):
        await provider.send(chunk())


async def test_unknown_domain_is_misconfigured(
    server: FakeProviderServer, provider: MailgunProvider
) -> None:
    """A 404 for an unknown sending domain is ProviderMisconfigured."""
    server.script(Reply(status=404, body=b'{"message":"Domain not found: mg.example.com"}'))

    with pytest.raises(ProviderMisconfigured, match="Domain not found"):
        await provider.send(chunk())


async def test_payment_required_is_misconfigured(
    server: FakeProviderServer, provider: MailgunProvider
) -> None:
    """A 402 (account or plan problem) is ProviderMisconfigured."""
    server.script(Reply(status=402))

    with pytest.raises(ProviderMisconfigured):
        await provider.send(chunk())


async def test_rate_limited_carries_retry_after(
    server: FakeProviderServer, provider: MailgunProvider
) -> None:
    """A 429 is transient with retry_after from Retry-After."""
    server.script(Reply(status=429, headers={"Retry-After": "12"}))

    with pytest.raises(TransientProviderError) as caught:
        await provider.send(chunk())

    assert caught.value.retry_after == 12.0


async def test_server_error_is_transient_with_an_unknown_outcome(
    server: FakeProviderServer, provider: MailgunProvider
) -> None:
    """A 503 is transient, and may have been accepted: its outcome is unknown."""
    server.script(Reply(status=503))

    with pytest.raises(TransientProviderError) as caught:
        await provider.send(chunk())

    assert (caught.value.status, caught.value.outcome_unknown) == (503, True)


async def test_slow_response_times_out_as_transient(server: FakeProviderServer) -> None:
    """No response within the timeout is transient and says the outcome is unknown."""
    server.script(Reply(status=200, delay=1.0))
    provider = MailgunProvider(api_key="k", domain="d", base_url=server.url, timeout=0.2)

    try:
        with pytest.raises(TransientProviderError, match="may have accepted"):
            await provider.send(chunk())  # a wait past the timeout would get the 200
    finally:
        await provider.aclose()


async def test_refused_connection_is_transient(server: FakeProviderServer) -> None:
    """Nobody listening is a transient error."""
    url = server.url
    await server.stop()
    provider = MailgunProvider(api_key="k", domain="d", base_url=url, timeout=1)

    try:
        with pytest.raises(TransientProviderError, match="could not reach"):
            await provider.send(chunk())
    finally:
        await provider.aclose()


async def test_unusable_base_url_is_misconfigured() -> None:
    """A base URL without a usable scheme is misconfiguration."""
    provider = MailgunProvider(api_key="k", domain="d", base_url="ftp://x", timeout=1)

    try:
        with pytest.raises(ProviderMisconfigured, match="base URL"):
            await provider.send(chunk())
    finally:
        await provider.aclose()


async def test_injected_client_is_used_and_left_open() -> None:
    """An injected client carries the request; aclose leaves it to its owner."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"id": "<m1@d>", "message": "Queued. Thank you."})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        provider = MailgunProvider(
            api_key="k", domain="d", base_url="https://api.mailgun.net", timeout=1, client=client
        )
        receipt = await provider.send(chunk())
        await provider.aclose()

        assert receipt.message_id == "m1@d"
        assert str(seen[0].url) == "https://api.mailgun.net/v3/d/messages"
        assert not client.is_closed


@pytest.mark.offloop
async def test_a_large_form_is_built_off_the_event_loop(provider: MailgunProvider) -> None:
    """The event loop goes on with other work while the form of 500 recipients, each with
    a variable for each of 500 keys, is built (stopped at the gate, before any request)."""
    people = [recipient(f"r{i}@example.org", substitutions={f"-k{i}-": "v"}) for i in range(500)]
    large = chunk(people, bulk=True, html=" ".join(f"-k{i}-" for i in range(500)))

    async def stop() -> None:
        raise ProviderSkipped("mg", "stopped at the gate")

    async def built() -> None:
        with pytest.raises(ProviderSkipped):
            await provider.send(large, stop)

    _, turns = await turns_during(built())

    assert turns >= MANY
