"""SendGridProvider over real HTTP against a scripted local server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import orjson
import pytest

from shared.core.errors import PermanentProviderError, ProviderMisconfigured, TransientProviderError
from shared.providers.base import Receipt
from shared.providers.sendgrid import SendGridProvider
from tests.unit.providers.fakes import FakeProviderServer, Reply, chunk

ACCEPTED = Reply(status=202, headers={"X-Message-Id": "sg-abc123"})


@pytest.fixture
async def provider(server: FakeProviderServer) -> AsyncIterator[SendGridProvider]:
    sendgrid = SendGridProvider(
        api_key="SG.test-key", base_url=f"{server.url}/sendgrid/", timeout=2
    )
    yield sendgrid
    await sendgrid.aclose()


async def test_accepted_chunk_returns_message_id(
    server: FakeProviderServer, provider: SendGridProvider
) -> None:
    """A 202 becomes a Receipt carrying the X-Message-Id header."""
    server.script(ACCEPTED)

    receipt = await provider.send(chunk())

    assert receipt == Receipt(provider="sg", status=202, message_id="sg-abc123")


async def test_request_reaches_mail_send_with_bearer_key(
    server: FakeProviderServer, provider: SendGridProvider
) -> None:
    """The POST goes to {base}/v3/mail/send with the Bearer key and a JSON body."""
    server.script(ACCEPTED)

    await provider.send(chunk())

    request = server.received[0]
    assert (request.method, request.path) == ("POST", "/sendgrid/v3/mail/send")
    assert request.headers["authorization"] == "Bearer SG.test-key"
    assert request.headers["content-type"] == "application/json"
    assert orjson.loads(request.body)["subject"] == "Hello"


async def test_bad_request_is_permanent_with_errors(
    server: FakeProviderServer, provider: SendGridProvider
) -> None:
    """A 400 error list becomes a PermanentProviderError quoting field and message."""
    body = b'{"errors":[{"message":"Invalid email","field":"personalizations.0.to.0.email"}]}'
    server.script(Reply(status=400, body=body))

    with pytest.raises(PermanentProviderError) as caught:
        await provider.send(chunk())

    assert caught.value.status == 400
    assert caught.value.message == "HTTP 400: personalizations.0.to.0.email: Invalid email"


async def test_unauthorized_is_misconfigured(
    server: FakeProviderServer, provider: SendGridProvider
) -> None:
    """A 401 means our key is wrong: ProviderMisconfigured."""
    server.script(Reply(status=401, body=b'{"errors":[{"message":"authorization required"}]}'))

    with pytest.raises(ProviderMisconfigured, match="authorization required"):
        await provider.send(chunk())


async def test_too_large_is_permanent(
    server: FakeProviderServer, provider: SendGridProvider
) -> None:
    """A 413 is permanent: no provider takes a body that large."""
    server.script(Reply(status=413, body=b'{"errors":[{"message":"content too large"}]}'))

    with pytest.raises(PermanentProviderError):
        await provider.send(chunk())


async def test_rate_limited_carries_reset_delay(
    server: FakeProviderServer, provider: SendGridProvider
) -> None:
    """A 429 is transient, with retry_after from X-RateLimit-Reset."""
    reset = int(time.time()) + 30
    headers = {"X-RateLimit-Limit": "600", "X-RateLimit-Remaining": "0"}
    headers["X-RateLimit-Reset"] = str(reset)
    server.script(Reply(status=429, headers=headers, body=b'{"errors":[{"message":"too many"}]}'))

    with pytest.raises(TransientProviderError) as caught:
        await provider.send(chunk())

    assert caught.value.status == 429
    assert caught.value.retry_after is not None
    assert 28 <= caught.value.retry_after <= 30


async def test_server_error_is_transient_with_an_unknown_outcome(
    server: FakeProviderServer, provider: SendGridProvider
) -> None:
    """A 500 is transient, and may have been accepted: its outcome is unknown."""
    server.script(Reply(status=500))

    with pytest.raises(TransientProviderError) as caught:
        await provider.send(chunk())

    assert (caught.value.status, caught.value.outcome_unknown) == (500, True)


async def test_slow_response_times_out_as_transient(server: FakeProviderServer) -> None:
    """No response within the timeout is a transient error that says the outcome is unknown."""
    server.script(Reply(status=202, delay=1.0))
    provider = SendGridProvider(api_key="k", base_url=server.url, timeout=0.2)

    try:
        with pytest.raises(TransientProviderError, match="may have accepted") as caught:
            await provider.send(chunk())
    finally:
        await provider.aclose()

    assert caught.value.status is None


async def test_refused_connection_is_transient(server: FakeProviderServer) -> None:
    """Nobody listening is a transient error."""
    url = server.url
    await server.stop()
    provider = SendGridProvider(api_key="k", base_url=url, timeout=1)

    try:
        with pytest.raises(TransientProviderError, match="could not reach"):
            await provider.send(chunk())
    finally:
        await provider.aclose()


async def test_unusable_base_url_is_misconfigured() -> None:
    """A base URL without a scheme is reported as misconfiguration."""
    provider = SendGridProvider(api_key="k", base_url="api.sendgrid.com", timeout=1)

    try:
        with pytest.raises(ProviderMisconfigured, match="base URL"):
            await provider.send(chunk())
    finally:
        await provider.aclose()


async def test_concurrent_sends_overlap(server: FakeProviderServer) -> None:
    """Two sends run at once: their requests overlap and the loop keeps ticking."""
    slow = Reply(status=202, headers={"X-Message-Id": "m"}, delay=0.3)
    server.script(slow, slow)
    provider = SendGridProvider(api_key="k", base_url=server.url, timeout=5)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    try:
        await asyncio.gather(provider.send(chunk()), provider.send(chunk()))
    finally:
        ticker.cancel()
        await provider.aclose()

    first, second = server.received
    assert first.started < second.finished and second.started < first.finished
    assert ticks >= 2  # a send that held the loop for its 0.3 s would leave none or one
