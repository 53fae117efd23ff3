"""Batch to provider, end to end: real API, consumers, RabbitMQ, Cassandra and sandbox providers."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from sandbox.app import create_app as create_sandbox
from services.api.app import create_app as create_api
from services.consumers.main import build_dispatcher
from services.consumers.main import create_app as create_consumers
from services.consumers.splitter import Splitter
from shared.accounts import accounts
from shared.audience.suppressions import SuppressionStore
from shared.core.models import BatchJob
from shared.delivery.attempts import AttemptStore, chunk_line
from shared.delivery.batchstore import BatchStore
from shared.delivery.handoff import Routing
from shared.infra.broker import Broker
from shared.infra.config import ProviderSettings, SandboxSettings, Settings
from shared.infra.db import Database
from shared.infra.resources import Resources, topology_for
from shared.infra.settle import Delivery
from shared.providers.registry import close_all
from tests.conftest import unique
from tests.integration.faults import start_rabbitmq_app, stop_rabbitmq_app
from tests.integration.harness import batch_stats, client_for, eventually, running, served


@dataclass
class Pipeline:
    api: httpx.AsyncClient
    sandbox: httpx.AsyncClient
    key: str
    settings: Settings
    db: Database
    consumers: Any = None

    async def consumer_metrics(self) -> str:
        async with client_for(self.consumers) as client:
            return (await client.get("/metrics")).text

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    async def submit(self, to: list[str], **extra: Any) -> str:
        body = {
            "from": "Shop <shop@example.com>",
            "to": to,
            "subject": "Hi",
            "text": "Hello",
            **extra,
        }
        resp = await self.api.post("/v1/batches", json=body, headers=self.auth)
        assert resp.status_code == 202, resp.text
        return str(resp.json()["batch_id"])

    async def logs(self, batch_id: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        cursor = None
        while True:
            params = {"limit": "500", **({"cursor": cursor} if cursor else {})}
            resp = await self.api.get(
                f"/v1/batches/{batch_id}/logs", params=params, headers=self.auth
            )
            assert resp.status_code == 200, resp.text
            out.extend(resp.json()["data"])
            cursor = resp.json()["next_cursor"]
            if not cursor:
                return out

    async def settled(self, batch_id: str, count: int, done: Any, timeout: float = 60) -> Any:
        async def check() -> list[dict[str, Any]] | None:
            logs = await self.logs(batch_id)
            return logs if len(logs) == count and all(done(r) for r in logs) else None

        return await eventually(check, timeout=timeout)

    async def fault(self, provider: str, status: int, count: int | None = None) -> None:
        resp = await self.sandbox.post(
            "/_control/faults", json={"provider": provider, "status": status, "count": count}
        )
        assert resp.status_code == 201, resp.text

    async def sends(self) -> dict[str, Any]:
        resp = await self.sandbox.get("/_control/sends")
        return dict(resp.json())


def _settings(base: Settings, sandbox_url: str) -> Settings:
    providers = ProviderSettings(
        **{
            **base.providers.model_dump(),
            "sendgrid_base_url": f"{sandbox_url}/sendgrid",
            "mailgun_base_url": f"{sandbox_url}/mailgun",
        }
    )
    return base.model_copy(update={"providers": providers})


@pytest.fixture
async def sandbox_url() -> AsyncIterator[str]:
    # Webhooks go nowhere in this file: the webhook service is tested elsewhere.
    app = create_sandbox(SandboxSettings(webhook_url="http://127.0.0.1:9", webhook_delay=60))
    async with served(app) as url:
        yield url


@pytest.fixture
async def parts(
    settings: Settings, sandbox_url: str, db: Database
) -> AsyncIterator[tuple[Settings, httpx.AsyncClient, httpx.AsyncClient, str]]:
    """The API (running) and the sandbox; consumers are started by each test."""
    s = _settings(settings, sandbox_url)
    api = create_api(s)
    user_id = await accounts.ensure_user(db, unique("pipe"))
    key = await accounts.create_key(db, user_id, "pipeline")
    async with (
        running(api),
        client_for(api) as client,
        httpx.AsyncClient(base_url=sandbox_url) as sandbox,
    ):
        await api.state.resources.broker.declare()
        yield s, client, sandbox, key
        await api.state.resources.broker.delete()


@pytest.fixture
async def pipe(
    parts: tuple[Settings, httpx.AsyncClient, httpx.AsyncClient, str], db: Database
) -> AsyncIterator[Pipeline]:
    s, client, sandbox, key = parts
    consumers = create_consumers(s)
    async with running(consumers):
        yield Pipeline(client, sandbox, key, s, db, consumers)


def _emails(n: int) -> list[str]:
    tag = uuid.uuid4().hex[:8]
    return [f"r{i}.{tag}@example.com" for i in range(n)]


async def test_every_recipient_is_sent_via_sendgrid(pipe: Pipeline) -> None:
    """With healthy providers, every recipient ends `sent` through SendGrid only."""
    to = _emails(5)
    batch_id = await pipe.submit(to)

    logs = await pipe.settled(batch_id, 5, lambda r: r["event"] == "sent")

    assert {r["email"] for r in logs} == set(to)
    assert all(r["providers"] == {"sg": "sent"} and r["state"] == "queued" for r in logs)
    sends = await pipe.sends()
    assert all(sends["sendgrid"]["by_recipient"][e] == 1 for e in to)
    metrics = await pipe.consumer_metrics()
    assert 'safedelivr_recipients_sent_total{provider="sg"} 5.0' in metrics


@pytest.mark.simulated  # the World carries it (README: what carries the moved cases)
async def test_sendgrid_500_fails_over_to_mailgun_as_retry_1_once_its_query_finds_nothing(
    pipe: Pipeline,
) -> None:
    """A SendGrid 500 may have come after SendGrid took the chunk: once its query API finds
    none of it, the chunk goes out as mg.<uuid>.retry.1, and the log shows both."""
    await pipe.fault("sendgrid", 500)
    batch_id = await pipe.submit(_emails(3))

    logs = await pipe.settled(batch_id, 3, lambda r: r["event"] == "sent")

    for r in logs:
        assert r["providers"]["mg"] == "sent"
        assert r["providers"]["sg"].startswith("unknown: sg no evidence from its query API")
        assert r["status"] == {"sg": False, "mg": True}
        assert [(a["attempt"], a["provider"]) for a in r["attempts"]] == [(0, "sg"), (1, "mg")]


async def test_every_provider_down_ends_failed_with_a_reason(
    parts: tuple[Settings, httpx.AsyncClient, httpx.AsyncClient, str], db: Database
) -> None:
    """When every attempt fails the recipients end `failed` with the reason in the API.
    Two attempts, one per provider, are every provider failing: each 5xx waits for the
    query API's window, so each attempt more would only add that wait."""
    s, client, sandbox, key = parts
    s = s.model_copy(update={"providers": s.providers.model_copy(update={"max_attempts": 2})})
    consumers = create_consumers(s)
    async with running(consumers):
        await _every_provider_down(Pipeline(client, sandbox, key, s, db, consumers))


