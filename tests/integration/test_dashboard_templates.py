"""The Templates page's forms through the real API app and Cassandra: a version is added,
previewed with its sample data and published (live, then another as a canary) as
``/v1/templates`` does; a share the checks refuse is told on the page; another user's template
is a 404 on every route; a form without the CSRF token changes nothing."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.applications import Starlette

from shared.infra.db import Database
from shared.templates.templates import TemplateStore
from tests.integration.dashboard_visits import Visitor, pages_of
from tests.integration.dashboard_visits import logged_in as visit


@pytest.fixture
async def api(module_app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    async with pages_of(module_app) as client:
        yield client


async def logged_in(api: httpx.AsyncClient, db: Database) -> Visitor:
    return await visit(api, db, "tpl_dash")


async def template(db: Database, user_id: uuid.UUID) -> str:
    made = await TemplateStore(db).create(user_id, "Welcome", "Hi", None, "Hello", {})
    return str(made)


async def test_a_version_is_added_previewed_and_published_live_then_as_a_canary(
    api: httpx.AsyncClient, db: Database
) -> None:
    visitor = await logged_in(api, db)
    template_id = await template(db, visitor.user_id)
    csrf = {"csrf_token": visitor.csrf}

    first = await api.post(f"/templates/{template_id}/publish", data={**csrf, "version": "1"})
    added = await api.post(
        f"/templates/{template_id}/versions",
        data={
            **csrf,
            "subject": "Welcome, {{ first_name }}",
            "html": "<p>Hello {{ first_name }}</p>",
            "sample": '{"first_name": "Ann"}',
        },
    )
    shown = await api.get(f"/templates/{template_id}/preview?version=2")
    canary = await api.post(
        f"/templates/{template_id}/publish", data={**csrf, "version": "2", "canary_percent": "10"}
    )
    state = (await api.get(f"/v1/templates/{template_id}", headers=visitor.auth)).json()

    assert "Version 1 is published." in first.text
    assert "Version 2 was added" in added.text
    assert "Welcome, Ann" in shown.text
    assert 'sandbox srcdoc="&lt;p&gt;Hello Ann&lt;/p&gt;"' in shown.text
    assert "Version 2 is published." in canary.text
    assert state["live_version"] == 1
    assert (state["canary"]["version"], state["canary"]["percent"]) == (2, 10)


async def test_a_share_the_checks_refuse_is_told_on_the_page(
    api: httpx.AsyncClient, db: Database
) -> None:
    visitor = await logged_in(api, db)
    template_id = await template(db, visitor.user_id)

    refused = await api.post(
        f"/templates/{template_id}/publish",
        data={"csrf_token": visitor.csrf, "version": "1", "canary_percent": "150"},
    )
    state = (await api.get(f"/v1/templates/{template_id}", headers=visitor.auth)).json()

    assert refused.status_code == 422
    assert 'id="template-problem"' in refused.text and "canary_percent" in refused.text
    assert state["live_version"] is None


async def test_another_users_template_is_not_found(api: httpx.AsyncClient, db: Database) -> None:
    owner = await logged_in(api, db)
    template_id = await template(db, owner.user_id)
    visitor = await logged_in(api, db)
    csrf = {"csrf_token": visitor.csrf}

    answers = [
        await api.get(f"/templates/{template_id}/preview?version=1"),
        await api.post(f"/templates/{template_id}/publish", data={**csrf, "version": "1"}),
        await api.post(f"/templates/{template_id}/versions", data={**csrf, "subject": "S"}),
    ]

    assert [a.status_code for a in answers] == [404] * 3
    state = (await api.get(f"/v1/templates/{template_id}", headers=owner.auth)).json()
    assert state["live_version"] is None and len(state["versions"]) == 1


async def test_a_form_without_the_csrf_token_changes_nothing(
    api: httpx.AsyncClient, db: Database
) -> None:
    visitor = await logged_in(api, db)
    template_id = await template(db, visitor.user_id)

    refused = await api.post(f"/templates/{template_id}/publish", data={"version": "1"})

    assert refused.status_code == 403
    state = (await api.get(f"/v1/templates/{template_id}", headers=visitor.auth)).json()
    assert state["live_version"] is None
