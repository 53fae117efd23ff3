"""``/v1`` unhappy paths against real Cassandra and RabbitMQ: every way a key can be wrong,
other users' ids, hostile path ids, cursors and limits, malformed, mistyped, oversized and
header-injecting bodies, Idempotency-Key abuse and wrong methods. Each answer is checked for
its status and its ``{"error": {"code", "message", "fields"?}}`` envelope."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import date, timedelta
from typing import Any

import httpx
import orjson
import pytest
from starlette.applications import Starlette

from shared.core.errors import DependencyUnavailable
from shared.infra.config import CassandraSettings, Settings
from shared.infra.db import Database
from tests.conftest import stack_settings, unique
from tests.integration.unhappy import (
    UNAUTHORIZED,
    Account,
    api_client,
    cursor,
    new_account,
    with_api,
)

GOOD: dict[str, Any] = {
    "from": "Shop <shop@example.com>",
    "to": ["ann@example.com"],
    "subject": "Hi",
    "text": "Hello",
}
JSON_TYPE = {"Content-Type": "application/json"}
#: A well-formed time UUID that names no batch (parameter ids stay the same run to run).
NO_BATCH = "6c1f0a2e-cb0b-11f0-8000-0242ac120002"
#: A random (version 4) UUID: never one of our batch ids.
RANDOM_UUID = "9f1c2d3e-4b5a-4c6d-8e7f-0a1b2c3d4e5f"


@pytest.fixture(scope="module")
async def client(migrated: CassandraSettings) -> AsyncIterator[httpx.AsyncClient]:
    """One API app for the module: tests never share data (each makes its own users)."""
    async with api_client(stack_settings(migrated, unique("t").replace("_", "-"))) as pair:
        yield pair[1]


@pytest.fixture(scope="module")
async def small(migrated: CassandraSettings) -> AsyncIterator[httpx.AsyncClient]:
    """An API whose bodies may be at most 4 KiB."""
    settings = stack_settings(migrated, unique("t").replace("_", "-"))
    async with api_client(with_api(settings, max_body_bytes=4096)) as pair:
        yield pair[1]


@pytest.fixture
async def served(settings: Settings) -> AsyncIterator[tuple[Starlette, httpx.AsyncClient]]:
    """An API app of the test's own, for tests that break its collaborators."""
    async with api_client(settings) as pair:
        yield pair


@pytest.fixture
async def me(db: Database) -> Account:
    return await new_account(db, "me")


@pytest.fixture
async def other(db: Database) -> Account:
    return await new_account(db, "other")


async def submit(client: httpx.AsyncClient, account: Account, **changes: Any) -> str:
    resp = await client.post("/v1/batches", json={**GOOD, **changes}, headers=account.auth)
    assert resp.status_code == 202, resp.text
    return str(resp.json()["batch_id"])


async def listed(client: httpx.AsyncClient, account: Account) -> list[str]:
    resp = await client.get("/v1/batches", params={"limit": "500"}, headers=account.auth)
    assert resp.status_code == 200, resp.text
    return [b["batch_id"] for b in resp.json()["data"]]


