"""The original's ``/api/*`` routes for its existing clients (real Cassandra and RabbitMQ)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import httpx
import pytest

from services.api.session_store import SESSION_COOKIE, SessionStore
from shared.accounts import accounts
from shared.infra.config import Settings
from shared.infra.db import Database
from tests.conftest import unique

FORM = {
    "from": "shop@example.com",
    "subject": "Hi",
    "body": "<p>Hello</p>",
    "is_bulk": "true",
}


@dataclass
class Caller:
    api: httpx.AsyncClient
    db: Database
    user_id: uuid.UUID
    key: str

    def form(self, **extra: object) -> dict[str, object]:
        return {**FORM, "to": ["ann@example.com", "bob@example.com"], "api_key": self.key, **extra}

    async def login(self) -> None:
        session_id, _ = await SessionStore(self.db).create(self.user_id)
        self.api.cookies.set(SESSION_COOKIE, session_id, domain="api.test")

    async def batch(self) -> str:
        resp = await self.api.post("/api/batch", data=self.form())
        assert resp.status_code == 202, resp.text
        batch_id: str = resp.json()["batch_id"]
        return batch_id


@pytest.fixture(scope="module")
def settings(module_settings: Settings) -> Settings:
    """One stack for the module (``tests/integration/conftest.py``)."""
    return module_settings


@pytest.fixture
async def caller(module_api: httpx.AsyncClient, db: Database) -> Caller:
    """A user of the module's app, with a key and a client of their own."""
    user_id = await accounts.ensure_user(db, unique("orig"))
    key = await accounts.create_key(db, user_id, "original")
    return Caller(module_api, db, user_id, key)


async def test_post_batch_urlencoded_with_repeated_to_answers_202_in_its_shape(
    caller: Caller,
) -> None:
    resp = await caller.api.post("/api/batch", data=caller.form())

    assert resp.status_code == 202
    body = resp.json()
    assert body == {"status": "success", "batch_id": body["batch_id"]}
    view = await caller.api.get(
        f"/v1/batches/{body['batch_id']}", headers={"Authorization": f"Bearer {caller.key}"}
    )
    assert view.json()["recipients"] == 2
    assert view.json()["bulk"] is True


async def test_post_batch_multipart_is_accepted(caller: Caller) -> None:
    fields = [(k, (None, str(v))) for k, v in FORM.items()]
    fields += [("to", (None, "ann@example.com")), ("api_key", (None, caller.key))]

    resp = await caller.api.post("/api/batch/", files=fields)

    assert resp.status_code == 202, resp.text


async def test_a_user_id_that_is_not_the_keys_owner_is_refused(caller: Caller) -> None:
    resp = await caller.api.post("/api/batch", data=caller.form(user_id=str(uuid.uuid4())))

    assert resp.status_code == 403
    assert resp.json() == {"error": "Access denied"}


async def test_the_keys_own_user_id_is_accepted(caller: Caller) -> None:
    resp = await caller.api.post("/api/batch", data=caller.form(user_id=str(caller.user_id)))

    assert resp.status_code == 202


@pytest.mark.parametrize(
    "change",
    [{"to": ["not-an-address"]}, {"subject": ""}, {"body": ""}, {"from": "x@y"}],
)
async def test_missing_or_invalid_essentials_are_a_400(
    caller: Caller, change: dict[str, object]
) -> None:
    resp = await caller.api.post("/api/batch", data=caller.form(**change))

    assert resp.status_code == 400
    assert resp.json() == {"error": "Wrong parameters sent"}


async def test_no_credentials_is_a_403(caller: Caller) -> None:
    form = caller.form()
    del form["api_key"]

    resp = await caller.api.post("/api/batch", data=form)

    assert resp.status_code == 403
    assert resp.json() == {"error": "Access denied"}


async def test_a_session_post_from_another_site_is_refused(caller: Caller) -> None:
    await caller.login()
    form = caller.form()
    del form["api_key"]

    foreign = await caller.api.post(
        "/api/batch", data=form, headers={"Origin": "https://evil.example"}
    )
    ours = await caller.api.post("/api/batch", data=form, headers={"Origin": "http://api.test"})

    assert foreign.status_code == 403
    assert ours.status_code == 202


