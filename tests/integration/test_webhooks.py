"""Provider webhooks against real Cassandra and RabbitMQ: signatures, replays, state, stats."""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
from pydantic import SecretStr

from sandbox import signing
from services.webhooks.app import create_app as create_webhooks
from services.webhooks.intake import DIRECT_BUDGET
from shared.accounts import accounts
from shared.audience.suppressions import SuppressionStore
from shared.core.models import Address, Message, Recipient
from shared.delivery.batchstore import BatchStore, NewBatch
from shared.delivery.precedence import visible
from shared.delivery.recipients import RecipientStore, log_id_for
from shared.delivery.stats import StatsStore, batch_day
from shared.infra.config import Settings, WebhookSettings
from shared.infra.db import Database
from tests.conftest import unique
from tests.integration.faults import start_rabbitmq_app, stop_rabbitmq_app
from tests.integration.harness import client_for, eventually, running

MG_KEY = "test-mailgun-signing-key"


@dataclass
class Hooks:
    client: httpx.AsyncClient
    db: Database
    app: Any
    sg_key: Any
    user_id: uuid.UUID
    batch_id: uuid.UUID
    logs: dict[str, uuid.UUID]

    async def sendgrid(
        self, events: list[dict[str, Any]], *, tamper: bool = False, stamp: int | None = None
    ) -> httpx.Response:
        body = orjson.dumps(events)
        ts = str(stamp if stamp is not None else int(time.time()))
        sig = signing.sign_sendgrid(self.sg_key, ts, body)
        if tamper:
            body = body.replace(b"delivered", b"delivereD")
        return await self.client.post(
            "/webhooks/sendgrid",
            content=body,
            headers={
                "X-Twilio-Email-Event-Webhook-Signature": sig,
                "X-Twilio-Email-Event-Webhook-Timestamp": ts,
                "Content-Type": "application/json",
            },
        )

    async def mailgun(
        self,
        event_data: dict[str, Any],
        *,
        signature: dict[str, str] | None = None,
        stamp: int | None = None,
    ) -> httpx.Response:
        sig = signature or signing.mailgun_signature(MG_KEY, stamp or int(time.time()))
        body = orjson.dumps({"signature": sig, "event-data": event_data})
        return await self.client.post(
            "/webhooks/mailgun", content=body, headers={"Content-Type": "application/json"}
        )

    def sg_event(
        self, email: str, event: str, ts: int | None = None, **extra: Any
    ) -> dict[str, Any]:
        return {
            "email": email,
            "event": event,
            "timestamp": ts or int(time.time()),
            "sg_event_id": secrets.token_urlsafe(16),
            "sg_message_id": "abc.filter0001",
            "batch_id": str(self.batch_id),
            "chunk": "0",
            "log_id": str(self.logs[email]),
            **extra,
        }

    def mg_event(self, email: str, event: str, **extra: Any) -> dict[str, Any]:
        return {
            "event": event,
            "id": secrets.token_urlsafe(12),
            "timestamp": time.time(),
            "recipient": email,
            "message": {"headers": {"message-id": "x@mg"}},
            "user-variables": {
                "batch_id": str(self.batch_id),
                "chunk": "0",
                "log_id": str(self.logs[email]),
            },
            **extra,
        }

    async def row(self, email: str) -> dict[str, Any]:
        row = await RecipientStore(self.db).one(self.batch_id, 0, self.logs[email])
        assert row is not None
        seen = visible(row)
        return {**row, "state": seen.state, "event": seen.event}

    async def stats(self) -> dict[str, int]:
        return await StatsStore(self.db).day(self.user_id, batch_day(self.batch_id))

    async def timeline(self, email: str) -> list[dict[str, Any]]:
        return await self.db.rows(
            "SELECT kind, event_id FROM log_events WHERE batch_id = ? AND log_id = ?",
            (self.batch_id, self.logs[email]),
        )