def error(resp: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The error object of ``resp`` after checking its status, code and envelope shape."""
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"error"}
    detail: dict[str, Any] = body["error"]
    assert detail["code"] == code
    assert isinstance(detail["message"], str) and detail["message"]
    assert set(detail) <= {"code", "message", "fields"}
    return detail


# --- keys ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "Basic dXNlcjpwYXNz",
        "Bearer",
        "Bearer    ",
        "Token {key}",
        "{key}",
        "Bearer {key}x",
        "Bearer x{key}",
        "Bearer {key} {key}",
        "Bearer " + "A" * 8000,
        "Bearer caf\xe9-\xff",
    ],
)
async def test_every_wrong_key_gets_the_one_401_envelope(
    client: httpx.AsyncClient, me: Account, authorization: str | None
) -> None:
    """Missing, other-scheme, mangled, unknown, huge and non-ASCII keys all answer one 401."""
    headers = []
    if authorization is not None:
        value = authorization.format(key=me.key).encode("latin-1")
        headers.append((b"authorization", value))

    resp = await client.get("/v1/batches", headers=headers)

    assert resp.status_code == 401
    assert resp.json() == UNAUTHORIZED
    assert resp.headers["www-authenticate"] == 'Bearer realm="safedelivr"'


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "Bearer "])
async def test_the_bearer_scheme_is_case_insensitive(
    client: httpx.AsyncClient, me: Account, scheme: str
) -> None:
    """Auth schemes are case-insensitive (RFC 9110), and extra spaces before the key are ok."""
    resp = await client.get("/v1/keys", headers={"Authorization": f"{scheme} {me.key}"})

    assert resp.status_code == 200, resp.text


async def test_a_key_in_the_query_string_does_not_authenticate_v1(
    client: httpx.AsyncClient, me: Account
) -> None:
    """Only the original's /api adapter reads ``api_key`` fields; /v1 wants the header."""
    resp = await client.get("/v1/batches", params={"api_key": me.key})

    assert resp.status_code == 401
    assert resp.json() == UNAUTHORIZED


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/batches", b"{not json"),
        ("GET", "/v1/batches?limit=0", None),
        ("GET", "/v1/batches/not-a-uuid", None),
        ("GET", f"/v1/batches/{NO_BATCH}/logs?cursor=!!", None),
        ("POST", "/v1/suppressions", b"[]"),
        ("DELETE", "/v1/suppressions/nobody@example.com", None),
        ("GET", "/v1/stats?from=yesterday", None),
        ("POST", "/v1/keys", b"x" * 20_000),
        ("DELETE", "/v1/keys/nope", None),
    ],
)
async def test_the_key_is_checked_before_anything_else(
    client: httpx.AsyncClient, method: str, path: str, body: bytes | None
) -> None:
    """Without a key, no validation, lookup or size check answers first (no oracle)."""
    resp = await client.request(method, path, content=body, headers=JSON_TYPE)

    assert resp.status_code == 401
    assert resp.json() == UNAUTHORIZED


async def test_a_revoked_key_cannot_mint_a_new_key(client: httpx.AsyncClient, me: Account) -> None:
    """Revocation is immediate: the revoked key cannot create a successor key."""
    spare = (await client.post("/v1/keys", json={"name": "spare"}, headers=me.auth)).json()["key"]
    spare_auth = {"Authorization": f"Bearer {spare}"}
    assert (await client.delete(f"/v1/keys/{me.key_id}", headers=spare_auth)).status_code == 204

    resp = await client.post("/v1/keys", json={"name": "successor"}, headers=me.auth)

    assert resp.status_code == 401
    assert resp.json() == UNAUTHORIZED
    keys = (await client.get("/v1/keys", headers=spare_auth)).json()["data"]
    assert sorted((k["name"], k["revoked"]) for k in keys) == [("spare", False), ("test", True)]


# --- other users' ids ------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["", "/logs"])
async def test_another_users_batch_answers_exactly_like_a_missing_one(
    client: httpx.AsyncClient, me: Account, other: Account, suffix: str
) -> None:
    """Status and body for someone else's batch equal those for a batch that never existed."""
    theirs = await submit(client, other)

    foreign = await client.get(f"/v1/batches/{theirs}{suffix}", headers=me.auth)
    missing = await client.get(f"/v1/batches/{uuid.uuid1()}{suffix}", headers=me.auth)

    assert error(foreign, 404, "not_found") == {"code": "not_found", "message": "no such batch"}
    assert foreign.content == missing.content


