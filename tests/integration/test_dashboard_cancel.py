"""The batch page's Cancel through the real API app and Cassandra: a scheduled batch is
cancelled as ``POST /v1/batches/{id}/cancel`` does; a batch that already started is a 409
page; another user's batch is a 404; a form without the CSRF token changes nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

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
    return await visit(api, db, "cancel_dash")


async def batch(api: httpx.AsyncClient, visitor: Visitor, *, later: bool) -> str:
    body = {"from": "shop@example.com", "to": ["ann@example.com"], "subject": "S", "text": "T"}
    if later:
        body["send_at"] = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    made = await api.post("/v1/batches", json=body, headers=visitor.auth)
    assert made.status_code == 202, made.text
    batch_id: str = made.json()["batch_id"]
    return batch_id


async def test_a_scheduled_batch_is_cancelled_from_its_page(
    api: httpx.AsyncClient, db: Database
) -> None:
    visitor = await logged_in(api, db)
    batch_id = await batch(api, visitor, later=True)
    shown = await api.get(f"/batches/{batch_id}")

    cancelled = await api.post(f"/batches/{batch_id}/cancel", data={"csrf_token": visitor.csrf})
    status = (await api.get(f"/v1/batches/{batch_id}", headers=visitor.auth)).json()["status"]

    assert f'action="/batches/{batch_id}/cancel"' in shown.text
    assert cancelled.status_code == 200 and "The batch was cancelled" in cancelled.text
    assert f'action="/batches/{batch_id}/cancel"' not in cancelled.text
    assert status == "cancelled"


async def test_a_batch_that_started_is_not_cancelled(api: httpx.AsyncClient, db: Database) -> None:
    visitor = await logged_in(api, db)
    batch_id = await batch(api, visitor, later=False)

    refused = await api.post(f"/batches/{batch_id}/cancel", data={"csrf_token": visitor.csrf})

    assert refused.status_code == 409
    assert "only a scheduled batch can be cancelled" in refused.text


async def test_another_users_batch_is_not_found_and_a_tokenless_form_refused(
    api: httpx.AsyncClient, db: Database
) -> None:
    owner = await logged_in(api, db)
    batch_id = await batch(api, owner, later=True)
    tokenless = await api.post(f"/batches/{batch_id}/cancel", data={"csrf_token": ""})
    visitor = await logged_in(api, db)

    theirs = await api.post(f"/batches/{batch_id}/cancel", data={"csrf_token": visitor.csrf})
    status = (await api.get(f"/v1/batches/{batch_id}", headers=owner.auth)).json()["status"]

    assert (tokenless.status_code, theirs.status_code) == (403, 404)
    assert status == "scheduled"