@pytest.fixture
async def hooks(settings: Settings, db: Database) -> AsyncIterator[Hooks]:
    private = signing.generate_private_key()
    s = settings.model_copy(
        update={
            "webhooks": WebhookSettings(
                sendgrid_public_key=signing.public_key_base64(private),
                mailgun_signing_key=SecretStr(MG_KEY),
                deferred_deadline=2,
            )
        }
    )
    user_id = await accounts.ensure_user(db, unique("hook"))
    emails = [
        f"{n}.{uuid.uuid4().hex[:6]}@example.com"
        for n in ("ann", "bob", "cat", "dan", "eve", "fay")
    ]
    batch_id = uuid.uuid1()
    recipients = [Recipient(log_id=log_id_for(batch_id, e), email=e) for e in emails]
    message = Message(sender=Address(email="shop@example.com"), subject="s", text="t")
    # Stored and indexed, never published: nothing but this test acts on it.
    batch = NewBatch(batch_id, user_id, message, recipients, 1000)
    await BatchStore(db).write(batch)
    await BatchStore(db).index(batch)
    app = create_webhooks(s)
    async with running(app), client_for(app) as client:
        await app.state.resources.broker.declare()
        yield Hooks(
            client, db, app, private, user_id, batch_id, {r.email: r.log_id for r in recipients}
        )
        broker = app.state.resources.broker
        if not broker.connected:
            await broker.connect()
        await broker.delete()


def _first(h: Hooks, i: int = 0) -> str:
    return sorted(h.logs)[i]


async def test_signed_sendgrid_delivery_settles_the_recipient(hooks: Hooks) -> None:
    """A correctly signed delivered event marks the recipient success and counts it."""
    email = _first(hooks)
    resp = await hooks.sendgrid(
        [hooks.sg_event(email, "processed"), hooks.sg_event(email, "delivered")]
    )

    assert resp.status_code == 200, resp.text
    row = await hooks.row(email)
    assert (row["state"], row["event"]) == ("success", "delivered")
    assert (await hooks.stats()).get("success") == 1


async def test_one_byte_changed_is_401_and_nothing_stored(hooks: Hooks) -> None:
    """A body altered after signing is refused and leaves no trace."""
    email = _first(hooks)
    resp = await hooks.sendgrid([hooks.sg_event(email, "delivered")], tamper=True)

    assert resp.status_code == 401
    assert await hooks.timeline(email) == []
    assert (await hooks.row(email))["state"] == "queued"


async def test_stale_sendgrid_timestamp_is_rejected(hooks: Hooks) -> None:
    """A signature older than the tolerance is refused with a status the provider retries."""
    resp = await hooks.sendgrid(
        [hooks.sg_event(_first(hooks), "delivered")], stamp=int(time.time()) - 3600
    )
    assert resp.status_code == 401


async def test_malformed_sendgrid_body_is_400(hooks: Hooks) -> None:
    """A signed body that is not a JSON array of events is a 400."""
    body = b'{"not": "an array"}'
    ts = str(int(time.time()))
    resp = await hooks.client.post(
        "/webhooks/sendgrid",
        content=body,
        headers={
            "X-Twilio-Email-Event-Webhook-Signature": signing.sign_sendgrid(hooks.sg_key, ts, body),
            "X-Twilio-Email-Event-Webhook-Timestamp": ts,
        },
    )
    assert resp.status_code == 400


async def test_mailgun_signature_checks(hooks: Hooks) -> None:
    """Valid HMAC passes; a wrong signature or a stale timestamp is 401 and stores nothing."""
    email = _first(hooks, 1)
    bad = {**signing.mailgun_signature(MG_KEY, int(time.time())), "signature": "00" * 32}
    assert (
        await hooks.mailgun(hooks.mg_event(email, "delivered"), signature=bad)
    ).status_code == 401
    stale = signing.mailgun_signature(MG_KEY, int(time.time()) - 3600)
    assert (
        await hooks.mailgun(hooks.mg_event(email, "delivered"), signature=stale)
    ).status_code == 401
    assert await hooks.timeline(email) == []
    ok = await hooks.mailgun(hooks.mg_event(email, "delivered"))
    assert ok.status_code == 200
    assert (await hooks.row(email))["state"] == "success"