async def test_another_users_batch_is_not_reached_through_a_forged_cursor(
    client: httpx.AsyncClient, me: Account, other: Account
) -> None:
    """A cursor naming someone else's batch pages through the caller's own batches only."""
    mine = await submit(client, me)
    theirs = [await submit(client, other) for _ in range(2)]

    resp = await client.get(
        "/v1/batches", params={"cursor": cursor({"after": theirs[-1]})}, headers=me.auth
    )

    assert resp.status_code == 200
    assert [b["batch_id"] for b in resp.json()["data"]] == [mine]


async def test_another_users_key_cannot_be_revoked(
    client: httpx.AsyncClient, me: Account, other: Account
) -> None:
    """Revoking a key id of another user is 404 (as an unknown one) and the key keeps working."""
    resp = await client.delete(f"/v1/keys/{other.key_id}", headers=me.auth)

    assert error(resp, 404, "not_found")["message"] == "no such key"
    assert (await client.get("/v1/keys", headers=other.auth)).status_code == 200


async def test_another_users_suppression_cannot_be_deleted(
    client: httpx.AsyncClient, me: Account, other: Account
) -> None:
    """Each user's list is their own: deleting another user's entry is 404 and it stays."""
    added = await client.post(
        "/v1/suppressions", json={"email": "kept@example.com"}, headers=other.auth
    )
    assert added.status_code == 201

    resp = await client.delete("/v1/suppressions/kept@example.com", headers=me.auth)

    error(resp, 404, "not_found")
    theirs = (await client.get("/v1/suppressions", headers=other.auth)).json()["data"]
    assert [s["email"] for s in theirs] == ["kept@example.com"]
    assert (await client.get("/v1/suppressions", headers=me.auth)).json()["data"] == []


# --- path ids --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "batch_id",
    [
        "00000000-0000-0000-0000-000000000000",
        f"{NO_BATCH}-extra",
        "%F0%9F%92%A3",
        "%00",
        "a" * 2000,
        "'; DROP TABLE batches; --",
    ],
)
@pytest.mark.parametrize("suffix", ["", "/logs"])
async def test_a_path_id_that_is_no_time_uuid_is_404(
    client: httpx.AsyncClient, me: Account, batch_id: str, suffix: str
) -> None:
    """Hostile or malformed batch ids name no batch: 404 ``not_found``, never a 400/500."""
    resp = await client.get(f"/v1/batches/{batch_id}{suffix}", headers=me.auth)

    assert error(resp, 404, "not_found")["message"] == "no such batch"


@pytest.mark.parametrize("email", ["nobody@example.com", "%0D%0ABcc:%20x@evil.com", "%00", "%20"])
async def test_deleting_an_unlisted_or_hostile_suppression_is_404(
    client: httpx.AsyncClient, me: Account, email: str
) -> None:
    """An address that is not on the list, or no address at all, is 404 ``not_found``."""
    resp = await client.delete(f"/v1/suppressions/{email}", headers=me.auth)

    assert error(resp, 404, "not_found")["message"] == "that address is not suppressed"


# --- paging ----------------------------------------------------------------------------------


@pytest.mark.parametrize("limit", ["0", "-1", "501", "abc", "1.5", "", "0x10"])
@pytest.mark.parametrize("path", ["/v1/batches", "/v1/batches/{batch}/logs"])
async def test_a_limit_out_of_range_is_422_naming_limit(
    client: httpx.AsyncClient, me: Account, limit: str, path: str
) -> None:
    """A limit that is not a whole number from 1 to 500 is refused with ``fields.limit``."""
    batch = await submit(client, me)

    resp = await client.get(path.format(batch=batch), params={"limit": limit}, headers=me.auth)

    detail = error(resp, 422, "invalid_fields")
    assert detail["fields"] == {"limit": "must be a whole number from 1 to 500"}


