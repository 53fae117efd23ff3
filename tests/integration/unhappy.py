"""Helpers of the API's unhappy-path tests: the API app in process with a client that sees
500 answers as a real server would send them, and a fresh user with an API key per test."""

from __future__ import annotations

import base64
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
from starlette.applications import Starlette

from services.api.app import create_app
from shared.accounts import accounts
from shared.infra.config import Settings
from shared.infra.db import Database
from tests.conftest import unique
from tests.integration.harness import running

#: The one 401 body of ``/v1``, whatever is wrong with the key.
UNAUTHORIZED = {"error": {"code": "unauthorized", "message": "missing or invalid API key"}}


@dataclass(frozen=True)
class Account:
    """A user of its own and one live API key."""

    user_id: uuid.UUID
    key: str

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    @property
    def key_id(self) -> str:
        return self.key.removeprefix("sd_live_").split("_", 1)[0]


async def new_account(db: Database, prefix: str = "unhappy") -> Account:
    user_id = await accounts.ensure_user(db, unique(prefix))
    return Account(user_id, await accounts.create_key(db, user_id, "test"))


@contextlib.asynccontextmanager
async def api_client(settings: Settings) -> AsyncIterator[tuple[Starlette, httpx.AsyncClient]]:
    """The API app with its lifespan and private topology, and a client of it.

    Unlike ``harness.client_for`` the transport does not re-raise the app's exceptions: an
    unhandled error reaches the test as the 500 response a server would have sent.
    """
    app = create_app(settings)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with (
        running(app),
        httpx.AsyncClient(transport=transport, base_url="http://api.test") as client,
    ):
        broker = app.state.resources.broker
        await broker.declare()
        try:
            yield app, client
        finally:
            await broker.delete()


def with_api(settings: Settings, **api: object) -> Settings:
    """``settings`` with some of its API settings changed."""
    return settings.model_copy(update={"api": settings.api.model_copy(update=api)})


def cursor(data: object) -> str:
    """A paging cursor as the API encodes one (URL-safe base64 of JSON, unpadded)."""
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")
