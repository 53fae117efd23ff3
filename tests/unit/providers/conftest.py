"""Fixtures for provider adapter tests: a scripted local HTTP server per test."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.unit.providers.fakes import FakeProviderServer, Reply


@pytest.fixture
async def server() -> AsyncIterator[FakeProviderServer]:
    fake = FakeProviderServer(default=Reply(status=500, body=b"not scripted"))
    await fake.start()
    yield fake
    await fake.stop()
