"""POST /v1/batches validation, auth and idempotency against real Cassandra and RabbitMQ."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import httpx
import pytest

from shared.accounts import accounts
from shared.accounts.ratelimit import RecipientQuota
from shared.delivery.batchstore import BatchStore
from shared.infra.config import Settings
from shared.infra.db import Database
from tests.conftest import unique


@pytest.fixture(scope="module")
def settings(module_settings: Settings) -> Settings:
    """One stack for the module (``tests/integration/conftest.py``)."""
    return module_settings


@pytest.fixture
def api(module_api: httpx.AsyncClient) -> httpx.AsyncClient:
    return module_api


GOOD = {
    "from": "Shop <shop@example.com>",
    "to": ["ann@example.com"],
    "subject": "Hi",
    "text": "Hello",
}


@pytest.fixture
async def key(db: Database) -> str:
    user_id = await accounts.ensure_user(db, unique("user"))
    return await accounts.create_key(db, user_id, "test")


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def _batch_count(db: Database, key: str) -> int:
    record = await accounts.authenticate(db, key)
    assert record is not None
    rows = await db.rows(
        "SELECT batch_id FROM batches_by_user WHERE user_id = ? ALLOW FILTERING", (record.user_id,)
    )
    return len(rows)


async def test_accepted_batch_returns_202_with_counts(api: httpx.AsyncClient, key: str) -> None:
    """A valid batch is accepted; rejected addresses are reported, duplicates collapsed."""
    body = {**GOOD, "to": "ann@example.com, ANN@example.com, not-an-address, bob@example.com"}
    resp = await api.post("/v1/batches", json=body, headers=auth(key))

    assert resp.status_code == 202, resp.text
    data = resp.json()
    assert data["accepted"] == 2
    assert [r["email"] for r in data["rejected"]] == ["not-an-address"]


async def test_a_suppressed_address_given_as_a_copy_is_not_mailed(
    api: httpx.AsyncClient, key: str, db: Database
) -> None:
    """A suppressed address is dropped from cc and bcc too, and reported as suppressed."""
    cc, bcc = f"{unique('cc')}@example.com", f"{unique('bcc')}@example.com"
    for email in (cc, bcc):
        added = await api.post("/v1/suppressions", json={"email": email}, headers=auth(key))
        assert added.status_code in (200, 201), added.text
    shouted = bcc.split("@")[0].upper() + "@example.com"  # the same address key
    body = {**GOOD, "cc": [cc, "kept@example.com"], "bcc": [shouted]}

    resp = await api.post("/v1/batches", json=body, headers=auth(key))

    assert resp.status_code == 202, resp.text
    assert sorted(resp.json()["suppressed"]) == sorted([cc, shouted])
    header = await BatchStore(db).header(uuid.UUID(resp.json()["batch_id"]))
    assert header is not None
    assert [a.email for a in header.message.cc] == ["kept@example.com"]
    assert header.message.bcc == ()


async def test_unknown_key_and_wrong_secret_get_the_same_401(
    api: httpx.AsyncClient, key: str
) -> None:
    """Unknown key id, wrong secret, garbage and no header all answer one identical 401 body."""
    wrong_secret = key[:-1] + ("A" if key[-1] != "A" else "B")
    unknown_id = "sd_live_" + "a" * 12 + key[len("sd_live_") + 12 :]
    bodies = set()
    for headers in [auth(wrong_secret), auth(unknown_id), auth("garbage"), {}]:
        resp = await api.post("/v1/batches", json=GOOD, headers=headers)
        assert resp.status_code == 401
        bodies.add(resp.content)

    assert len(bodies) == 1


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, "malformed_json"),
        (b'{"from": "a@example.com"}', 422, "invalid_fields"),
        (
            b'{"from":"a@example.com","to":["b@example.com"],"subject":"Hi\\r\\nBcc: x@evil.com",'
            b'"text":"x"}',
            422,
            "invalid_fields",
        ),
        (
            b'{"from":"a@example.com","to":["b@example.com"],"subject":"=?UTF-8?Q?=0A?=",'
            b'"text":"x"}',
            422,
            "invalid_fields",
        ),
        (b'{"from":"a@example.com","to":["nope"],"subject":"s","text":"x"}', 422, "no_recipients"),
    ],
)
async def test_invalid_input_gets_its_status_and_stores_nothing(
    api: httpx.AsyncClient, key: str, db: Database, body: bytes, status: int, code: str
) -> None:
    """Each kind of bad input answers its status and code, and no batch is stored."""
    resp = await api.post(
        "/v1/batches", content=body, headers={**auth(key), "Content-Type": "application/json"}
    )

    assert resp.status_code == status, resp.text
    assert resp.json()["error"]["code"] == code
    assert await _batch_count(db, key) == 0


async def test_too_many_recipients_is_422(
    api: httpx.AsyncClient, key: str, settings: Settings, db: Database
) -> None:
    """More recipients than the cap is refused before anything is stored: no batch, no
    recipient charged to the daily quota, no claim on its Idempotency-Key."""
    to = [f"r{i}@example.com" for i in range(settings.api.max_recipients + 1)]
    idem = unique("order")
    resp = await api.post(
        "/v1/batches", json={**GOOD, "to": to}, headers={**auth(key), "Idempotency-Key": idem}
    )

    assert resp.status_code == 422
    assert resp.json()["error"]["code"] == "too_many_recipients"
    record = await accounts.authenticate(db, key)
    assert record is not None
    assert await _batch_count(db, key) == 0
    quota = RecipientQuota(db, settings.api.daily_recipient_quota)
    assert await quota.used(record.user_id, datetime.now(UTC).date()) == 0
    claim = await db.one(
        "SELECT batch_id FROM idempotency_keys WHERE user_id = ? AND key = ?",
        (record.user_id, idem),
    )
    assert claim is None


async def test_oversized_body_is_413(api: httpx.AsyncClient, key: str, settings: Settings) -> None:
    """A body over the cap is refused with 413 even without a Content-Length header."""

    async def stream() -> AsyncIterator[bytes]:
        for _ in range(settings.api.max_body_bytes // 65536 + 2):
            yield b" " * 65536

    resp = await api.post("/v1/batches", content=stream(), headers=auth(key))

    assert resp.status_code == 413


async def test_same_idempotency_key_twice_gives_one_batch(
    api: httpx.AsyncClient, key: str, db: Database
) -> None:
    """Repeating a request with its Idempotency-Key returns the first batch; no second one."""
    headers = {**auth(key), "Idempotency-Key": unique("order")}
    first = await api.post("/v1/batches", json=GOOD, headers=headers)
    second = await api.post("/v1/batches", json=GOOD, headers=headers)

    assert first.status_code == second.status_code == 202
    assert first.json()["batch_id"] == second.json()["batch_id"]
    assert await _batch_count(db, key) == 1


async def test_idempotency_key_with_another_body_is_409(api: httpx.AsyncClient, key: str) -> None:
    """Reusing a key with a different body is a conflict."""
    headers = {**auth(key), "Idempotency-Key": unique("order")}
    await api.post("/v1/batches", json=GOOD, headers=headers)
    other = await api.post("/v1/batches", json={**GOOD, "subject": "Other"}, headers=headers)

    assert other.status_code == 409
    assert other.json()["error"]["code"] == "idempotency_conflict"


async def test_another_users_batch_is_404(api: httpx.AsyncClient, key: str, db: Database) -> None:
    """A batch id belonging to someone else is indistinguishable from a missing one."""
    created = await api.post("/v1/batches", json=GOOD, headers=auth(key))
    other_user = await accounts.ensure_user(db, unique("other"))
    other_key = await accounts.create_key(db, other_user, "x")
    batch_id = created.json()["batch_id"]

    resp = await api.get(f"/v1/batches/{batch_id}", headers=auth(other_key))
    missing = await api.get("/v1/batches/not-a-uuid", headers=auth(key))

    assert resp.status_code == 404
    assert missing.status_code == 404


@pytest.mark.parametrize("path", ["/v1/batches/{id}", "/v1/batches/{id}/logs"])
async def test_a_uuid_that_is_not_a_time_uuid_names_no_batch(
    api: httpx.AsyncClient, key: str, path: str
) -> None:
    """Batch ids are time UUIDs; any other UUID is a 404, not a database error."""
    resp = await api.get(path.format(id=uuid.uuid4()), headers=auth(key))

    assert resp.status_code == 404
    assert resp.json()["error"]["code"] == "not_found"


async def test_revoked_key_stops_working(api: httpx.AsyncClient, db: Database) -> None:
    """Revocation takes effect on the next request."""
    user_id = await accounts.ensure_user(db, unique("rev"))
    key = await accounts.create_key(db, user_id, "r")
    record = await accounts.authenticate(db, key)
    assert record is not None
    await accounts.revoke_key(db, user_id, record.key_id)

    resp = await api.post("/v1/batches", json=GOOD, headers=auth(key))
    assert resp.status_code == 401


async def test_batches_list_newest_first_with_cursor_paging(
    api: httpx.AsyncClient, key: str
) -> None:
    """The list pages newest first through a cursor and shows each batch's status."""
    ids = [
        (await api.post("/v1/batches", json=GOOD, headers=auth(key))).json()["batch_id"]
        for _ in range(3)
    ]

    first = (await api.get("/v1/batches", params={"limit": "2"}, headers=auth(key))).json()
    rest = (
        await api.get(
            "/v1/batches", params={"limit": "2", "cursor": first["next_cursor"]}, headers=auth(key)
        )
    ).json()

    listed = [b["batch_id"] for b in first["data"] + rest["data"]]
    assert listed == ids[::-1]
    assert rest["next_cursor"] is None
    assert all(b["status"] in ("accepted", "dispatched") for b in first["data"])
