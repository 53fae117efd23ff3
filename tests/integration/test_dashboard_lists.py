"""The dashboard's Lists pages through the real API app and Cassandra: a list is made, a CSV
file uploaded as the page's script does (the session cookie, ``X-CSRF-Token``, a ``text/csv``
body) and followed to its end, its contacts paged and one removed, and the list deleted, all
through the same use cases as ``/v1/lists``; another user's list is a 404 on every route; an
upload without the token is refused."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from shared.infra.db import Database
from tests.integration.dashboard_visits import Visitor, pages_of
from tests.integration.dashboard_visits import logged_in as visit
from tests.integration.harness import eventually


@pytest.fixture
async def api(module_app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    async with pages_of(module_app) as client:
        yield client


async def logged_in(api: httpx.AsyncClient, db: Database) -> Visitor:
    return await visit(api, db, "list_dash")


async def create(api: httpx.AsyncClient, visitor: Visitor, name: str) -> str:
    made = await api.post("/lists", data={"csrf_token": visitor.csrf, "name": name})
    assert made.status_code == 200, made.text
    found = re.search(r"/lists/([0-9a-f-]{36})", str(made.url))
    assert found is not None
    return found.group(1)


def csv_of(count: int) -> bytes:
    rows = [f"ann{i:03}@example.com,Ann {i},{i}" for i in range(count)]
    return ("email,name,n\n" + "\n".join(rows) + "\n").encode()


async def upload(api: httpx.AsyncClient, list_id: str, body: bytes, csrf: str) -> httpx.Response:
    return await api.post(
        f"/lists/{list_id}/imports",
        content=body,
        headers={"Content-Type": "text/csv", "X-CSRF-Token": csrf},
    )


async def finished(api: httpx.AsyncClient, list_id: str, import_id: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        job: dict[str, Any] = (await api.get(f"/lists/{list_id}/imports/{import_id}")).json()
        return job if job["state"] in ("done", "failed") else None

    done: dict[str, Any] = await eventually(check, timeout=60, interval=0.3)
    return done


async def test_a_list_is_made_imported_into_paged_and_deleted(
    api: httpx.AsyncClient, db: Database
) -> None:
    visitor = await logged_in(api, db)
    list_id = await create(api, visitor, "Readers")

    started = await upload(api, list_id, csv_of(60), visitor.csrf)
    job = await finished(api, list_id, started.json()["import_id"])
    first = await api.get(f"/lists/{list_id}")
    cursor = re.search(r'href="(/lists/[^"]+\?cursor=[^"]+)"', first.text)
    assert cursor is not None, first.text
    second = await api.get(cursor.group(1).replace("&amp;", "&"))
    removed = await api.post(
        f"/lists/{list_id}/contacts/remove",
        data={"csrf_token": visitor.csrf, "email": "ann000@example.com"},
    )
    shown = (await api.get(f"/v1/lists/{list_id}", headers=visitor.auth)).json()
    deleted = await api.post(f"/lists/{list_id}/delete", data={"csrf_token": visitor.csrf})
    gone = await api.get(f"/v1/lists/{list_id}", headers=visitor.auth)

    assert (started.status_code, started.json()["rows"]) == (202, 60)
    assert job["state"] == "done" and job["summary"] == "60 rows read: 60 added"
    assert first.text.count("<tr data-contact=") + second.text.count("<tr data-contact=") == 60
    assert "n: 7" in first.text + second.text
    assert "The contact was removed from the list." in removed.text
    assert shown["contacts"] == 59
    assert "The list was deleted with its contacts." in deleted.text
    assert gone.status_code == 404


async def test_a_blank_name_is_told_beside_its_field(api: httpx.AsyncClient, db: Database) -> None:
    visitor = await logged_in(api, db)

    refused = await api.post("/lists", data={"csrf_token": visitor.csrf, "name": "   "})

    assert refused.status_code == 422
    assert 'id="name-errors"' in refused.text and "must not be blank" in refused.text


async def test_a_file_that_cannot_be_imported_is_answered_as_the_api_does(
    api: httpx.AsyncClient, db: Database
) -> None:
    visitor = await logged_in(api, db)
    list_id = await create(api, visitor, "Broken")

    refused = await upload(api, list_id, b"", visitor.csrf)

    assert refused.status_code == 422
    assert refused.json()["error"]["code"] == "invalid_csv"


async def test_another_users_list_is_not_found(api: httpx.AsyncClient, db: Database) -> None:
    owner = await logged_in(api, db)
    list_id = await create(api, owner, "Mine")
    started = await upload(api, list_id, csv_of(2), owner.csrf)
    import_id = started.json()["import_id"]
    await finished(api, list_id, import_id)
    visitor = await logged_in(api, db)
    csrf = {"csrf_token": visitor.csrf}

    answers = [
        await api.get(f"/lists/{list_id}"),
        await api.get(f"/lists/{list_id}/imports/{import_id}"),
        await upload(api, list_id, csv_of(1), visitor.csrf),
        await api.post(f"/lists/{list_id}/delete", data=csrf),
        await api.post(
            f"/lists/{list_id}/contacts/remove", data={**csrf, "email": "ann000@example.com"}
        ),
    ]

    assert [a.status_code for a in answers] == [404] * 5
    shown = (await api.get(f"/v1/lists/{list_id}", headers=owner.auth)).json()
    assert shown["contacts"] == 2


async def test_an_upload_without_the_csrf_token_is_refused(
    api: httpx.AsyncClient, db: Database
) -> None:
    visitor = await logged_in(api, db)
    list_id = await create(api, visitor, "Guarded")

    refused = await api.post(
        f"/lists/{list_id}/imports", content=csv_of(1), headers={"Content-Type": "text/csv"}
    )

    assert refused.status_code == 403
    assert (await api.get(f"/v1/lists/{list_id}", headers=visitor.auth)).json()["contacts"] == 0