async def test_the_suppression_list_allows_up_to_1000_per_page(
    client: httpx.AsyncClient, me: Account
) -> None:
    """Its page limit is 1..1000: 1000 is served, 1001 refused."""
    ok = await client.get("/v1/suppressions", params={"limit": "1000"}, headers=me.auth)
    refused = await client.get("/v1/suppressions", params={"limit": "1001"}, headers=me.auth)

    assert ok.status_code == 200
    assert error(refused, 422, "invalid_fields")["fields"] == {
        "limit": "must be a whole number from 1 to 1000"
    }


@pytest.mark.parametrize("limit", ["\u00b2", "9" * 5000])
async def test_a_limit_that_only_looks_numeric_is_422(
    client: httpx.AsyncClient, me: Account, limit: str
) -> None:
    """Unicode digits and absurdly long numbers are refused like any other bad limit."""
    resp = await client.get("/v1/batches", params={"limit": limit}, headers=me.auth)

    assert error(resp, 422, "invalid_fields")["fields"] == {
        "limit": "must be a whole number from 1 to 500"
    }


@pytest.mark.parametrize(
    "token",
    [
        "!!!",
        "%%%",
        "\u00e9t\u00e9",
        cursor("not an object"),
        cursor([1, 2]),
        cursor({"after": "not-a-uuid"}),
        "bm90IGpzb24",  # base64 of "not json"
    ],
)
async def test_a_tampered_batch_list_cursor_is_400(
    client: httpx.AsyncClient, me: Account, token: str
) -> None:
    """A cursor the API did not make is refused with 400 ``bad_cursor``."""
    resp = await client.get("/v1/batches", params={"cursor": token}, headers=me.auth)

    assert error(resp, 400, "bad_cursor")["message"] == "the cursor is malformed"


@pytest.mark.parametrize("after", [5, {}, ["x"], RANDOM_UUID])
async def test_a_cursor_with_a_mistyped_position_is_400(
    client: httpx.AsyncClient, me: Account, after: object
) -> None:
    """A cursor whose ``after`` is not one of our batch ids is 400 ``bad_cursor``."""
    resp = await client.get(
        "/v1/batches", params={"cursor": cursor({"after": after})}, headers=me.auth
    )

    error(resp, 400, "bad_cursor")


@pytest.mark.parametrize(
    "position",
    [
        {"x": 1},
        {"chunk": 0},
        {"log_id": NO_BATCH},
        {"chunk": "x", "log_id": NO_BATCH},
    ],
)
async def test_a_tampered_logs_cursor_is_400(
    client: httpx.AsyncClient, me: Account, position: dict[str, Any]
) -> None:
    """A logs cursor lacking or garbling its chunk and log id is 400 ``bad_cursor``."""
    batch = await submit(client, me)

    resp = await client.get(
        f"/v1/batches/{batch}/logs", params={"cursor": cursor(position)}, headers=me.auth
    )

    error(resp, 400, "bad_cursor")


async def test_a_logs_cursor_with_a_numeric_log_id_is_400(
    client: httpx.AsyncClient, me: Account
) -> None:
    """A logs cursor whose log id is a number is 400 ``bad_cursor``."""
    batch = await submit(client, me)

    resp = await client.get(
        f"/v1/batches/{batch}/logs",
        params={"cursor": cursor({"chunk": 0, "log_id": 5})},
        headers=me.auth,
    )

    error(resp, 400, "bad_cursor")


@pytest.mark.parametrize("state", ["", "QUEUED", "delivered", "queued,failed"])
async def test_an_unknown_logs_state_filter_is_422(
    client: httpx.AsyncClient, me: Account, state: str
) -> None:
    """The state filter takes queued, success or failed only (case-sensitive)."""
    batch = await submit(client, me)

    resp = await client.get(f"/v1/batches/{batch}/logs", params={"state": state}, headers=me.auth)

    assert error(resp, 422, "invalid_fields")["fields"] == {
        "state": "must be queued, success or failed"
    }


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"from": "2024-13-01"}, "from"),
        ({"to": "tomorrow"}, "to"),
        ({"from": "2024-01-05", "to": "2024-01-01"}, "from"),
        ({"from": "2023-01-01", "to": "2024-01-02"}, "from"),
    ],
)
async def test_bad_stats_ranges_are_422_naming_the_field(
    client: httpx.AsyncClient, me: Account, params: dict[str, str], field: str
) -> None:
    """Unparseable dates, reversed ranges and ranges over 366 days are refused."""
    resp = await client.get("/v1/stats", params=params, headers=me.auth)

    assert list(error(resp, 422, "invalid_fields")["fields"]) == [field]


