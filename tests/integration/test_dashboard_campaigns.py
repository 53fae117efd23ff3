"""The dashboard's Campaigns page through the real API app, Cassandra and RabbitMQ: it lists
the user's campaigns with their state, why one paused and their progress; its forms pause and
resume a campaign through the same lifecycle as ``/v1/campaigns``, and a step the state does
not allow is told on the page (409), not as an error page."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx

from services.api.contact_lists import ContactLists
from services.api.session_store import SESSION_COOKIE, SessionStore
from shared.accounts import accounts
from shared.audience.campaigns import Campaign, CampaignStore, Slice
from shared.infra.config import Settings
from shared.infra.db import Database
from shared.templates.templates import TemplateStore
from tests.conftest import unique


@dataclass(frozen=True, slots=True)
class Visitor:
    user_id: uuid.UUID
    auth: dict[str, str]
    csrf: str


async def logged_in(api: httpx.AsyncClient, db: Database) -> Visitor:
    user = await accounts.ensure_user(db, unique("camp_dash"))
    key = await accounts.create_key(db, user, "k")
    session_id, csrf = await SessionStore(db).create(user)
    api.cookies.set(SESSION_COOKIE, session_id, domain="api.test")
    return Visitor(user, {"Authorization": f"Bearer {key}"}, csrf)


async def draft(db: Database, settings: Settings, user_id: uuid.UUID, name: str) -> Campaign:
    """A draft for tomorrow (so the app's runner leaves it waiting once it is scheduled)."""
    templates = TemplateStore(db)
    template_id = await templates.create(user_id, "Autumn news", "Hi", None, "Hello", {})
    made = await ContactLists(db).create(user_id, "Subscribers")
    return await CampaignStore(db, settings.amqp.exchange).create(
        user_id,
        name,
        template_id,
        made.list_id,
        {"email": "news@example.com", "name": "News"},
        {},
        100,
        datetime.now(UTC) + timedelta(days=1),
    )


def row_of(page: str, campaign: Campaign) -> str:
    found = re.search(rf'<tr data-campaign="{campaign.campaign_id}".*?</tr>', page, re.S)
    assert found is not None, page
    return found.group(0)


async def step(
    api: httpx.AsyncClient, visitor: Visitor, campaign: Campaign, action: str
) -> httpx.Response:
    return await api.post(
        f"/campaigns/{campaign.campaign_id}/{action}",
        data={"csrf_token": visitor.csrf},
        follow_redirects=False,
    )


async def test_the_page_lists_my_campaigns_with_state_reason_and_progress(
    api: httpx.AsyncClient, db: Database, settings: Settings
) -> None:
    visitor = await logged_in(api, db)
    campaign = await draft(db, settings, visitor.user_id, "Autumn <sale>")
    sent = await api.post(
        "/v1/batches",
        json={"from": "news@example.com", "to": ["a@example.com", "b@example.com"],
              "subject": "Hi", "text": "Hello"},
        headers=visitor.auth,
    )  # fmt: skip
    assert sent.status_code == 202, sent.text
    store = CampaignStore(db, settings.amqp.exchange)
    await store.record(campaign.campaign_id, Slice(0, uuid.UUID(sent.json()["batch_id"]), 2))
    assert await store.advance(campaign, 0, "b@example.com", 2, 1)
    moved = await store.get(visitor.user_id, campaign.campaign_id)
    assert moved is not None
    assert await store.move(moved, "paused", reason="the daily recipient quota is used up")
    other = await accounts.ensure_user(db, unique("camp_other"))
    others = await draft(db, settings, other, "not mine")

    page = await api.get("/campaigns")
    home = await api.get("/")

    assert page.status_code == 200
    row = row_of(page.text, campaign)
    assert "Autumn &lt;sale&gt;" in row and 'data-state="paused"' in row
    assert "the daily recipient quota is used up" in row
    assert "1 batch · 2 released · 1 skipped" in " ".join(row.split())
    assert "2 queued · 0 delivered · 0 failed" in " ".join(row.split())
    assert "Autumn news → Subscribers" in row
    assert f'action="/campaigns/{campaign.campaign_id}/resume"' in row
    assert f'action="/campaigns/{campaign.campaign_id}/pause"' not in row
    assert str(others.campaign_id) not in page.text
    assert 'href="/campaigns"' in home.text


async def test_pause_and_resume_from_the_page_move_the_campaign(
    api: httpx.AsyncClient, db: Database, settings: Settings
) -> None:
    visitor = await logged_in(api, db)
    campaign = await draft(db, settings, visitor.user_id, "Winter news")
    scheduled = await step(api, visitor, campaign, "schedule")
    assert scheduled.status_code == 303

    paused = await step(api, visitor, campaign, "pause")
    after_pause = await api.get(paused.headers["location"])
    resumed = await step(api, visitor, campaign, "resume")
    after_resume = await api.get(resumed.headers["location"])

    assert (paused.status_code, resumed.status_code) == (303, 303)
    assert 'data-state="paused"' in row_of(after_pause.text, campaign)
    assert "“Winter news” is paused" in after_pause.text
    assert 'data-state="scheduled"' in row_of(after_resume.text, campaign)
    found = await CampaignStore(db, settings.amqp.exchange).get(
        visitor.user_id, campaign.campaign_id
    )
    assert found is not None and found.state == "scheduled"


async def test_a_step_the_state_does_not_allow_is_told_on_the_page(
    api: httpx.AsyncClient, db: Database, settings: Settings
) -> None:
    visitor = await logged_in(api, db)
    campaign = await draft(db, settings, visitor.user_id, "Spring news")

    refused = await step(api, visitor, campaign, "resume")

    assert refused.status_code == 409
    assert 'id="campaign-problem"' in refused.text
    assert "the campaign is draft: only a paused one can be resumed" in refused.text
    assert 'data-state="draft"' in row_of(refused.text, campaign)


async def test_a_schedule_at_a_time_that_cannot_be_honoured_is_told_on_the_page(
    api: httpx.AsyncClient, db: Database, settings: Settings
) -> None:
    visitor = await logged_in(api, db)
    campaign = await draft(db, settings, visitor.user_id, "Late news")

    refused = await api.post(
        f"/campaigns/{campaign.campaign_id}/schedule",
        data={"csrf_token": visitor.csrf, "send_at": "2001-01-01T09:00:00Z"},
    )

    assert refused.status_code == 422
    assert "Not done: send_at is in the past" in refused.text
    assert 'data-state="draft"' in row_of(refused.text, campaign)


async def test_a_step_without_the_csrf_token_is_refused(
    api: httpx.AsyncClient, db: Database, settings: Settings
) -> None:
    visitor = await logged_in(api, db)
    campaign = await draft(db, settings, visitor.user_id, "Summer news")

    refused = await api.post(f"/campaigns/{campaign.campaign_id}/schedule", data={"send_at": ""})

    assert refused.status_code == 403
    found = await CampaignStore(db, settings.amqp.exchange).get(
        visitor.user_id, campaign.campaign_id
    )
    assert found is not None and found.state == "draft"


async def test_a_step_on_an_id_that_is_not_a_time_uuid_is_not_found(
    api: httpx.AsyncClient, db: Database
) -> None:
    """A UUID of another version names no campaign (it must not reach a ``timeuuid``
    column, which would refuse it: a 500)."""
    visitor = await logged_in(api, db)

    refused = await api.post(
        f"/campaigns/{uuid.uuid4()}/pause",
        data={"csrf_token": visitor.csrf},
        follow_redirects=False,
    )

    assert refused.status_code == 404
    assert "no such campaign" in refused.text


async def test_a_draft_is_created_from_the_form_as_the_api_creates_one(
    api: httpx.AsyncClient, db: Database, settings: Settings
) -> None:
    visitor = await logged_in(api, db)
    template_id = await TemplateStore(db).create(visitor.user_id, "Winter", "Hi", None, "Hey", {})
    made = await ContactLists(db).create(visitor.user_id, "Readers")
    form = {
        "csrf_token": visitor.csrf,
        "name": "Winter sale",
        "from": "News <news@example.com>",
        "template_id": str(template_id),
        "list_id": str(made.list_id),
        "rate": "50",
        "send_at": "",
    }

    created = await api.post("/campaigns", data=form, follow_redirects=True)
    listed = await api.get("/v1/campaigns", headers=visitor.auth)

    assert created.status_code == 200
    assert "“Winter sale” is created as a draft" in created.text
    (campaign,) = listed.json()["data"]
    assert (campaign["name"], campaign["state"], campaign["rate"]) == ("Winter sale", "draft", 50)


async def test_a_draft_the_checks_refuse_is_told_beside_its_fields_and_not_made(
    api: httpx.AsyncClient, db: Database, settings: Settings
) -> None:
    visitor = await logged_in(api, db)
    other = await accounts.ensure_user(db, unique("camp_other"))
    theirs = await TemplateStore(db).create(other, "Not mine", "Hi", None, "Hey", {})
    await TemplateStore(db).create(visitor.user_id, "Mine", "Hi", None, "Hey", {})
    made = await ContactLists(db).create(visitor.user_id, "Readers")
    form = {
        "csrf_token": visitor.csrf,
        "name": "Sneaky",
        "from": "news@example.com",
        "template_id": str(theirs),
        "list_id": str(made.list_id),
        "rate": "lots",
    }

    refused = await api.post("/campaigns", data=form)
    listed = await api.get("/v1/campaigns", headers=visitor.auth)

    assert refused.status_code == 422
    assert 'id="rate-errors"' in refused.text
    assert 'value="Sneaky"' in refused.text
    assert listed.json()["data"] == []


async def test_another_users_template_is_not_offered_nor_taken(
    api: httpx.AsyncClient, db: Database, settings: Settings
) -> None:
    visitor = await logged_in(api, db)
    other = await accounts.ensure_user(db, unique("camp_other"))
    theirs = await TemplateStore(db).create(other, "Not mine", "Hi", None, "Hey", {})
    await TemplateStore(db).create(visitor.user_id, "Mine", "Hi", None, "Hey", {})
    made = await ContactLists(db).create(visitor.user_id, "Readers")
    form = {"csrf_token": visitor.csrf, "name": "Sneaky", "from": "news@example.com"}
    form |= {"template_id": str(theirs), "list_id": str(made.list_id)}

    shown = await api.get("/campaigns")
    refused = await api.post("/campaigns", data=form)

    assert str(theirs) not in shown.text and "Mine" in shown.text
    assert refused.status_code == 422
    assert 'id="template_id-errors"' in refused.text and "No such template of yours" in refused.text
