"""The soak's campaign: a template sent to a list while the faults run, paused and resumed
again and again, the way an anxious sender would, then checked like every other batch.

The campaign's template and list are written straight to the run's keyspace (their own
tests cover their APIs); creating, scheduling, pausing and resuming it go through the API,
each retried through the faults until the API confirms the state. At the end every slice
the campaign released is one more :class:`~chaos.verdict.Submission` (its batch, its
addresses), so the verdict holds the campaign to the same rules: each contact sent exactly
once, every outcome final, the stats equal to the outcomes. Two counts of its own: contacts
that no slice carried (``campaign_contacts_lost``) and a campaign not ``sent`` by the end of
the quiescence (``campaign_not_sent``).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from bench.stack import Stack
from chaos.clients import REQUEST_TIMEOUT, addresses
from chaos.verdict import Submission
from services.api.contact_lists import ContactLists
from services.api.contacts_csv import Contact
from shared.audience.campaigns import CampaignStore
from shared.delivery.recipients import RecipientStore
from shared.templates.templates import TemplateStore

#: Contacts of the campaign, and the rate it sends at (a few tens of seconds of sending).
CONTACTS, RATE = 2_000, 100


@dataclass(slots=True)
class CampaignRun:
    campaign_id: str
    list_contacts: int
    started: float
    """When it was scheduled (seconds since the epoch)."""
    pauses: int = 0


#: Seconds one call of the campaign's may take through the faults. Each call has its own:
#: a deadline shared from the campaign's start ran out on a loaded machine while the
#: campaign's list was still being written (a cluster node restarting for minutes).
CALL_PATIENCE = 120.0


async def _call(client: httpx.AsyncClient, api_key: str, path: str, body: Any) -> dict[str, Any]:
    """POST until the API answers 2xx (or a 409 naming the state), through the faults."""
    headers = {"Authorization": f"Bearer {api_key}"}
    deadline = time.monotonic() + CALL_PATIENCE
    wait = 0.25
    while time.monotonic() < deadline:
        try:
            resp = await client.post(path, json=body, headers=headers, timeout=REQUEST_TIMEOUT)
        except httpx.HTTPError:
            resp = None
        if resp is not None and resp.status_code in (200, 201, 409):
            found: dict[str, Any] = resp.json()
            return found
        await asyncio.sleep(wait)
        wait = min(wait * 2, 2.0)
    raise RuntimeError(f"the API did not answer {path} in time")


async def run_campaign(
    stack: Stack, *, run: str, seconds: float, printer: Callable[[str], None]
) -> CampaignRun:
    """Create and schedule the campaign, then pause and resume it until ``seconds`` pass;
    it is left resumed."""
    db = stack.db
    assert db is not None  # noqa: S101
    templates = TemplateStore(db)
    tid = await templates.create(
        stack.user_id,
        "chaos",
        "chaos campaign for {{ first_name }}",
        None,
        "Hi {{ first_name }}",
        {},
    )
    template = await templates.get(stack.user_id, tid)
    assert template is not None  # noqa: S101
    await templates.publish(template, 1)
    lists = ContactLists(db)
    made = await lists.create(stack.user_id, f"chaos-{run}")
    emails = addresses(run, 1_000_000, CONTACTS)
    await lists.put(made.list_id, [Contact(e, {"first_name": e[:6]}) for e in emails])
    await lists.set_count(stack.user_id, made.list_id, CONTACTS)
    async with httpx.AsyncClient(base_url=stack.url("api")) as client:
        body = {
            "name": f"chaos {run}",
            "template_id": str(tid),
            "list_id": str(made.list_id),
            "from": "Chaos <chaos@example.com>",
            "rate": RATE,
        }
        campaign = await _call(client, stack.api_key, "/v1/campaigns", body)
        path = f"/v1/campaigns/{campaign['id']}"
        started = time.time()
        await _call(client, stack.api_key, f"{path}/schedule", None)
        printer(f"campaign {campaign['id']}: {CONTACTS} contacts at {RATE}/s, scheduled")
        result = CampaignRun(campaign["id"], CONTACTS, started)
        ends = time.monotonic() + seconds
        while time.monotonic() < ends:
            await asyncio.sleep(random.uniform(2, 4))
            await _call(client, stack.api_key, f"{path}/pause", None)
            result.pauses += 1
            await asyncio.sleep(random.uniform(1, 3))
            await _call(client, stack.api_key, f"{path}/resume", None)
        printer(f"campaign {campaign['id']}: paused and resumed {result.pauses} times")
        return result


async def outcome(
    stack: Stack, run: CampaignRun, *, limit: float, printer: Callable[[str], None]
) -> tuple[list[Submission], dict[str, int]]:
    """Wait (up to ``limit`` seconds) for the campaign to be sent; its slices as
    submissions, and its own counts."""
    db = stack.db
    assert db is not None  # noqa: S101
    store = CampaignStore(db, stack.topology.exchange)
    campaign_id = uuid.UUID(run.campaign_id)
    deadline = time.monotonic() + limit
    campaign = await store.get(stack.user_id, campaign_id)
    while time.monotonic() < deadline and (campaign is None or campaign.state != "sent"):
        await asyncio.sleep(2)
        await stack.wait_until_available()
        campaign = await store.get(stack.user_id, campaign_id)
    state = campaign.state if campaign else "missing"
    printer(f"campaign {campaign_id}: {state}")
    recipients = RecipientStore(db)
    subs: list[Submission] = []
    carried = 0
    for part in await store.slices(campaign_id):
        rows = await recipients.batch_rows(part.batch_id)
        emails = tuple(str(r["email"]) for r in rows)
        carried += len(emails)
        sub = Submission(f"campaign-{part.slice}", emails, run.started, {str(part.batch_id)})
        subs.append(sub)
    skipped = campaign.skipped if campaign else 0
    return subs, {
        "campaign_not_sent": int(state != "sent"),
        "campaign_contacts_lost": max(0, run.list_contacts - carried - skipped),
    }