async def test_a_stats_range_of_exactly_366_days_is_served(
    client: httpx.AsyncClient, me: Account
) -> None:
    """The longest range allowed answers one zero-filled row per day."""
    start = date(2023, 1, 1)
    end = start + timedelta(days=365)

    resp = await client.get(
        "/v1/stats", params={"from": start.isoformat(), "to": end.isoformat()}, headers=me.auth
    )

    assert resp.status_code == 200
    assert len(resp.json()["data"]) == 366


# --- bodies ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"],
)
@pytest.mark.parametrize("path", ["/v1/batches", "/v1/suppressions", "/v1/keys"])
async def test_a_body_that_is_not_json_is_415(
    client: httpx.AsyncClient, me: Account, content_type: str, path: str
) -> None:
    """Bodies declared as anything but JSON are refused before they are parsed."""
    resp = await client.post(
        path, content=b'{"name": "x"}', headers={**me.auth, "Content-Type": content_type}
    )

    assert error(resp, 415, "unsupported_media_type")["message"] == (
        "send the body as application/json"
    )


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\xff\xfe{}",
        b'{"subject": "\\ud800"}',
        b"[" * 2000 + b"]" * 2000,
        b'{"from": "a@example.com"} trailing',
        b'{"subject": NaN}',
        b"{'single': 'quotes'}",
    ],
)
async def test_malformed_json_is_400_and_stores_nothing(
    client: httpx.AsyncClient, me: Account, body: bytes
) -> None:
    """Empty, non-UTF-8, lone-surrogate, too deep and non-JSON bodies are 400 ``malformed_json``."""
    resp = await client.post("/v1/batches", content=body, headers={**me.auth, **JSON_TYPE})

    error(resp, 400, "malformed_json")
    assert await listed(client, me) == []


@pytest.mark.parametrize("body", [b"null", b"[]", b'"a string"', b"42"])
@pytest.mark.parametrize("path", ["/v1/batches", "/v1/suppressions", "/v1/keys"])
async def test_json_that_is_not_an_object_is_422_on_body(
    client: httpx.AsyncClient, me: Account, body: bytes, path: str
) -> None:
    """Valid JSON of the wrong shape is a field error on ``body``."""
    resp = await client.post(path, content=body, headers={**me.auth, **JSON_TYPE})

    assert list(error(resp, 422, "invalid_fields")["fields"]) == ["body"]


async def test_a_body_at_the_cap_is_read_and_one_byte_more_is_413(
    small: httpx.AsyncClient, me: Account
) -> None:
    """The cap is inclusive: 4096 bytes are accepted, 4097 refused with ``body_too_large``."""
    raw = orjson.dumps(GOOD)
    at_cap = raw + b" " * (4096 - len(raw))
    headers = {**me.auth, **JSON_TYPE}

    accepted = await small.post("/v1/batches", content=at_cap, headers=headers)
    refused = await small.post("/v1/batches", content=at_cap + b" ", headers=headers)

    assert accepted.status_code == 202, accepted.text
    assert error(refused, 413, "body_too_large")["message"] == (
        "the request body exceeds 4096 bytes"
    )