async def _every_provider_down(pipe: Pipeline) -> None:
    await pipe.fault("sendgrid", 503)
    await pipe.fault("mailgun", 503)
    batch_id = await pipe.submit(_emails(2))

    logs = await pipe.settled(batch_id, 2, lambda r: r["state"] == "failed", timeout=90)

    max_attempts = pipe.settings.providers.max_attempts
    for r in logs:
        assert r["event"] == "failed"
        assert f"all {max_attempts} attempts failed" in r["reason"]
        assert len(r["attempts"]) == max_attempts
    batch = (await pipe.api.get(f"/v1/batches/{batch_id}", headers=pipe.auth)).json()
    assert batch["status"] == "failed"
    assert batch["counts"]["failed"] == 2
    stats = await batch_stats(pipe.api, batch_id, pipe.auth)
    assert (stats["queued"], stats["failed"]) == (2, 2)
    assert "safedelivr_recipients_failed_total 2.0" in await pipe.consumer_metrics()


async def test_2500_recipients_go_out_in_three_chunks(pipe: Pipeline) -> None:
    """A batch is split into chunks no larger than the providers accept (1,000)."""
    batch_id = await pipe.submit(_emails(2500))

    await pipe.settled(batch_id, 2500, lambda r: r["event"] == "sent", timeout=120)

    batch = (await pipe.api.get(f"/v1/batches/{batch_id}", headers=pipe.auth)).json()
    assert batch["chunks"] == 3
    assert (await pipe.sends())["sendgrid"]["requests"] == 3


