"""Webhook delivery: retries, final failures, bounds and counters."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace

import httpx

from sandbox.app import create_app
from tests.unit.sandbox.conftest import (
    FAST,
    FORM,
    MAILGUN_AUTH,
    SENDGRID_AUTH,
    Harness,
    encoded,
    mailgun_form,
    running,
    sandbox_settings,
    sendgrid_mail,
)

SENDGRID = "/sendgrid/v3/mail/send"
MAILGUN = "/mailgun/v3/mg.example.com/messages"


async def test_failed_posts_are_retried_until_accepted(sandbox: Harness) -> None:
    """A 503 then a 500 are retried; the events then arrive, once."""
    sandbox.receiver.script = [503, 500]

    await sandbox.client.post(SENDGRID, json=sendgrid_mail("a@x.com"), headers=SENDGRID_AUTH)
    await sandbox.settle()

    counters = sandbox.state.dispatcher.counters["sendgrid"]
    assert sandbox.receiver.events_for("a@x.com") == ["processed", "delivered"]
    assert (counters.retried, counters.posted, counters.failed) == (2, 1, 0)


async def test_posts_are_dropped_and_counted_after_retries(sandbox: Harness) -> None:
    """When every attempt fails the POST is given up and counted as failed."""
    sandbox.receiver.script = [500] * (len(FAST.retry_delays) + 1)

    await sandbox.client.post(SENDGRID, json=sendgrid_mail("a@x.com"), headers=SENDGRID_AUTH)
    await sandbox.settle()

    snapshot = (await sandbox.client.get("/_control/webhooks")).json()["sendgrid"]
    assert sandbox.receiver.sendgrid == []
    assert (snapshot["failed"], snapshot["failed_events"], snapshot["retried"]) == (1, 2, 2)
    assert snapshot["last_error"] == "HTTP 500"


async def test_client_errors_are_final(sandbox: Harness) -> None:
    """A 4xx answer (Mailgun's 406 included) is not retried."""
    sandbox.receiver.script = [406]

    await sandbox.client.post(
        MAILGUN, content=encoded(mailgun_form("a@x.com")), headers={**FORM, **MAILGUN_AUTH}
    )
    await sandbox.settle()

    counters = sandbox.state.dispatcher.counters["mailgun"]
    assert (counters.failed, counters.retried, counters.posted) == (1, 0, 1)
    assert [e["event"] for e in sandbox.receiver.mailgun] == ["delivered"]


async def test_mailgun_retry_keeps_each_recipients_order(sandbox: Harness) -> None:
    """A retried Mailgun event is followed, not overtaken, by the recipient's next one."""
    sandbox.receiver.script = [503]

    await sandbox.client.post(
        MAILGUN, content=encoded(mailgun_form("complaint@x.com")), headers={**FORM, **MAILGUN_AUTH}
    )
    await sandbox.settle()

    assert [e["event"] for e in sandbox.receiver.mailgun] == ["accepted", "delivered", "complained"]


async def test_webhook_counters_are_exposed(sandbox: Harness) -> None:
    """``GET /_control/webhooks?wait=`` reports posted deliveries once idle."""
    await sandbox.client.post(SENDGRID, json=sendgrid_mail("a@x.com"), headers=SENDGRID_AUTH)
    await sandbox.client.post(
        MAILGUN, content=encoded(mailgun_form("b@x.com")), headers={**FORM, **MAILGUN_AUTH}
    )

    snapshot = (await sandbox.client.get("/_control/webhooks", params={"wait": "5"})).json()

    assert snapshot["idle"] is True
    assert (snapshot["sendgrid"]["events"], snapshot["mailgun"]["posted"]) == (2, 2)


async def test_scheduled_requests_are_bounded() -> None:
    """Beyond ``max_scheduled_recipients`` waiting recipients, new requests get no events."""
    app = create_app(sandbox_settings(), tuning=replace(FAST, max_scheduled_recipients=2))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://sandbox") as client:
        for _ in range(3):
            await client.post(
                SENDGRID, json=sendgrid_mail("a@x.com", "b@x.com"), headers=SENDGRID_AUTH
            )

    snapshot = app.state.sandbox.dispatcher.snapshot()
    assert (snapshot["scheduled"], snapshot["sendgrid"]["dropped_requests"]) == (1, 2)


async def test_pending_events_are_bounded() -> None:
    """Beyond ``max_pending_events`` queued events, new events are dropped and counted."""
    tuning = replace(FAST, max_pending_events=2, sendgrid_batch_size=2, retry_delays=(30.0,))
    async with running(tuning=tuning) as sandbox:
        counters = sandbox.state.dispatcher.counters["sendgrid"]
        sandbox.receiver.script = [503]
        await sandbox.client.post(SENDGRID, json=sendgrid_mail("a@x.com"), headers=SENDGRID_AUTH)
        await _until(lambda: counters.retried == 1)

        await sandbox.client.post(SENDGRID, json=sendgrid_mail("b@x.com"), headers=SENDGRID_AUTH)
        await _until(lambda: counters.dropped_events == 2)

        assert sandbox.state.dispatcher.snapshot()["sendgrid"]["pending_events"] == 2


async def _until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)
