"""The original's ``/api/*`` adapter on hostile input (real Cassandra and RabbitMQ): wrong or
revoked keys, ``user_id`` that is not the key's owner, other users' batches, garbage and
oversized form bodies, missing essentials, header injection in its fields, bad pages and
cookie posts from elsewhere. Errors keep the original's ``{"error": message}`` shape."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from services.api.session_store import SESSION_COOKIE, SessionStore
from shared.accounts import accounts
from shared.infra.config import CassandraSettings
from shared.infra.db import Database
from tests.conftest import stack_settings, unique
from tests.integration.unhappy import Account, api_client, new_account, with_api

FORM = {"from": "shop@example.com", "subject": "Hi", "body": "<p>Hello</p>"}
DENIED = {"error": "Access denied"}
WRONG = {"error": "Wrong parameters sent"}
NOT_VALID = {"error": "Not a valid api_key or user_id"}
#: A well-formed time UUID that names no batch (parameter ids stay the same run to run).
NO_BATCH = "6c1f0a2e-cb0b-11f0-8000-0242ac120002"


@pytest.fixture(scope="module")
async def client(migrated: CassandraSettings) -> AsyncIterator[httpx.AsyncClient]:
    """One API app for the module; each test makes its own users, keys and batches."""
    settings = stack_settings(migrated, unique("t").replace("_", "-"))
    async with api_client(with_api(settings, max_body_bytes=4096, max_recipients=5)) as pair:
        yield pair[1]


@pytest.fixture
async def me(db: Database) -> Account:
    return await new_account(db, "orig")


@pytest.fixture
async def other(db: Database) -> Account:
    return await new_account(db, "orig_other")


def form(account: Account | None, **changes: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {**FORM, "to": ["ann@example.com"], **changes}
    if account is not None:
        fields.setdefault("api_key", account.key)
    return {k: v for k, v in fields.items() if v is not None}


async def batch_of(client: httpx.AsyncClient, account: Account) -> str:
    resp = await client.post("/api/batch", data=form(account))
    assert resp.status_code == 202, resp.text
    return str(resp.json()["batch_id"])


async def batches_of(client: httpx.AsyncClient, account: Account) -> list[str]:
    resp = await client.get("/api/batches", params={"api_key": account.key})
    assert resp.status_code == 200, resp.text
    return [row["batch_id"] for row in resp.json()]


async def cookie_for(db: Database, account: Account) -> dict[str, str]:
    session_id, _ = await SessionStore(db).create(account.user_id)
    return {"Cookie": f"{SESSION_COOKIE}={session_id}"}


# --- keys and user ids -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "answer"),
    [
        ("/api/batches", NOT_VALID),
        ("/api/stats", {"error": "Access Denied"}),
        (f"/api/batch/{NO_BATCH}", NOT_VALID),
        (f"/api/batch/{NO_BATCH}/logs", NOT_VALID),
    ],
)
@pytest.mark.parametrize("api_key", ["garbage", "sd_live_abcdefghijkl_" + "A" * 43, " "])
async def test_a_wrong_api_key_is_403_in_the_originals_words(
    client: httpx.AsyncClient, path: str, answer: dict[str, str], api_key: str
) -> None:
    """Every read route refuses an unknown or malformed key with its own message."""
    resp = await client.get(path, params={"api_key": api_key})

    assert resp.status_code == 403
    assert resp.json() == answer


async def test_a_wrong_key_is_not_rescued_by_a_valid_session(
    client: httpx.AsyncClient, db: Database, me: Account
) -> None:
    """A presented key decides: a bad one is refused even when the browser is logged in."""
    resp = await client.get(
        "/api/batches", params={"api_key": "garbage"}, headers=await cookie_for(db, me)
    )

    assert resp.status_code == 403
    assert resp.json() == NOT_VALID


async def test_a_revoked_key_cannot_post_a_batch(
    client: httpx.AsyncClient, db: Database, me: Account
) -> None:
    """Revocation applies to the original's routes too, and nothing is stored."""
    await accounts.revoke_key(db, me.user_id, me.key_id)

    resp = await client.post("/api/batch", data=form(me))

    assert resp.status_code == 403
    assert resp.json() == DENIED
    spare = await accounts.create_key(db, me.user_id, "spare")
    assert await batches_of(client, Account(me.user_id, spare)) == []


@pytest.mark.parametrize("scheme", ["Bearer", "bearer"])
async def test_a_bearer_header_works_like_api_key(
    client: httpx.AsyncClient, me: Account, scheme: str
) -> None:
    """The header form authenticates the original's routes as well."""
    batch = await batch_of(client, me)

    resp = await client.get("/api/batches", headers={"Authorization": f"{scheme} {me.key}"})

    assert resp.status_code == 200
    assert [row["batch_id"] for row in resp.json()] == [batch]


