"""Fixtures of the integration tests that drive the API app in-process.

``api`` is an app per test. A module whose tests only read and write their own user's data
overrides ``settings`` and ``api`` with :func:`module_settings` and :func:`module_api`: one
app for the module (starting one costs seconds), a client per test, and still no data
shared between tests.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.applications import Starlette

from services.api.app import create_app
from shared.infra.config import CassandraSettings, Settings
from tests.conftest import delete_topology, stack_settings, unique
from tests.integration.harness import client_for, running


@contextlib.asynccontextmanager
async def app_for(settings: Settings) -> AsyncIterator[Starlette]:
    """The API app of ``settings``, started, with its topology declared and deleted after."""
    app = create_app(settings)
    async with running(app):
        broker = app.state.resources.broker
        await broker.declare()
        try:
            yield app
        finally:
            await broker.delete()


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The API app with its private topology, which the test deletes again."""
    async with app_for(settings) as app, client_for(app) as client:
        yield client


@pytest.fixture(scope="module")
async def module_settings(migrated: CassandraSettings) -> AsyncIterator[Settings]:
    """Settings for one module's tests: a topology of the module's own, deleted after it."""
    s = stack_settings(migrated, unique("t").replace("_", "-"))
    yield s
    await delete_topology(s)


@pytest.fixture(scope="module")
async def module_app(module_settings: Settings) -> AsyncIterator[Starlette]:
    """One API app for a module whose tests never share data (each makes its own user)."""
    async with app_for(module_settings) as app:
        yield app


@pytest.fixture
async def module_api(module_app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the test's own (its cookies stay its own) over the module's app."""
    async with client_for(module_app) as client:
        yield client
