"""Start-up connections: retried while a service is not there yet, given up after the wait."""

from __future__ import annotations

import logging
import time

import pytest
from pydantic import SecretStr

from shared.core.errors import DependencyUnavailable
from shared.infra.config import AmqpSettings, Settings
from shared.infra.resources import connect_with_retry


async def test_both_services_up_connects_at_once(settings: Settings) -> None:
    res = await connect_with_retry(settings, name="test", wait=5)
    try:
        assert res.broker.connected
        assert await res.db.one("SELECT release_version FROM system.local")
    finally:
        await res.broker.close()
        await res.db.close()


async def test_an_absent_broker_is_waited_for_then_given_up(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    absent = settings.model_copy(
        update={"amqp": AmqpSettings(url=SecretStr("amqp://guest:guest@127.0.0.1:1/"))}
    )
    started = time.monotonic()

    with caplog.at_level(logging.WARNING), pytest.raises(DependencyUnavailable):
        await connect_with_retry(absent, name="test", wait=2)

    assert time.monotonic() - started >= 2  # it waits the time it is given (no upper bound:
    # how long the last try takes is the loaded machine's)
    assert any("waiting for RabbitMQ" in r.getMessage() for r in caplog.records)