async def test_mailgun_token_reused_with_another_body_is_rejected(hooks: Hooks) -> None:
    """Mailgun signs only timestamp+token, so a token is accepted once, for one body."""
    sig = signing.mailgun_signature(MG_KEY, int(time.time()))
    first = hooks.mg_event(_first(hooks, 2), "delivered")
    assert (await hooks.mailgun(first, signature=sig)).status_code == 200
    assert (await hooks.mailgun(first, signature=sig)).status_code == 200  # same body: replay
    forged = hooks.mg_event(_first(hooks, 3), "failed", severity="permanent", reason="bounce")
    assert (await hooks.mailgun(forged, signature=sig)).status_code == 401
    assert (await hooks.row(_first(hooks, 3)))["state"] == "queued"


async def test_replayed_event_counts_once_serially_and_concurrently(hooks: Hooks) -> None:
    """The same delivered event ten times in a row and ten times at once counts once."""
    email = _first(hooks, 4)
    event = hooks.sg_event(email, "delivered")
    for _ in range(10):
        assert (await hooks.sendgrid([event])).status_code == 200
    results = await asyncio.gather(*(hooks.sendgrid([event]) for _ in range(10)))

    assert all(r.status_code == 200 for r in results)
    assert (await hooks.stats()).get("success") == 1
    assert len(await hooks.timeline(email)) == 1


async def test_delivered_before_processed_ends_delivered(hooks: Hooks) -> None:
    """Events arriving out of order still leave the later stage in the log row."""
    email = _first(hooks, 5)
    now = int(time.time())
    await hooks.sendgrid([hooks.sg_event(email, "delivered", ts=now)])
    await hooks.sendgrid([hooks.sg_event(email, "processed", ts=now)])

    row = await hooks.row(email)
    assert (row["state"], row["event"]) == ("success", "delivered")


async def test_hard_bounce_suppresses_and_is_final(hooks: Hooks) -> None:
    """A hard bounce fails the recipient, suppresses the address and counts bounced+failed."""
    email = _first(hooks)
    await hooks.sendgrid(
        [
            hooks.sg_event(
                email, "bounce", type="bounce", reason="550 5.1.1 no such user", status="5.1.1"
            )
        ]
    )

    row = await hooks.row(email)
    assert (row["state"], row["event"]) == ("failed", "bounced")
    listed = await SuppressionStore(hooks.db).suppressed(hooks.user_id, [email])
    assert email in listed
    stats = await hooks.stats()
    assert (stats.get("failed"), stats.get("bounced")) == (1, 1)


async def test_orphan_event_is_200_and_counted(hooks: Hooks) -> None:
    """An event for an unknown batch is acknowledged (so the provider stops) and counted."""
    event = {
        **hooks.sg_event(_first(hooks), "delivered"),
        "batch_id": str(uuid.uuid1()),
        "log_id": str(uuid.uuid1()),
    }
    resp = await hooks.sendgrid([event])

    assert resp.status_code == 200
    assert resp.json()["orphans"] == 1
    metrics = (await hooks.client.get("/metrics")).text
    assert 'safedelivr_webhook_orphans_total{provider="sg"} 1.0' in metrics


