"""Campaigns on real services (API with its runner, consumers, RabbitMQ, Cassandra, sandbox
providers and webhooks): each lifecycle step, a campaign sent to its whole list once with
each contact's own fields, a pause that stops dispatch within a second and a resume that
sends the rest with nothing lost or sent twice, a cancelled schedule that sends nothing,
suppressed contacts left out."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from services.api.campaign_runner import CampaignRunner
from services.api.contact_lists import ContactLists
from services.api.contacts_csv import Contact
from shared.delivery.schedule_store import ScheduleStore
from shared.infra.config import Settings
from shared.infra.db import Database
from shared.templates.templates import TemplateStore
from tests.integration.harness import eventually
from tests.integration.stack import Stack, emails, fast_settings, full_stack


@pytest.fixture
async def stack(settings: Settings, db: Database) -> AsyncIterator[Stack]:
    async with full_stack(fast_settings(settings), db) as s:
        yield s


async def _template(stack: Stack) -> uuid.UUID:
    store = TemplateStore(stack.db)
    tid = await store.create(
        stack.user_id, "news", "News for {{ first_name }}", "<p>Hi {{ first_name }}</p>", None, {}
    )
    template = await store.get(stack.user_id, tid)
    assert template is not None
    await store.publish(template, 1)
    return tid


async def _list(stack: Stack, addresses: list[str]) -> uuid.UUID:
    lists = ContactLists(stack.db)
    made = await lists.create(stack.user_id, f"list-{uuid.uuid4().hex[:6]}")
    contacts = [Contact(a, {"first_name": a.split(".")[0]}) for a in addresses]
    await lists.put(made.list_id, contacts)
    await lists.set_count(stack.user_id, made.list_id, len(contacts))
    return made.list_id


async def _create(stack: Stack, to: list[str], **more: Any) -> dict[str, Any]:
    body = {
        "name": "November news",
        "template_id": str(await _template(stack)),
        "list_id": str(await _list(stack, to)),
        "from": "News <news@example.com>",
        **more,
    }
    resp = await stack.api.post("/v1/campaigns", json=body, headers=stack.auth)
    assert resp.status_code == 201, resp.text
    made: dict[str, Any] = resp.json()
    return made


async def _step(stack: Stack, campaign: dict[str, Any], step: str, **body: Any) -> Any:
    """One lifecycle step, retried as a client would while the API answers 503 (a
    lightweight transaction that timed out on a loaded machine)."""
    for _ in range(10):
        resp = await stack.api.post(
            f"/v1/campaigns/{campaign['id']}/{step}", json=body or None, headers=stack.auth
        )
        if resp.status_code != 503:
            return resp
        await asyncio.sleep(0.5)
    raise AssertionError(f"{step}: 503 ten times: {resp.text}")


async def _get(stack: Stack, campaign: dict[str, Any]) -> dict[str, Any]:
    resp = await stack.api.get(f"/v1/campaigns/{campaign['id']}", headers=stack.auth)
    assert resp.status_code == 200, resp.text
    found: dict[str, Any] = resp.json()
    return found


async def _received(stack: Stack, addresses: list[str]) -> dict[str, int]:
    sends = (await stack.sandbox.get("/_control/sends")).json()
    counts: dict[str, int] = {}
    for ledger in sends.values():
        for email, n in ledger["by_recipient"].items():
            counts[email] = counts.get(email, 0) + n
    return {a: counts.get(a.lower(), 0) for a in addresses}


async def _state(stack: Stack, campaign: dict[str, Any], state: str, timeout: float = 60) -> Any:
    async def check() -> dict[str, Any] | None:
        found = await _get(stack, campaign)
        return found if found["state"] == state else None

    return await eventually(check, timeout=timeout, interval=0.3)


async def test_a_campaign_goes_through_its_lifecycle_to_sent(stack: Stack) -> None:
    to = emails(30)
    campaign = await _create(stack, to)
    assert campaign["state"] == "draft"

    async with stack.consuming():
        scheduled = (await _step(stack, campaign, "schedule")).json()
        assert scheduled["state"] in ("scheduled", "sending", "sent"), scheduled
        await _state(stack, campaign, "sent")

        async def all_final() -> dict[str, Any] | None:
            found = await _get(stack, campaign)
            return found if found["progress"]["success"] == len(to) else None

        done = await eventually(all_final, timeout=60, interval=0.5)
        inbox = await stack.sandbox.get("/_control/messages", params={"to": to[0]})

    assert done["progress"]["released"] == len(to)
    assert done["progress"]["queued"] == done["progress"]["failed"] == 0
    assert await _received(stack, to) == dict.fromkeys(to, 1)
    first = to[0].split(".")[0]
    assert inbox.json()[0]["subject"] == f"News for {first}"
    unsubscribe = inbox.json()[0]["headers"].get("List-Unsubscribe-Post")
    assert unsubscribe == "List-Unsubscribe=One-Click"  # bulk mail: one-click unsubscribe


@pytest.mark.exclusive  # bounds how long dispatch goes on after the pause
async def test_pause_stops_dispatch_within_a_second_and_resume_sends_the_rest_once(
    stack: Stack,
) -> None:
    to = emails(3000)
    campaign = await _create(stack, to, rate=1000)  # a slice of 500 per pass

    async with stack.consuming():
        assert (await _step(stack, campaign, "schedule")).status_code == 200

        async def started() -> bool:
            return sum((await _received(stack, to)).values()) > 0

        await eventually(started, timeout=30, interval=0.1)
        paused = await _step(stack, campaign, "pause")
        # About a second: the consumers look a campaign up at most every half second, and a
        # call that passed the check just before has to reach the provider on a loaded box.
        await asyncio.sleep(1.5)
        at_pause = sum((await _received(stack, to)).values())
        await asyncio.sleep(4.0)
        later = sum((await _received(stack, to)).values())
        assert paused.status_code == 200 and paused.json()["state"] == "paused"
        assert later == at_pause, "dispatch went on more than a second after the pause"
        assert later < len(to)

        resumed = await _step(stack, campaign, "resume")
        assert resumed.json()["state"] == "sending"
        await _state(stack, campaign, "sent", timeout=90)

        async def all_in() -> dict[str, int] | None:
            got = await _received(stack, to)
            return got if all(got.values()) else None

        got = await eventually(all_in, timeout=90, interval=0.5)

    assert got == dict.fromkeys(to, 1)  # nothing lost, nothing twice


async def test_a_cancelled_scheduled_campaign_sends_nothing(stack: Stack) -> None:
    to = emails(5)
    # 10 s away: the schedule and its cancel land first even on a loaded machine.
    send_at = (datetime.now(UTC) + timedelta(seconds=10)).isoformat()
    campaign = await _create(stack, to, send_at=send_at)

    async with stack.consuming():
        scheduled = await _step(stack, campaign, "schedule")
        cancelled = await _step(stack, campaign, "cancel")
        again = await _step(stack, campaign, "cancel")
        await asyncio.sleep(12)  # past its time, with the runner going

    assert scheduled.json()["state"] == "scheduled"
    assert cancelled.json()["state"] == again.json()["state"] == "cancelled"
    assert (await _get(stack, campaign))["progress"]["batches"] == 0
    assert await _received(stack, to) == dict.fromkeys(to, 0)


async def test_a_step_the_state_does_not_allow_is_a_409(stack: Stack) -> None:
    campaign = await _create(stack, emails(1))

    resumed = await _step(stack, campaign, "resume")
    paused = await _step(stack, campaign, "pause")
    await _step(stack, campaign, "cancel")
    rescheduled = await _step(stack, campaign, "schedule")

    assert resumed.status_code == paused.status_code == rescheduled.status_code == 409
    assert "draft" in resumed.json()["error"]["message"]
    assert "cancelled" in rescheduled.json()["error"]["message"]


async def test_suppressed_contacts_are_left_out_and_counted(stack: Stack) -> None:
    to = emails(6)
    resp = await stack.api.post("/v1/suppressions", json={"email": to[0]}, headers=stack.auth)
    assert resp.status_code in (200, 201), resp.text
    campaign = await _create(stack, to)

    async with stack.consuming():
        assert (await _step(stack, campaign, "schedule")).status_code == 200
        done = await _state(stack, campaign, "sent")

    assert done["progress"]["released"] == 5
    assert done["progress"]["skipped"] == 1
    assert (await _received(stack, [to[0]]))[to[0]] == 0


async def test_another_users_campaign_is_a_404(stack: Stack, db: Database) -> None:
    from shared.accounts import accounts
    from tests.conftest import unique

    campaign = await _create(stack, emails(1))
    other = await accounts.ensure_user(db, unique("other"))
    key = await accounts.create_key(db, other, "other")
    auth = {"Authorization": f"Bearer {key}"}

    read = await stack.api.get(f"/v1/campaigns/{campaign['id']}", headers=auth)
    paused = await stack.api.post(f"/v1/campaigns/{campaign['id']}/cancel", headers=auth)

    assert read.status_code == paused.status_code == 404
    assert (await _get(stack, campaign))["state"] == "draft"


async def test_a_campaign_naming_an_unknown_list_or_template_is_a_422(stack: Stack) -> None:
    body = {
        "name": "x",
        "template_id": str(uuid.uuid1()),
        "list_id": str(uuid.uuid1()),
        "from": "news@example.com",
    }
    resp = await stack.api.post("/v1/campaigns", json=body, headers=stack.auth)

    assert resp.status_code == 422
    assert "template_id" in resp.json()["error"]["fields"]


async def test_a_draft_listed_by_a_schedule_in_flight_is_not_dropped_by_the_runner(
    stack: Stack,
) -> None:
    """A schedule lists the campaign for the runners before its conditional update lands:
    a runner pass in between sees a draft and must leave it listed (else the campaign would
    end up scheduled and never looked at)."""
    campaign = await _create(stack, emails(2))
    state = stack.api_app.state
    store = state.campaigns.store
    found = await store.get(stack.user_id, uuid.UUID(campaign["id"]))
    assert found is not None
    stale = dataclasses.replace(found, state="paused")
    assert not await store.move(stale, "scheduled")  # listed, but the update did not land
    runner = CampaignRunner(
        store,
        state.campaigns.lists,
        state.template_store,
        state.sending,
        ScheduleStore(stack.db, f"{stack.settings.amqp.exchange}:probe"),
    )

    await runner.pass_once()
    await runner.lease.release()

    assert (stack.user_id, found.campaign_id) in await store.runs()
    async with stack.consuming():
        assert (await _step(stack, campaign, "schedule")).status_code == 200
        await _state(stack, campaign, "sent")
