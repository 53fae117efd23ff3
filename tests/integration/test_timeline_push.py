"""The cross-provider timeline, pushed, on real services: a user's webhook endpoint receives
every attempt of a recipient and every provider report about it, signed, in the order they
happened, so "SendGrid refused (or confirmed not sent) → failed over → Mailgun accepted →
delivered" arrives without polling; opens and clicks from the tracking endpoint come the same
way."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from services.hooks.main import create_app as create_hooks
from shared.infra.config import Settings
from shared.infra.db import Database
from tests.integration.harness import eventually, running
from tests.integration.hookstack import hooks_settings
from tests.integration.stack import Stack, emails, fast_settings, full_stack


@pytest.fixture
async def stack(settings: Settings, db: Database) -> AsyncIterator[Stack]:
    base = fast_settings(settings).model_copy(update={"hooks": hooks_settings()})
    # Providers report seconds after they took the mail, as real ones do: the consumer's
    # own events then reach the queue before theirs, or within the hooks' order window of
    # them, even when its writes after the call take a second or two on a loaded machine.
    sandbox = {"webhook_delay": 3.0}
    async with full_stack(base, db, sandbox=sandbox) as s, running(create_hooks(s.settings)):
        yield s


async def _endpoint(stack: Stack, path: str, **body: Any) -> str:
    receiver = f"{stack.sandbox.base_url}/_receiver{path}".replace("//_", "/_")
    created = await stack.api.post(
        "/v1/webhooks", json={"url": receiver, **body}, headers=stack.auth
    )
    assert created.status_code == 201, created.text
    secret = created.json()["secret"]
    await stack.sandbox.post("/_control/receiver/secrets", json={"path": path, "secret": secret})
    return str(created.json()["id"])


async def _received(stack: Stack, path: str, until: Any) -> list[dict[str, Any]]:
    async def check() -> list[dict[str, Any]] | None:
        got = (await stack.sandbox.get("/_control/received", params={"path": path})).json()
        events = [{**orjson.loads(r["body"]), "_verified": r["verified"]} for r in got]
        return events if until(events) else None

    found: list[dict[str, Any]] = await eventually(check, timeout=60, interval=0.5)
    return found


@pytest.mark.parametrize(
    ("status", "outcome", "evidence"),
    [(429, "refused", "api"), (503, "confirmed not sent", "provider query")],
    ids=["refused", "server-error"],
)
async def test_a_recipients_path_across_providers_arrives_signed_and_in_order(
    stack: Stack, status: int, outcome: str, evidence: str
) -> None:
    """SendGrid refuses (429), or answers 503 and its query API then shows it sent nothing:
    the user hears that, the hand-over to Mailgun, its acceptance and delivery, in order."""
    (ann,) = emails(1)
    await _endpoint(stack, "/timeline")
    await stack.fault("sendgrid", status=status, count=1)
    async with stack.consuming():
        batch_id = await stack.submit([ann])
        got = await _received(
            stack, "/timeline", lambda evs: any(e["type"] == "recipient.delivered" for e in evs)
        )

    mine = [e for e in got if e["data"]["email"] == ann.lower()]
    steps = [(e["type"], e["data"]["provider"], e["data"]["outcome"]) for e in mine]
    assert steps[:3] == [
        ("recipient.attempt", "sg", outcome),
        ("recipient.failed_over", "sg", "to mg"),
        ("recipient.attempt", "mg", "accepted"),
    ]
    assert mine[0]["data"]["evidence"] == evidence
    assert [s[0] for s in steps[3:]] == ["recipient.sent", "recipient.delivered"]
    assert all(e["_verified"] for e in mine)
    assert {e["data"]["batch_id"] for e in mine} == {batch_id}
    assert mine[0]["data"]["attempt_id"] == "c.0"
    assert mine[-1]["data"]["evidence"] == "webhook"


async def test_an_endpoint_gets_only_the_events_it_asked_for(stack: Stack) -> None:
    ann, bob = emails(2)
    await _endpoint(stack, "/bounces", events=["recipient.bounced"])
    bounce = f"bounce.{ann}"
    async with stack.consuming():
        await stack.submit([bounce, bob])
        got = await _received(stack, "/bounces", lambda evs: len(evs) >= 1)

    assert [(e["type"], e["data"]["email"]) for e in got] == [("recipient.bounced", bounce)]