def _cassandra_pid() -> int:
    """The pid of whatever Cassandra listens on the configured CQL port (whoever started it)."""
    port = os.environ.get("SAFEDELIVR_CASSANDRA_PORT", "9042")
    out = subprocess.run(
        ["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True, check=True
    ).stdout
    match = re.search(r"pid=(\d+)", out)
    assert match, f"nothing listens on {port}: {out!r}"
    return int(match.group(1))


@pytest.mark.exclusive  # stops or freezes a service every worker shares
async def test_cassandra_down_queues_the_delivery_and_applies_it_later(hooks: Hooks) -> None:
    """With Cassandra frozen a verified delivery is queued durably and answered 200 at once
    (Mailgun never retries ``delivered``); it is applied when Cassandra is back."""
    email = _first(hooks, 1)
    pid = _cassandra_pid()
    os.kill(pid, signal.SIGSTOP)  # frozen: connections stay open, every request times out
    try:
        started = time.monotonic()
        resp = await hooks.mailgun(hooks.mg_event(email, "delivered"))
        answered = time.monotonic() - started
    finally:
        os.kill(pid, signal.SIGCONT)

    assert resp.status_code == 200, resp.text
    assert resp.json()["queued"] is True
    # Its direct budget, then the broker: never the driver's request timeout. The slack is
    # for a loaded machine.
    assert answered < DIRECT_BUDGET + 6

    async def applied() -> bool:
        state: str = (await hooks.row(email))["state"]
        return state == "success"

    await eventually(applied, timeout=90, interval=1)
    assert (await hooks.stats()).get("success") == 1


@pytest.mark.exclusive  # stops or freezes a service every worker shares
async def test_cassandra_and_rabbitmq_down_answers_503(hooks: Hooks) -> None:
    """Only when neither store takes a delivery does the provider get 503 (and retry)."""
    pid = _cassandra_pid()
    await stop_rabbitmq_app()
    try:
        os.kill(pid, signal.SIGSTOP)
        try:
            resp = await hooks.sendgrid([hooks.sg_event(_first(hooks, 1), "delivered")])
        finally:
            os.kill(pid, signal.SIGCONT)
    finally:
        await start_rabbitmq_app()
    assert resp.status_code == 503
    assert resp.json()["error"]["code"] == "unavailable"


async def test_reconcile_reports_and_repairs_drift(hooks: Hooks) -> None:
    """A bucket rollup that disagrees with its outcome rows is found, and --fix recounts it
    from them (never the reverse)."""
    from shared.ops.reconcile import reconcile_day
    from tests.integration.test_reconcile import corrupt_rollup

    email = _first(hooks, 2)
    await hooks.sendgrid([hooks.sg_event(email, "delivered")])
    today = batch_day(hooks.batch_id)
    mine = [hooks.user_id]
    assert (await hooks.stats()).get("success") == 1
    assert await reconcile_day(hooks.db, today, users=mine) == []
    bucket = await corrupt_rollup(hooks.db, hooks.user_id, hooks.batch_id, hooks.logs[email])
    assert (await hooks.stats()).get("success") is None

    drift = await reconcile_day(hooks.db, today, fix=True, users=mine)

    assert [(d.bucket, d.stored, d.counted.get("success")) for d in drift] == [(bucket, {}, 1)]
    assert (await hooks.stats()).get("success") == 1
    assert await reconcile_day(hooks.db, today, users=mine) == []


async def test_deferral_schedules_a_deadline_check_after_the_deadline(hooks: Hooks) -> None:
    """A deferral queues a check of the recipient that arrives once the deadline passed."""
    from shared.core.models import LogJob

    email = _first(hooks, 3)
    broker = hooks.app.state.resources.broker
    deadline = hooks.app.state.settings.webhooks.deferred_deadline
    started = time.monotonic()
    resp = await hooks.sendgrid([hooks.sg_event(email, "deferred", response="451 try later")])
    assert resp.status_code == 200

    message = await eventually(lambda: broker.get(broker.topology.log_queue("sg")), timeout=15)
    waited = time.monotonic() - started
    job = LogJob.decode(message.body)
    await message.ack()

    assert waited >= deadline
    # It waited in the deadline's own delay queue (not a shorter or longer tier), once.
    deaths = message.headers.get("x-death") or []
    assert [(d["queue"], d["reason"], d["count"]) for d in deaths] == [
        (broker.topology.delay_queue(deadline), "expired", 1)
    ]
    assert job.deferral is not None and job.log_id == hooks.logs[email]
    assert (await hooks.row(email))["event"] == "deferred"
