"""Fixtures: a sandbox app with its lifespan running, posting webhooks to a local receiver."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from pydantic import SecretStr
from starlette.applications import Starlette

from sandbox.app import create_app
from sandbox.state import SandboxState
from sandbox.tuning import Tuning
from shared.infra.config import SandboxSettings
from tests.unit.sandbox.receiver import Receiver

MAILGUN_SIGNING_KEY = "test-mailgun-signing-key"
SENDGRID_AUTH = {"Authorization": "Bearer SG.test-key"}
MAILGUN_AUTH = {"Authorization": "Basic " + base64.b64encode(b"api:key-test").decode()}
FORM = {"Content-Type": "application/x-www-form-urlencoded"}
#: Short waits so the tests see batches flushed and retries made quickly.
FAST = Tuning(sendgrid_batch_wait=0.01, retry_delays=(0.01, 0.02), mailgun_workers=4)


@dataclass
class Harness:
    """A running sandbox, a client for it, and the receiver of its webhooks."""

    app: Starlette
    client: httpx.AsyncClient
    receiver: Receiver

    @property
    def state(self) -> SandboxState:
        state: SandboxState = self.app.state.sandbox
        return state

    async def settle(self) -> None:
        """Wait until every webhook of the accepted mail has been posted."""
        assert await self.state.dispatcher.wait_idle(5.0)


def sandbox_settings(**overrides: Any) -> SandboxSettings:
    values: dict[str, Any] = {
        "webhook_url": "http://receiver",
        "webhook_delay": 0.0,
        "mailgun_signing_key": SecretStr(MAILGUN_SIGNING_KEY),
        **overrides,
    }
    return SandboxSettings(**values)


@asynccontextmanager
async def running(
    settings: SandboxSettings | None = None, tuning: Tuning = FAST
) -> AsyncIterator[Harness]:
    """A sandbox whose lifespan runs, posting to a fresh receiver through ASGI."""
    receiver = Receiver(mailgun_signing_key=MAILGUN_SIGNING_KEY)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=receiver.app())) as hooks:
        app = create_app(settings or sandbox_settings(), http=hooks, tuning=tuning)
        receiver.sendgrid_public_key = app.state.sandbox.sendgrid_public_key
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://sandbox"
            ) as client,
        ):
            yield Harness(app, client, receiver)


@pytest.fixture
async def sandbox() -> AsyncIterator[Harness]:
    async with running() as harness:
        yield harness


def sendgrid_mail(*to: str, **fields: Any) -> dict[str, Any]:
    """A valid Mail Send body with one personalization to ``to``."""
    body: dict[str, Any] = {
        "personalizations": [{"to": [{"email": address} for address in to]}],
        "from": {"email": "sender@example.com", "name": "Sender"},
        "subject": "Hello",
        "content": [{"type": "text/plain", "value": "Hi"}, {"type": "text/html", "value": "<p>Hi"}],
    }
    body.update(fields)
    return body


def encoded(form: Sequence[tuple[str, str]]) -> bytes:
    """``form`` urlencoded, repeated fields kept in order."""
    return urlencode(form).encode()


def mailgun_form(*to: str, extra: Sequence[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    """A valid Mailgun form to ``to`` (one ``to`` field each), plus ``extra`` fields."""
    form = [("from", "Sender <sender@example.com>"), *(("to", a) for a in to)]
    form += [("subject", "Hello"), ("text", "Hi"), *extra]
    return form
