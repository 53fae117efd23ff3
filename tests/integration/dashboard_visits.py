"""A user visiting the dashboard pages of the real API app (in process, on the test's
Cassandra): the client that follows the pages' redirects, and a signed-in visitor with their
session's CSRF token and an API key, for the page tests of ``test_dashboard_*``."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
from starlette.applications import Starlette

from services.api.session_store import SESSION_COOKIE, SessionStore
from shared.accounts import accounts
from shared.infra.db import Database
from tests.conftest import unique
from tests.integration.harness import client_for


@dataclass(frozen=True, slots=True)
class Visitor:
    user_id: uuid.UUID
    csrf: str
    auth: dict[str, str]


@asynccontextmanager
async def pages_of(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    """A client of ``app``'s pages that follows redirects, as a browser does."""
    async with client_for(app) as client:
        client.follow_redirects = True
        yield client


async def logged_in(api: httpx.AsyncClient, db: Database, prefix: str) -> Visitor:
    """A new user signed in on ``api`` (its session cookie set), with an API key of theirs."""
    user = await accounts.ensure_user(db, unique(prefix))
    key = await accounts.create_key(db, user, "k")
    session_id, csrf = await SessionStore(db).create(user)
    api.cookies.set(SESSION_COOKIE, session_id, domain="api.test")
    return Visitor(user, csrf, {"Authorization": f"Bearer {key}"})