async def test_redelivery_after_the_provider_accepted_does_not_send_again(
    parts: tuple[Settings, httpx.AsyncClient, httpx.AsyncClient, str], db: Database
) -> None:
    """A sender that dies after the provider accepted but before the ack never sends twice."""
    s, client, sandbox, key = parts
    pipe = Pipeline(client, sandbox, key, s, db)
    to = _emails(4)
    batch_id = uuid.UUID(await pipe.submit(to))

    # Play the dying consumer by hand: fan out, take the job, send it, then vanish unacked.
    broker = Broker(s.amqp.url.get_secret_value(), topology_for(s), name="doomed")
    await broker.connect()
    dispatcher = build_dispatcher(s, Resources(db, broker))
    await Splitter(broker, BatchStore(db), lambda: Routing(("sg",), 1)).split(
        BatchJob(batch_id=batch_id)
    )
    queue = broker.topology.provider_queue("sg")
    message = await eventually(lambda: broker.get(queue))
    await dispatcher.process(message, Delivery())
    await broker.close()  # no ack: RabbitMQ redelivers the job
    await close_all(dispatcher.providers)

    async with running(create_consumers(s)):
        await eventually(lambda: _queue_empty(s, queue))
    sends = await pipe.sends()
    assert all(sends["sendgrid"]["by_recipient"][e] == 1 for e in to)
    assert sends["sendgrid"]["requests"] == 1
    attempts = await AttemptStore(db).line(batch_id, chunk_line(0))
    assert [(a.attempt, a.state) for a in attempts] == [(0, "accepted")]


async def test_an_address_suppressed_after_acceptance_is_not_mailed(
    parts: tuple[Settings, httpx.AsyncClient, httpx.AsyncClient, str], db: Database
) -> None:
    """Accepted while the consumers are down; a recipient and a cc address are suppressed
    before they start: the consumers drop the recipient (failed, counted once), leave the cc
    out, and mail the rest once."""
    s, client, sandbox, key = parts
    to, cc = _emails(3), _emails(2)
    batch_id = await Pipeline(client, sandbox, key, s, db).submit(to, cc=cc, shared=True)
    header = await BatchStore(db).header(uuid.UUID(batch_id))
    assert header is not None
    suppressions = SuppressionStore(db)
    await suppressions.add(header.user_id, to[1], reason="bounced", source="sg")
    await suppressions.add(header.user_id, cc[1], reason="manual", source="api")

    consumers = create_consumers(s)
    async with running(consumers):
        pipe = Pipeline(client, sandbox, key, s, db, consumers)
        logs = await pipe.settled(batch_id, 3, lambda r: r["event"] in ("sent", "dropped"))
        metrics = await pipe.consumer_metrics()

    shown = {r["email"]: (r["state"], r["event"], r["reason"]) for r in logs}
    assert shown[to[1]] == ("failed", "dropped", "suppressed: bounced")
    assert shown[to[0]][:2] == shown[to[2]][:2] == ("queued", "sent")
    mailed = (await pipe.sends())["sendgrid"]["by_recipient"]
    assert {e: mailed.get(e, 0) for e in to + cc} == {
        to[0]: 1, to[1]: 0, to[2]: 1, cc[0]: 1, cc[1]: 0,
    }  # fmt: skip
    stats = await batch_stats(client, batch_id, pipe.auth)
    assert (stats["queued"], stats["failed"]) == (3, 1)
    assert "safedelivr_recipients_suppressed_total 1.0" in metrics


async def _queue_empty(s: Settings, queue: str) -> bool:
    broker = Broker(s.amqp.url.get_secret_value(), topology_for(s), name="probe")
    await broker.connect()
    try:
        return await broker.queue_depth(queue) == 0
    finally:
        await broker.close()


@pytest.mark.exclusive  # stops or freezes a service every worker shares
async def test_broker_restart_mid_batch_loses_nothing(pipe: Pipeline) -> None:
    """Batches accepted before and during a broker restart are all delivered afterwards."""
    before = _emails(300)
    first = await pipe.submit(before)
    await stop_rabbitmq_app()
    try:
        during = _emails(50)
        second = await pipe.submit(during)  # 202 through the outbox while the broker is down
    finally:
        await start_rabbitmq_app()

    await pipe.settled(first, 300, lambda r: r["event"] == "sent", timeout=120)
    await pipe.settled(second, 50, lambda r: r["event"] == "sent", timeout=120)
    sends = await pipe.sends()
    assert all(sends["sendgrid"]["by_recipient"].get(e) == 1 for e in before + during)
