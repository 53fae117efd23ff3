"""The dashboard's Preferences page through the real API app and Cassandra: what it saves is
what ``/v1/preferences`` answers (the same store and checks), a cooldown out of range is told
beside its field and nothing is saved, and a form without the CSRF token is refused."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.applications import Starlette

from shared.infra.db import Database
from tests.integration.dashboard_visits import Visitor, pages_of
from tests.integration.dashboard_visits import logged_in as visit


@pytest.fixture
async def api(module_app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    async with pages_of(module_app) as client:
        yield client


async def logged_in(api: httpx.AsyncClient, db: Database) -> Visitor:
    return await visit(api, db, "pref_dash")


async def test_what_the_page_saves_is_what_the_api_answers(
    api: httpx.AsyncClient, db: Database
) -> None:
    visitor = await logged_in(api, db)
    form = {"csrf_token": visitor.csrf, "clicks": "on", "unsubscribe": "on", "cooldown": "600"}

    saved = await api.post("/preferences", data=form)
    shown = (await api.get("/v1/preferences", headers=visitor.auth)).json()

    assert saved.status_code == 200 and "Preferences saved" in saved.text
    assert 'id="p-cooldown"' in saved.text and 'value="600"' in saved.text
    assert shown == {
        "tracking": {"opens": False, "clicks": True},
        "unsubscribe": True,
        "cooldown": {"seconds": 600, "per_category": False},
    }


async def test_a_cooldown_out_of_range_is_told_beside_its_field_and_nothing_saved(
    api: httpx.AsyncClient, db: Database
) -> None:
    visitor = await logged_in(api, db)

    answers = [
        await api.post("/preferences", data={"csrf_token": visitor.csrf, "cooldown": c})
        for c in ("10000000", "ten", "-1")
    ]
    shown = (await api.get("/v1/preferences", headers=visitor.auth)).json()

    assert [a.status_code for a in answers] == [422, 422, 422]
    assert all('id="cooldown-errors"' in a.text for a in answers)
    assert 'value="ten"' in answers[1].text
    assert shown["cooldown"]["seconds"] == 0


async def test_a_form_without_the_csrf_token_changes_nothing(
    api: httpx.AsyncClient, db: Database
) -> None:
    visitor = await logged_in(api, db)

    refused = await api.post("/preferences", data={"opens": "on"})
    shown = (await api.get("/v1/preferences", headers=visitor.auth)).json()

    assert refused.status_code == 403
    assert shown["tracking"]["opens"] is False