@pytest.mark.parametrize("path", ["/v1/suppressions", "/v1/keys"])
async def test_small_endpoints_cap_their_bodies_at_16_kib(
    client: httpx.AsyncClient, me: Account, path: str
) -> None:
    """Suppressions and keys take small bodies only, whatever the batch cap is."""
    body = b'{"name": "' + b"n" * 16_384 + b'"}'

    resp = await client.post(path, content=body, headers={**me.auth, **JSON_TYPE})

    error(resp, 413, "body_too_large")


@pytest.mark.parametrize(
    ("changes", "fields"),
    [
        ({"urgency": "high"}, {"urgency": "unknown field"}),
        ({"priority": "high"}, {"priority": "must be transactional or bulk"}),
        ({"from": {"email": "shop@example.com", "nick": "S"}}, {"from.nick": "unknown field"}),
        ({"to": [{"email": "ann@example.com", "cc": "x"}]}, {"to[0].cc": "unknown field"}),
        ({"subject": 5}, {"subject": "must be a string"}),
        ({"bulk": "true"}, {"bulk": "must be true or false"}),
        ({"to": 5}, {"to": "must be a list of addresses or a comma-separated string"}),
        (
            {"headers": ["X-A: b"]},
            {"headers": "must be an object of header names to string values"},
        ),
    ],
)
async def test_unknown_fields_and_wrong_types_are_named(
    client: httpx.AsyncClient, me: Account, changes: dict[str, Any], fields: dict[str, str]
) -> None:
    """Each unknown or mistyped field is named in ``fields`` with its problem."""
    resp = await client.post("/v1/batches", json={**GOOD, **changes}, headers=me.auth)

    assert error(resp, 422, "invalid_fields")["fields"] == fields
    assert await listed(client, me) == []


INJECTION = "must not contain CR, LF, NUL or other line breaks (header injection)"


@pytest.mark.parametrize(
    ("changes", "path"),
    [
        ({"subject": "Hi\u2028Bcc: x@evil.com"}, "subject"),
        ({"subject": "Hi\x85Bcc: x@evil.com"}, "subject"),
        ({"subject": "Hi\x00"}, "subject"),
        ({"headers": {"X-Tag": "a\r\nBcc: x@evil.com"}}, "headers.X-Tag"),
        ({"from": {"email": "shop@example.com", "name": "S\nBcc: x@evil.com"}}, "from.name"),
        ({"reply_to": "S\r\n <r@example.com>"}, "reply_to"),
        ({"to": ["ann@example.com\r\nBcc: x@evil.com"]}, "to[0]"),
        ({"categories": ["a\nb"]}, "categories[0]"),
    ],
)
async def test_line_breaks_in_header_bound_values_are_refused(
    client: httpx.AsyncClient, me: Account, changes: dict[str, Any], path: str
) -> None:
    """A line break anywhere that reaches a mail header is 422 on that field, nothing stored."""
    resp = await client.post("/v1/batches", json={**GOOD, **changes}, headers=me.auth)

    fields = error(resp, 422, "invalid_fields")["fields"]
    assert fields[path] == INJECTION
    assert await listed(client, me) == []


async def test_unicode_that_is_not_a_control_character_is_accepted(
    client: httpx.AsyncClient, me: Account
) -> None:
    """Emoji, RTL text and IDN domains are ordinary content, not attacks."""
    changes = {
        "subject": "Bonjour \U0001f44b \u05e9\u05dc\u05d5\u05dd",
        "from": {"email": "shop@example.com", "name": "Caf\u00e9 \u2603"},
        "to": ["ann@b\u00fccher.example"],
        "headers": {"X-Note": "\u00e9t\u00e9"},
    }

    resp = await client.post("/v1/batches", json={**GOOD, **changes}, headers=me.auth)

    assert resp.status_code == 202, resp.text
    assert resp.json()["accepted"] == 1


