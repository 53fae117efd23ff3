"""``/v1/campaigns`` requests through the real API app and Cassandra that must be refused
cleanly: a schedule body over the size cap (413, read no further), ids that are not ours (a
UUID of another version would reach a ``timeuuid`` column: 422, never a 500); and a schedule
with no body keeps the time the campaign was made with."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from services.api.contact_lists import ContactLists
from shared.accounts import accounts
from shared.audience.campaigns import Campaign, CampaignStore
from shared.infra.config import Settings
from shared.infra.db import Database
from shared.templates.templates import TemplateStore
from tests.conftest import unique


async def new_user(db: Database) -> tuple[uuid.UUID, dict[str, str]]:
    user = await accounts.ensure_user(db, unique("camp_req"))
    key = await accounts.create_key(db, user, "k", scopes=("send", "read"))
    return user, {"Authorization": f"Bearer {key}"}


async def draft(db: Database, settings: Settings, user_id: uuid.UUID) -> Campaign:
    """A draft for tomorrow (the app's runner leaves it waiting once it is scheduled)."""
    template_id = await TemplateStore(db).create(user_id, "News", "Hi", None, "Hello", {})
    made = await ContactLists(db).create(user_id, "Subscribers")
    return await CampaignStore(db, settings.amqp.exchange).create(
        user_id,
        "Autumn",
        template_id,
        made.list_id,
        {"email": "news@example.com", "name": "News"},
        {},
        100,
        (datetime.now(UTC) + timedelta(days=1)).replace(microsecond=0),
    )


async def test_a_schedule_body_over_the_limit_is_a_413_and_changes_nothing(
    api: httpx.AsyncClient, db: Database, settings: Settings
) -> None:
    user, auth = await new_user(db)
    campaign = await draft(db, settings, user)
    path = f"/v1/campaigns/{campaign.campaign_id}"
    sent = 0

    async def endless() -> AsyncIterator[bytes]:
        """A body streamed without a length, that never ends: only the cap stops it."""
        nonlocal sent
        yield b'{"send_at": "'
        while True:
            sent += 1
            yield b"x" * 16_384

    answer = await api.post(
        f"{path}/schedule", content=endless(), headers=auth | {"Content-Type": "application/json"}
    )

    assert (answer.status_code, answer.json()["error"]["code"]) == (413, "body_too_large")
    assert sent <= 5  # refused once past 64 KiB, not buffered first
    assert (await api.get(path, headers=auth)).json()["state"] == "draft"


@pytest.mark.parametrize("body", [b"", b"  \n"], ids=["empty", "blank"])
async def test_a_schedule_without_a_body_keeps_the_campaigns_time(
    api: httpx.AsyncClient, db: Database, settings: Settings, body: bytes
) -> None:
    user, auth = await new_user(db)
    campaign = await draft(db, settings, user)

    answer = await api.post(
        f"/v1/campaigns/{campaign.campaign_id}/schedule", content=body, headers=auth
    )

    assert answer.status_code == 200, answer.text
    assert answer.json()["state"] == "scheduled"
    assert campaign.send_at is not None
    assert datetime.fromisoformat(answer.json()["send_at"]) == campaign.send_at


@pytest.mark.parametrize(
    ("body", "content_type", "status", "code"),
    [
        (b"{not json", "application/json", 400, "malformed_json"),
        (b'{"send_at": null}', "text/plain", 415, "unsupported_media_type"),
    ],
    ids=["malformed", "not-json"],
)
async def test_a_schedule_body_that_is_not_json_is_refused_and_changes_nothing(
    api: httpx.AsyncClient,
    db: Database,
    settings: Settings,
    body: bytes,
    content_type: str,
    status: int,
    code: str,
) -> None:
    user, auth = await new_user(db)
    campaign = await draft(db, settings, user)
    path = f"/v1/campaigns/{campaign.campaign_id}"

    answer = await api.post(
        f"{path}/schedule", content=body, headers=auth | {"Content-Type": content_type}
    )

    assert (answer.status_code, answer.json()["error"]["code"]) == (status, code)
    assert (await api.get(path, headers=auth)).json()["state"] == "draft"


@pytest.mark.parametrize("field", ["template_id", "list_id"])
async def test_an_id_that_is_not_a_time_uuid_is_a_422_naming_it(
    api: httpx.AsyncClient, db: Database, field: str
) -> None:
    user, auth = await new_user(db)
    template_id = await TemplateStore(db).create(user, "News", "Hi", None, "Hello", {})
    made = await ContactLists(db).create(user, "Subscribers")
    body = {
        "name": "x",
        "template_id": str(template_id),
        "list_id": str(made.list_id),
        "from": "news@example.com",
        field: str(uuid.uuid4()),
    }

    answer = await api.post("/v1/campaigns", json=body, headers=auth)

    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["code"] == "invalid_fields"
    assert list(answer.json()["error"]["fields"]) == [field]