async def test_a_wrong_bearer_header_is_refused(client: httpx.AsyncClient) -> None:
    """A bad header key is refused like a bad field key."""
    resp = await client.post(
        "/api/batch", data=form(None), headers={"Authorization": "Bearer garbage"}
    )

    assert resp.status_code == 403
    assert resp.json() == DENIED


@pytest.mark.parametrize(
    "user_id", ["9f1c2d3e-4b5a-4c6d-8e7f-0a1b2c3d4e5f", "not-a-uuid", "' OR 1=1 --"]
)
@pytest.mark.parametrize("path", ["/api/batches", "/api/batch/{batch}", "/api/batch/{batch}/logs"])
async def test_a_user_id_that_is_not_the_keys_owner_is_refused_on_reads(
    client: httpx.AsyncClient, me: Account, path: str, user_id: str
) -> None:
    """A valid key with someone else's (or a garbage) user_id reads nothing."""
    batch = await batch_of(client, me)

    resp = await client.get(
        path.format(batch=batch), params={"api_key": me.key, "user_id": user_id}
    )

    assert resp.status_code == 403
    assert resp.json() == NOT_VALID


async def test_a_key_does_not_open_the_session_only_user_route(
    client: httpx.AsyncClient, me: Account
) -> None:
    """/api/user needs a dashboard session; an API key (field or header) is not one."""
    by_field = await client.get("/api/user", params={"api_key": me.key})
    by_header = await client.get("/api/user", headers=me.auth)

    assert (by_field.status_code, by_header.status_code) == (403, 403)
    assert by_field.json() == by_header.json() == {"error": "Please Login first"}


# --- other users' batches --------------------------------------------------------------------


async def test_another_users_logs_are_not_found_like_a_missing_batch(
    client: httpx.AsyncClient, me: Account, other: Account
) -> None:
    """Someone else's batch logs answer exactly like logs of a batch that never existed."""
    theirs = await batch_of(client, other)

    foreign = await client.get(f"/api/batch/{theirs}/logs", params={"api_key": me.key})
    missing = await client.get(f"/api/batch/{uuid.uuid1()}/logs", params={"api_key": me.key})

    assert foreign.status_code == missing.status_code == 404
    assert foreign.json() == missing.json() == {"error": "Batch doesn't exists"}


async def test_a_wrong_key_cannot_tell_existing_batches_from_missing_ones(
    client: httpx.AsyncClient, other: Account
) -> None:
    """The key is checked before the batch is looked up: no existence oracle."""
    theirs = await batch_of(client, other)

    existing = await client.get(f"/api/batch/{theirs}", params={"api_key": "garbage"})
    missing = await client.get(f"/api/batch/{uuid.uuid1()}", params={"api_key": "garbage"})

    assert existing.status_code == missing.status_code == 403
    assert existing.content == missing.content


# --- bodies ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "content_type"),
    [
        (b"--xx\r\ngarbage without headers", "multipart/form-data; boundary=xx"),
        (b"from=shop@example.com&to=ann@example.com", "multipart/form-data"),
        (b"\xff\xfe=\xff&from=shop@example.com", "application/x-www-form-urlencoded"),
        (b"from=shop@example.com&subject=Hi&body=x&to=ann@example.com", "text/plain"),
        (b"", "application/x-www-form-urlencoded"),
    ],
)
async def test_a_body_that_is_no_usable_form_is_400(
    client: httpx.AsyncClient, me: Account, content: bytes, content_type: str
) -> None:
    """Garbage multipart, multipart without a boundary, non-UTF-8 and non-form bodies: 400."""
    resp = await client.post(
        "/api/batch",
        params={"api_key": me.key},
        content=content,
        headers={"Content-Type": content_type},
    )

    assert resp.status_code == 400
    assert resp.json() == WRONG
    assert await batches_of(client, me) == []


async def test_a_multipart_file_part_is_refused(client: httpx.AsyncClient, me: Account) -> None:
    """The original takes no attachments: a file part makes the form invalid."""
    resp = await client.post(
        "/api/batch",
        params={"api_key": me.key},
        data=form(None),
        files={"attachment": ("a.txt", b"hello", "text/plain")},
    )

    assert resp.status_code == 400
    assert resp.json() == WRONG


async def test_a_form_with_too_many_fields_is_refused(
    client: httpx.AsyncClient, me: Account
) -> None:
    """Fields beyond the recipient cap plus 32 are refused before the form is used."""
    junk = "&".join(f"x{i}=1" for i in range(40))
    body = f"from=shop@example.com&subject=Hi&body=x&to=ann@example.com&{junk}"

    resp = await client.post(
        "/api/batch",
        params={"api_key": me.key},
        content=body.encode(),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )

    assert resp.status_code == 400
    assert resp.json() == WRONG


async def test_an_oversized_form_is_413_in_the_originals_shape(
    client: httpx.AsyncClient, me: Account
) -> None:
    """Bodies over the cap are refused while they stream in, answered as ``{"error": ...}``."""
    resp = await client.post("/api/batch", data=form(me, body="x" * 5000))

    assert resp.status_code == 413
    assert resp.json() == {"error": "the request body exceeds 4096 bytes"}


