"""Amazon SES end to end on real services: a batch pinned to ``ses`` (in a chain that has it)
goes through the SES adapter to the sandbox's SES (SigV4 checked), whose events come back as
signed SNS notifications to ``/webhooks/ses`` and settle every recipient; a notification
SNS delivers again counts once."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
import pytest

from sandbox import signing
from sandbox.ses_feed import notification, subscription_confirmation
from shared.accounts import accounts
from shared.delivery.recipients import RecipientStore
from shared.delivery.stats import StatsStore, batch_day
from shared.infra.config import SandboxSettings, Settings
from shared.infra.db import Database
from tests.conftest import unique
from tests.integration.stack import Stack, emails, fast_settings, full_stack, until


@pytest.fixture
async def stack(settings: Settings, db: Database) -> AsyncIterator[Stack]:
    async with full_stack(fast_settings(settings, chain="sg,mg,ses"), db) as s:
        yield s


async def test_a_batch_pinned_to_ses_is_delivered_through_its_signed_events(
    stack: Stack,
) -> None:
    to = [*emails(2), f"bounce.{uuid.uuid4().hex[:8]}@example.com"]
    batch_id = await stack.submit(to, provider="ses")

    async with stack.consuming():
        logs = await stack.final(batch_id, len(to))
        hooks = (await stack.sandbox.get("/_control/webhooks", params={"wait": "10"})).json()

    states = {email: (row["state"], row["event"]) for email, row in logs.items()}
    assert states == {
        to[0]: ("success", "delivered"),
        to[1]: ("success", "delivered"),
        to[2]: ("failed", "bounced"),
    }
    for email in to:
        assert await stack.accepted(email) == {"sendgrid": 0, "mailgun": 0, "ses": 1}
    # Send, then Delivery or Bounce: every notification taken, none refused.
    assert hooks["ses"]["posted"] >= 2 * len(to) - 1
    assert (hooks["ses"]["failed"], hooks["ses"]["retried"]) == (0, 0)


async def test_a_notification_delivered_again_counts_once(stack: Stack, db: Database) -> None:
    """SES's events held back (a sandbox fault), one Delivery notification posted five
    times in a row and five at once: the recipient is delivered once, counted once."""
    to = emails(1)
    await stack.fault("ses", webhooks=False)
    batch_id = await stack.submit(to, provider="ses")
    async with stack.consuming():
        row = await until(lambda: _row(db, batch_id, to[0]))
        raw = _delivery(stack, batch_id, row, to[0])
        async with httpx.AsyncClient(base_url=stack.hooks_url) as client:
            answers = [(await client.post("/webhooks/ses", content=raw)).status_code]
            answers += [(await client.post("/webhooks/ses", content=raw)).status_code
                        for _ in range(4)]  # fmt: skip
            answers += [
                r.status_code
                for r in await asyncio.gather(
                    *(client.post("/webhooks/ses", content=raw) for _ in range(5))
                )
            ]
        logs = await stack.final(batch_id, 1)

    assert answers == [200] * 10
    assert (logs[to[0]]["state"], logs[to[0]]["event"]) == ("success", "delivered")
    stats = await StatsStore(db).day(stack.user_id, batch_day(uuid.UUID(batch_id)))
    assert stats.get("success") == 1
    delivered = await db.rows(
        "SELECT kind FROM log_events WHERE batch_id = ? AND log_id = ?",
        (uuid.UUID(batch_id), row["log_id"]),
    )
    assert [r["kind"] for r in delivered].count("delivered") == 1


async def test_the_feed_unsubscribed_alerts_the_operators_once(stack: Stack, db: Database) -> None:
    """SNS confirms the SES event feed was unsubscribed: the webhook service alerts the sink
    the live settings name, once however often SNS says it."""
    user = await accounts.ensure_user(db, unique("ops"))
    ops = {
        "Authorization": f"Bearer {await accounts.create_key(db, user, 'k', scopes=('operator',))}"
    }
    sink = f"{stack.settings.providers.sendgrid_base_url.rsplit('/', 1)[0]}/_receiver/alerts"
    body = {"alerts": {"webhook_url": sink, "cool_off_s": 600}}
    assert (await stack.api.patch("/v1/settings", json=body, headers=ops)).is_success
    topic = SandboxSettings().ses_topic_arn
    fields = {
        **subscription_confirmation(topic, "https://sns.us-east-1.amazonaws.com/", time.time()),
        "Type": "UnsubscribeConfirmation",
    }
    raw = orjson.dumps({**fields, "Signature": signing.sign_sns(stack.ses_key, fields)})

    async def alerted() -> list[dict[str, Any]]:
        # Said again until the webhook service has read the new sink (within a second).
        async with httpx.AsyncClient(base_url=stack.hooks_url) as client:
            assert (await client.post("/webhooks/ses", content=raw)).status_code == 200
        received = await stack.sandbox.get("/_control/received", params={"path": "/alerts"})
        return [r for r in received.json() if "ses_unsubscribed" in r["body"]]

    found = await until(alerted, timeout=15)
    await asyncio.sleep(1)
    again = await alerted()

    assert len(found) == len(again) == 1
    assert topic in found[0]["body"]


async def _row(db: Database, batch_id: str, email: str) -> dict[str, Any] | None:
    """The recipient's row once SES accepted it (the attempt's tag is on it), with that tag
    as ``attempt``."""
    for row in await RecipientStore(db).batch_rows(uuid.UUID(batch_id)):
        tags = sorted(row.get("evidence") or ())
        if row["email"] == email and "ses" in (row.get("providers") or {}) and tags:
            return {**row, "attempt": tags[-1]}
    return None


def _delivery(stack: Stack, batch_id: str, row: dict[str, Any], email: str) -> bytes:
    """A signed Delivery notification about ``email`` from the sandbox's topic, as SNS posts
    it (the same bytes each time: SNS's redelivery of one message)."""
    tags = {
        "batch_id": [str(batch_id)],
        "chunk": [str(row["chunk"])],
        "log_id": [str(row["log_id"])],
        "sd_attempt": [str(row["attempt"]).replace(".", "-")],
    }
    now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    mail = {"timestamp": now, "messageId": "0100-replayed", "destination": [email], "tags": tags}
    delivery = {"timestamp": now, "recipients": [email], "smtpResponse": "250 2.6.0 OK"}
    record = {"eventType": "Delivery", "mail": mail, "delivery": delivery}
    fields = notification(record, SandboxSettings().ses_topic_arn, time.time())
    return orjson.dumps({**fields, "Signature": signing.sign_sns(stack.ses_key, fields)})