async def test_get_batch_shows_its_row_with_options(caller: Caller) -> None:
    batch_id = await caller.batch()

    resp = await caller.api.get(
        f"/api/batch/{batch_id}", params={"api_key": caller.key, "user_id": str(caller.user_id)}
    )

    assert resp.status_code == 200
    row = resp.json()
    assert row["batch_id"] == batch_id
    assert row["user_id"] == str(caller.user_id)
    assert row["subject"] == "Hi"
    assert row["options"] == {
        "from": "shop@example.com",
        "subject": "Hi",
        "content": "<p>Hello</p>",
        "isBulk": "true",
        "name": "",
        "to": "ann@example.com,bob@example.com",
    }


@pytest.mark.parametrize(
    ("path", "status", "error"),
    [
        ("/api/batch/short", 400, "Invalid Batch ID"),
        ("/api/batch/" + "z" * 36, 400, "Invalid Batch ID"),
        ("/api/batch/9f1c2d3e-4b5a-4c6d-8e7f-0a1b2c3d4e5f", 404, "Batch doesn't exists"),
    ],
)
async def test_bad_or_unknown_batch_ids(caller: Caller, path: str, status: int, error: str) -> None:
    resp = await caller.api.get(path, params={"api_key": caller.key})

    assert resp.status_code == status
    assert resp.json() == {"error": error}


async def test_another_users_batch_is_not_found(caller: Caller, db: Database) -> None:
    batch_id = await caller.batch()
    stranger = await accounts.create_key(db, await accounts.ensure_user(db, unique("x")), "x")

    resp = await caller.api.get(f"/api/batch/{batch_id}", params={"api_key": stranger})

    assert resp.status_code == 404


async def test_logs_list_each_recipient_in_the_original_columns_and_page(caller: Caller) -> None:
    batch_id = await caller.batch()

    first = await caller.api.get(f"/api/batch/{batch_id}/logs", params={"api_key": caller.key})
    second = await caller.api.get(
        f"/api/batch/{batch_id}/logs", params={"api_key": caller.key, "page": "2"}
    )

    assert first.status_code == 200
    rows = first.json()
    assert {r["email"] for r in rows} == {"ann@example.com", "bob@example.com"}
    assert set(rows[0]) == {
        "log_id",
        "batch_id",
        "user_id",
        "email",
        "state",
        "status",
        "created_at",
        "last_update",
    }
    assert {r["state"] for r in rows} == {"queued"}
    assert second.json() == []


async def test_batches_lists_the_users_batches_newest_first(caller: Caller) -> None:
    older, newer = await caller.batch(), await caller.batch()

    resp = await caller.api.get("/api/batches", params={"api_key": caller.key})

    assert [r["batch_id"] for r in resp.json()] == [newer, older]
    assert resp.json()[0]["options"]["isBulk"] == "true"


async def test_stats_list_todays_activity_at_utc_midnight(caller: Caller) -> None:
    await caller.batch()
    await caller.login()

    resp = await caller.api.get("/api/stats")

    assert resp.status_code == 200
    [today] = resp.json()
    assert today["user_id"] == str(caller.user_id)
    assert today["date"].endswith("T00:00:00Z")
    assert today["queued"] >= 1


async def test_user_needs_a_session_and_never_shows_a_key(caller: Caller) -> None:
    anonymous = await caller.api.get("/api/user")
    await caller.login()
    resp = await caller.api.get("/api/user")

    assert anonymous.status_code == 403
    assert anonymous.json() == {"error": "Please Login first"}
    assert resp.json()["success"] is True
    assert resp.json()["uuid"] == str(caller.user_id)
    assert resp.json()["api_key"] is None


async def test_a_json_body_is_not_read_as_the_original_never_parsed_one(caller: Caller) -> None:
    resp = await caller.api.post(
        "/api/batch", params={"api_key": caller.key}, json={**FORM, "to": ["ann@example.com"]}
    )

    assert resp.status_code == 400
    assert resp.json() == {"error": "Wrong parameters sent"}


async def test_fields_may_come_from_the_query_string_too(caller: Caller) -> None:
    resp = await caller.api.post(
        "/api/batch", params={"api_key": caller.key, "to": "ann@example.com"}, data=FORM
    )

    assert resp.status_code == 202
