"""Fixtures of the integration tests that drive the API app in-process."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from services.api.app import create_app
from shared.infra.config import Settings
from tests.integration.harness import client_for, running


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The API app with its private topology, which the test deletes again."""
    app = create_app(settings)
    async with running(app), client_for(app) as client:
        broker = app.state.resources.broker
        await broker.declare()
        try:
            yield client
        finally:
            await broker.delete()