@pytest.mark.parametrize("to", [[], "", ["", " "], "  ,  , ", ["nope", "also@nope"]])
async def test_no_deliverable_recipient_is_422_no_recipients(
    client: httpx.AsyncClient, me: Account, to: object
) -> None:
    """An empty, blank or all-invalid recipient list is 422 ``no_recipients``, nothing stored."""
    resp = await client.post("/v1/batches", json={**GOOD, "to": to}, headers=me.auth)

    assert "to" in error(resp, 422, "no_recipients")["fields"]
    assert await listed(client, me) == []


async def test_recipients_all_suppressed_is_422_naming_them(
    client: httpx.AsyncClient, me: Account
) -> None:
    """When every recipient is on the caller's suppression list nothing is accepted."""
    await client.post("/v1/suppressions", json={"email": "gone@example.com"}, headers=me.auth)

    resp = await client.post(
        "/v1/batches", json={**GOOD, "to": ["GONE@example.com"]}, headers=me.auth
    )

    fields = error(resp, 422, "no_recipients")["fields"]
    assert fields["to"] == "no deliverable recipient: 0 rejected, 1 suppressed"
    assert await listed(client, me) == []


# --- Idempotency-Key -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "idem", [b"", b"has space", b"tab\tin", b"caf\xe9", b"x" * 256, b"\x7f-del"]
)
async def test_a_malformed_idempotency_key_is_400(
    client: httpx.AsyncClient, me: Account, idem: bytes
) -> None:
    """Keys must be 1-255 visible ASCII characters; anything else is refused, nothing stored."""
    headers = [*((k.encode(), v.encode()) for k, v in me.auth.items()), (b"idempotency-key", idem)]

    resp = await client.post("/v1/batches", json=GOOD, headers=headers)

    error(resp, 400, "bad_idempotency_key")
    assert await listed(client, me) == []


async def test_a_255_character_idempotency_key_is_accepted(
    client: httpx.AsyncClient, me: Account
) -> None:
    """The longest allowed key works."""
    key = uuid.uuid4().hex + "k" * 223
    resp = await client.post("/v1/batches", json=GOOD, headers={**me.auth, "Idempotency-Key": key})

    assert resp.status_code == 202, resp.text


async def test_a_conflicting_replay_leaves_the_first_batch_as_the_answer(
    client: httpx.AsyncClient, me: Account
) -> None:
    """After a 409 for a different body, the original body still gets the first batch."""
    headers = {**me.auth, "Idempotency-Key": uuid.uuid4().hex}
    first = await client.post("/v1/batches", json=GOOD, headers=headers)

    conflict = await client.post(
        "/v1/batches", json={**GOOD, "to": ["bob@example.com"]}, headers=headers
    )
    again = await client.post("/v1/batches", json=GOOD, headers=headers)

    assert error(conflict, 409, "idempotency_conflict")["message"] == (
        "this Idempotency-Key was used with a different body"
    )
    assert again.json()["batch_id"] == first.json()["batch_id"]
    assert await listed(client, me) == [first.json()["batch_id"]]


async def test_a_replay_with_reordered_keys_and_whitespace_is_the_same_request(
    client: httpx.AsyncClient, me: Account
) -> None:
    """The body is compared as JSON, not as bytes."""
    headers = {**me.auth, **JSON_TYPE, "Idempotency-Key": uuid.uuid4().hex}
    compact = b'{"from":"shop@example.com","to":["ann@example.com"],"subject":"Hi","text":"x"}'
    spaced = (
        b'{ "text": "x",\n  "subject": "Hi",'
        b' "to": [ "ann@example.com" ], "from": "shop@example.com" }'
    )

    first = await client.post("/v1/batches", content=compact, headers=headers)
    second = await client.post("/v1/batches", content=spaced, headers=headers)

    assert (first.status_code, second.status_code) == (202, 202)
    assert first.json() == second.json()