@pytest.mark.parametrize(
    "changes",
    [
        {"to": None},
        {"from": None},
        {"subject": None},
        {"body": None},
        {"to": ["ann@example.com", "not-an-address"]},
        {"to": [""]},
        {"from": "Shop <shop@example.com>"},
        {"to": ["ann@example.com\r\nBcc: x@evil.com"]},
    ],
)
async def test_missing_or_invalid_essentials_are_400_and_store_nothing(
    client: httpx.AsyncClient, me: Account, changes: dict[str, Any]
) -> None:
    """Each essential field must be present, and every ``to`` valid (one bad one fails all)."""
    resp = await client.post("/api/batch", data=form(me, **changes))

    assert resp.status_code == 400
    assert resp.json() == WRONG
    assert await batches_of(client, me) == []


@pytest.mark.parametrize(
    "changes",
    [
        {"subject": "Hi\r\nBcc: x@evil.com"},
        {"subject": "=?UTF-8?Q?Hi=0ABcc:_x@evil.com?="},
        {"name": "Shop\r\nBcc: x@evil.com"},
        {"subject": "Hi\x1b[2J"},
        {"to": [f"r{i}@example.com" for i in range(6)]},
    ],
)
async def test_fields_our_rules_refuse_are_400_in_the_originals_words(
    client: httpx.AsyncClient, me: Account, changes: dict[str, Any]
) -> None:
    """What passes the original's checks but not ours (header injection, control
    characters, over the recipient cap) is its 400, never a 422 or a stored batch."""
    resp = await client.post("/api/batch", data=form(me, **changes))

    assert resp.status_code == 400
    assert resp.json() == WRONG
    assert await batches_of(client, me) == []


async def test_all_recipients_suppressed_is_400(
    client: httpx.AsyncClient, db: Database, me: Account
) -> None:
    """Suppression applies on this route too; nobody left to send to is a 400."""
    added = await client.post(
        "/v1/suppressions", json={"email": "ann@example.com"}, headers=me.auth
    )
    assert added.status_code == 201

    resp = await client.post("/api/batch", data=form(me))

    assert resp.status_code == 400
    assert resp.json() == WRONG


# --- pages -----------------------------------------------------------------------------------


@pytest.mark.parametrize("page", ["0", "-1", "501", "abc", "1.5", "2 "])
async def test_a_logs_page_out_of_range_is_400(
    client: httpx.AsyncClient, me: Account, page: str
) -> None:
    """Pages are whole numbers from 1 to 500."""
    batch = await batch_of(client, me)

    resp = await client.get(f"/api/batch/{batch}/logs", params={"api_key": me.key, "page": page})

    assert resp.status_code == 400
    assert resp.json() == {"error": "page must be a whole number from 1 to 500"}


@pytest.mark.parametrize("page", ["\u00b2", "9" * 5000])
async def test_a_page_that_only_looks_numeric_is_400(
    client: httpx.AsyncClient, me: Account, page: str
) -> None:
    """Unicode digits and absurdly long numbers are a 400 in the original's shape, not a 500."""
    batch = await batch_of(client, me)

    resp = await client.get(f"/api/batch/{batch}/logs", params={"api_key": me.key, "page": page})

    assert resp.status_code == 400
    assert resp.json() == {"error": "page must be a whole number from 1 to 500"}


# --- cookie posts and methods ----------------------------------------------------------------


@pytest.mark.parametrize(
    "origin_headers",
    [
        {},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Origin": "http://api.test.evil.example"},
        {"Origin": "null"},
    ],
)
async def test_a_session_post_not_proven_to_come_from_our_pages_is_refused(
    client: httpx.AsyncClient, db: Database, me: Account, origin_headers: dict[str, str]
) -> None:
    """A cookie-authenticated POST needs Origin or Sec-Fetch-Site naming our own site."""
    headers = {**await cookie_for(db, me), **origin_headers}

    resp = await client.post("/api/batch", data=form(None), headers=headers)

    assert resp.status_code == 403
    assert resp.json() == {"error": "Action Forbidden"}
    assert await batches_of(client, me) == []


async def test_a_session_post_marked_same_origin_is_accepted(
    client: httpx.AsyncClient, db: Database, me: Account
) -> None:
    """The browser's own Sec-Fetch-Site: same-origin is proof enough without Origin."""
    headers = {**await cookie_for(db, me), "Sec-Fetch-Site": "same-origin"}

    resp = await client.post("/api/batch", data=form(None), headers=headers)

    assert resp.status_code == 202, resp.text


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/batch"),
        ("PUT", "/api/batch"),
        ("POST", "/api/batches"),
        ("DELETE", "/api/user"),
    ],
)
async def test_a_wrong_method_is_405(client: httpx.AsyncClient, method: str, path: str) -> None:
    """Each route serves its one method (and HEAD for GET)."""
    resp = await client.request(method, path)

    assert resp.status_code == 405
