"""Opening a service's connections when something is wrong (``shared.infra.resources``), and the
readiness checks over them: an absent Cassandra, a keyspace whose stats layout refuses the
configuration, a topology not declared yet, connections that closed. Dependencies that are
"down" are unreachable ports or our own closed clients; the shared services keep running."""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette

from shared.core.errors import DependencyUnavailable
from shared.infra.broker import Broker
from shared.infra.config import AmqpSettings, CassandraSettings, Settings, StatsSettings
from shared.infra.db import Database
from shared.infra.health import health_routes, run_checks
from shared.infra.migrations import LayoutMismatch, fix_layout
from shared.infra.resources import Resources, connect_with_retry, open_resources, readiness_checks
from shared.infra.topology import Topology, batch_key


def _management_url() -> str:
    return f"http://127.0.0.1:{os.environ.get('SAFEDELIVR_RABBITMQ_MANAGEMENT_PORT', '15672')}"


async def _connection_names(http: httpx.AsyncClient) -> set[str]:
    connections = (await http.get("/api/connections")).json()
    return {c.get("client_properties", {}).get("connection_name") for c in connections}


async def _still_open(name: str) -> bool:
    """Whether RabbitMQ lists a connection called ``name``. Its listing lags up to a
    statistics interval behind new connections, so a control connection opened now is waited
    for first: once it shows, any connection opened before it would show too."""
    control = Broker(AmqpSettings().url.get_secret_value(), Topology(), name=f"control-{name}")
    await control.connect()
    try:
        async with httpx.AsyncClient(base_url=_management_url(), auth=("guest", "guest")) as http:
            for _ in range(150):
                names = await _connection_names(http)
                if control.name in names:
                    return name in names
                await asyncio.sleep(0.1)
    finally:
        await control.close()
    raise AssertionError("the control connection never showed")


async def test_an_absent_cassandra_is_waited_for_then_given_up(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    absent = settings.model_copy(
        update={"cassandra": CassandraSettings(port=1, connect_timeout=0.5)}
    )
    started = time.monotonic()

    with (
        caplog.at_level(logging.WARNING, "shared.infra.resources"),
        pytest.raises(DependencyUnavailable) as raised,
    ):
        await connect_with_retry(absent, name="absent-cassandra", wait=1)

    assert raised.value.service == "cassandra"
    assert time.monotonic() - started >= 1  # it waits the time it is given, however slow the box
    waits = [r.getMessage() for r in caplog.records if r.name == "shared.infra.resources"]
    assert waits and all(m.startswith("waiting for Cassandra: NoHostAvailable") for m in waits)


async def test_a_refused_stats_layout_stops_start_up_and_closes_what_was_opened(
    settings: Settings, db: Database
) -> None:
    """The keyspace's stats were written with another bucket count: the service must not
    start (a recipient would count twice), and the connections it opened are closed again."""
    await fix_layout(db, settings.stats.buckets)  # recorded (or confirmed) for this keyspace
    other = settings.stats.buckets + 1
    wrong = settings.model_copy(update={"stats": StatsSettings(buckets=other)})
    name = f"layout-{uuid.uuid4().hex[:8]}"
    entered = False

    with pytest.raises(LayoutMismatch, match=f"is {other} but .* with {settings.stats.buckets}"):
        async with open_resources(wrong, name=name):
            entered = True

    assert not entered
    assert not await _still_open(name)
    await fix_layout(db, settings.stats.buckets)  # the recorded layout is unchanged


@pytest.fixture
async def resources(migrated: CassandraSettings, exchange_name: str) -> AsyncIterator[Resources]:
    """A session and a broker of the test's own (closing them harms no other test); the
    broker's topology is left undeclared."""
    db = await Database.connect(migrated, keyspace=migrated.keyspace)
    broker = Broker(
        AmqpSettings().url.get_secret_value(), Topology(exchange=exchange_name), name=exchange_name
    )
    await broker.connect()
    try:
        yield Resources(db, broker)
    finally:
        if not broker.connected:
            await broker.connect()
        await broker.delete()
        await broker.close()
        await db.close()


async def test_readiness_fails_until_the_topology_is_declared_and_the_broker_still_works(
    resources: Resources,
) -> None:
    """A probe before ``safedelivr topology`` ran finds no queue; the failed check must not
    break the publishing channel it ran on."""
    before = await run_checks(readiness_checks(resources))
    assert before["cassandra"] == "ok"
    assert "NOT_FOUND" in before["rabbitmq"]

    await resources.broker.declare()

    assert await run_checks(readiness_checks(resources)) == {"cassandra": "ok", "rabbitmq": "ok"}
    await resources.broker.publish(batch_key(uuid.uuid1()), b"{}")
    assert await resources.broker.queue_depth(resources.broker.topology.batches_queue) == 1


async def test_readyz_names_each_dependency_that_went_away(resources: Resources) -> None:
    await resources.broker.declare()
    app = Starlette(
        routes=health_routes("api", CollectorRegistry(), lambda _: readiness_checks(resources))
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        assert (await client.get("/readyz")).status_code == 200

        await resources.broker.close()
        broker_gone = await client.get("/readyz")

        await resources.db.close()
        both_gone = await client.get("/readyz")
        alive = await client.get("/healthz")

    assert broker_gone.status_code == 503
    assert broker_gone.json()["checks"] == {"cassandra": "ok", "rabbitmq": "unavailable"}
    assert both_gone.status_code == 503
    assert both_gone.json()["checks"]["cassandra"] != "ok"
    assert alive.status_code == 200