async def test_the_same_idempotency_key_of_two_users_makes_two_batches(
    client: httpx.AsyncClient, me: Account, other: Account
) -> None:
    """Keys are scoped per user: another user's identical request never gets my batch."""
    idem = {"Idempotency-Key": uuid.uuid4().hex}

    mine = await client.post("/v1/batches", json=GOOD, headers={**me.auth, **idem})
    theirs = await client.post("/v1/batches", json=GOOD, headers={**other.auth, **idem})

    assert (mine.status_code, theirs.status_code) == (202, 202)
    assert mine.json()["batch_id"] != theirs.json()["batch_id"]
    assert await listed(client, other) == [theirs.json()["batch_id"]]


async def test_a_refused_request_does_not_claim_its_idempotency_key(
    client: httpx.AsyncClient, me: Account
) -> None:
    """A 422 stores nothing under the key, so the corrected request is accepted, not a 409."""
    headers = {**me.auth, "Idempotency-Key": uuid.uuid4().hex}
    refused = await client.post("/v1/batches", json={**GOOD, "subject": ""}, headers=headers)

    corrected = await client.post("/v1/batches", json=GOOD, headers=headers)

    error(refused, 422, "invalid_fields")
    assert corrected.status_code == 202, corrected.text


# --- routes and methods ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("PUT", "/v1/batches"),
        ("DELETE", "/v1/batches"),
        ("PATCH", "/v1/batches/{batch}"),
        ("POST", "/v1/batches/{batch}/logs"),
        ("POST", "/v1/stats"),
        ("GET", "/v1/keys/{key_id}"),
    ],
)
async def test_a_wrong_method_is_405_in_the_envelope(
    client: httpx.AsyncClient, me: Account, method: str, path: str
) -> None:
    """A known path with a method it does not serve answers 405 ``method_not_allowed``."""
    url = path.format(batch=uuid.uuid1(), key_id=me.key_id)

    resp = await client.request(method, url, headers=me.auth)

    error(resp, 405, "method_not_allowed")


async def test_a_405_says_which_methods_are_allowed(client: httpx.AsyncClient, me: Account) -> None:
    """The 405 of a DELETE-only route lists DELETE in ``Allow``."""
    resp = await client.get(f"/v1/keys/{me.key_id}", headers=me.auth)

    assert resp.status_code == 405
    assert "DELETE" in resp.headers.get("allow", "")


async def test_an_unknown_v1_path_is_404_in_the_envelope(
    client: httpx.AsyncClient, me: Account
) -> None:
    """Unrouted paths under /v1 answer the JSON envelope, not an HTML page."""
    resp = await client.get("/v1/nothing-here", headers=me.auth)

    error(resp, 404, "not_found")


# --- dependencies ----------------------------------------------------------------------------


class _Broken:
    """A use-case object whose every call fails with ``error``."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __getattr__(self, name: str) -> Any:
        async def fail(*args: object, **kwargs: object) -> None:
            raise self.error

        return fail


async def test_a_dependency_outage_is_503_with_retry_after(
    served: tuple[Starlette, httpx.AsyncClient], me: Account
) -> None:
    """When storage is unavailable the caller is told to retry, never shown a stack."""
    app, client = served
    app.state.managing = _Broken(DependencyUnavailable("cassandra", "no hosts available"))

    resp = await client.post("/v1/suppressions", json={"email": "a@example.com"}, headers=me.auth)

    error(resp, 503, "unavailable")
    assert resp.headers["retry-after"] == "5"
    assert "cassandra" not in resp.text


async def test_an_unexpected_error_is_a_500_envelope_without_details(
    served: tuple[Starlette, httpx.AsyncClient], me: Account
) -> None:
    """A bug answers the generic 500 envelope; its message and traceback stay in the log."""
    app, client = served
    app.state.managing = _Broken(RuntimeError("secret internal detail"))

    resp = await client.get("/v1/keys", headers=me.auth)

    assert error(resp, 500, "internal_error") == {
        "code": "internal_error",
        "message": "internal error; it has been logged",
    }
    assert "secret" not in resp.text and "Traceback" not in resp.text
