"""Contact lists through the real API app, Cassandra and RabbitMQ: creating and reading
lists, CSV imports in the background with their progress and report (invalid rows,
duplicates, contacts already in the list, suppressed and unsubscribed ones), paging through
contacts, removing one, another user's lists, and hostile requests."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from services.api.contact_lists import ContactLists
from services.api.contacts_csv import Contact
from services.api.list_import import INTERRUPTED, ImportJob
from services.api.schema import (
    ContactListList,
    ContactListView,
    ImportView,
    ListContactsPage,
)
from services.api.session_store import SESSION_COOKIE, SessionStore
from shared.accounts import accounts
from shared.audience.suppressions import SuppressionStore
from shared.infra.config import ListSettings, Settings
from shared.infra.db import Database
from tests.conftest import unique
from tests.integration.conftest import app_for
from tests.integration.harness import client_for, eventually


@pytest.fixture(scope="module")
def settings(module_settings: Settings) -> Settings:
    """One stack for the module (``tests/integration/conftest.py``)."""
    return module_settings


@pytest.fixture
def api(module_api: httpx.AsyncClient) -> httpx.AsyncClient:
    return module_api


CSV = {"Content-Type": "text/csv"}


async def new_user(db: Database) -> tuple[uuid.UUID, dict[str, str]]:
    user = await accounts.ensure_user(db, unique("lists"))
    key = await accounts.create_key(db, user, "k", scopes=("send", "read"))
    return user, {"Authorization": f"Bearer {key}"}


async def new_list(api: httpx.AsyncClient, auth: dict[str, str], name: str = "News") -> str:
    made = await api.post("/v1/lists", json={"name": name}, headers=auth)
    assert made.status_code == 201, made.text
    return str(made.json()["id"])


async def imported(
    api: httpx.AsyncClient, auth: dict[str, str], list_id: str, body: bytes
) -> dict[str, Any]:
    """Import ``body`` and wait for the import to end; its report."""
    started = await api.post(f"/v1/lists/{list_id}/imports", content=body, headers=auth | CSV)
    assert started.status_code == 202, started.text
    path = f"/v1/lists/{list_id}/imports/{started.json()['import_id']}"

    async def ended() -> dict[str, Any] | None:
        job = (await api.get(path, headers=auth)).json()
        return job if job["state"] in ("done", "failed") else None

    report: dict[str, Any] = await eventually(ended)
    ImportView.model_validate(report)
    return report


@pytest.fixture(scope="module")
async def small_app(settings: Settings) -> AsyncIterator[Starlette]:
    """The API with small import limits: 2 kB bodies, 5 rows, 3 contacts per list, slices
    of 2 rows and imports stale after a second."""
    limits = ListSettings(
        import_max_bytes=2048,
        import_max_rows=5,
        max_contacts=3,
        import_slice=2,
        import_stale_after=1.0,
    )
    async with app_for(settings.model_copy(update={"lists": limits})) as app:
        yield app


@pytest.fixture
async def small_api(small_app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(small_app) as client:
        yield client


async def test_a_created_list_is_read_and_listed_empty(
    api: httpx.AsyncClient, db: Database
) -> None:
    _, auth = await new_user(db)

    list_id = await new_list(api, auth, "  Customers  ")
    one = await api.get(f"/v1/lists/{list_id}", headers=auth)
    all_ = await api.get("/v1/lists", headers=auth)

    assert one.status_code == 200
    view = ContactListView.model_validate(one.json())
    assert (view.name, view.contacts, view.latest_import) == ("Customers", 0, None)
    assert [x.id for x in ContactListList.model_validate(all_.json()).data] == [list_id]


async def test_an_import_reports_every_row_not_simply_added(
    api: httpx.AsyncClient, db: Database
) -> None:
    """Invalid, duplicate in the file, already in the list (updated), suppressed for all
    mail, unsubscribed from this list: each counted and listed with its row."""
    user, auth = await new_user(db)
    list_id = await new_list(api, auth)
    first = await imported(api, auth, list_id, b"email,name\nold@example.com,Old\n")
    assert first["state"] == "done" and first["progress"]["added"] == 1
    suppressions = SuppressionStore(db)
    await suppressions.add(user, "bounced@example.com", reason="bounce", source="test")
    await suppressions.add(
        user, "left@example.com", reason="unsubscribe", source="test", scope=list_id
    )
    await suppressions.add(user, "elsewhere@example.com", reason="x", source="t", scope="other")
    body = (
        b"Name,Email,City\n"
        b"Ann,ann@example.com,Oslo\n"
        b"Nobody,not-an-address,\n"
        b"Ann again,ANN@example.com,\n"
        b"Old,OLD@example.com,Bergen\n"
        b"Bounced,bounced@example.com,\n"
        b"Left,left@example.com,\n"
        b"Elsewhere,elsewhere@example.com,\n"
    )

    report = await imported(api, auth, list_id, body)

    assert report["state"] == "done" and report["reason"] is None
    assert report["progress"] == {
        "rows_read": 7,
        "added": 2,
        "updated": 1,
        "invalid": 1,
        "duplicates": 1,
        "suppressed": 1,
        "unsubscribed": 1,
        "over_limit": 0,
    }
    assert [(p["row"], p["kind"], p["email"]) for p in report["problems"]] == [
        (3, "invalid", "not-an-address"),
        (4, "duplicate", "ANN@example.com"),
        (5, "existing", "OLD@example.com"),
        (6, "suppressed", "bounced@example.com"),
        (7, "unsubscribed", "left@example.com"),
    ]
    listed = (await api.get(f"/v1/lists/{list_id}", headers=auth)).json()
    assert listed["contacts"] == 3
    assert listed["latest_import"]["id"] == report["id"]
    page = ListContactsPage.model_validate(
        (await api.get(f"/v1/lists/{list_id}/contacts", headers=auth)).json()
    )
    contacts = {c.email: (c.name, c.fields) for c in page.data}
    assert contacts == {
        "ann@example.com": ("Ann", {"name": "Ann", "city": "Oslo"}),
        "old@example.com": ("Old", {"name": "Old", "city": "Bergen"}),
        "elsewhere@example.com": ("Elsewhere", {"name": "Elsewhere"}),
    }


async def test_contacts_are_paged_each_once(api: httpx.AsyncClient, db: Database) -> None:
    _, auth = await new_user(db)
    list_id = await new_list(api, auth)
    emails = {f"p{i}@example.com" for i in range(230)}
    body = ("email\n" + "\n".join(sorted(emails)) + "\n").encode()
    assert (await imported(api, auth, list_id, body))["progress"]["added"] == 230
    seen: list[str] = []
    cursor: str | None = None

    while True:
        params = {"limit": "100"} | ({"cursor": cursor} if cursor else {})
        page = await api.get(f"/v1/lists/{list_id}/contacts", params=params, headers=auth)
        assert page.status_code == 200
        seen.extend(c["email"] for c in page.json()["data"])
        cursor = page.json()["next_cursor"]
        if cursor is None:
            break

    assert sorted(seen) == sorted(emails)
    bad = await api.get(f"/v1/lists/{list_id}/contacts?cursor=eyJidWNrZXQiOiAieCJ9", headers=auth)
    assert (bad.status_code, bad.json()["error"]["code"]) == (400, "bad_cursor")


async def test_a_removed_contact_leaves_the_list_and_its_count(
    api: httpx.AsyncClient, db: Database
) -> None:
    _, auth = await new_user(db)
    list_id = await new_list(api, auth)
    await imported(api, auth, list_id, b"email\na@example.com\nb@example.com\n")

    gone = await api.delete(f"/v1/lists/{list_id}/contacts/A@example.com", headers=auth)
    again = await api.delete(f"/v1/lists/{list_id}/contacts/a@example.com", headers=auth)

    assert (gone.status_code, again.status_code) == (204, 404)
    listed = (await api.get(f"/v1/lists/{list_id}", headers=auth)).json()
    assert listed["contacts"] == 1
    page = (await api.get(f"/v1/lists/{list_id}/contacts", headers=auth)).json()
    assert [c["email"] for c in page["data"]] == ["b@example.com"]


async def test_another_users_list_is_not_found(api: httpx.AsyncClient, db: Database) -> None:
    _, auth = await new_user(db)
    _, other = await new_user(db)
    list_id = await new_list(api, auth)
    report = await imported(api, auth, list_id, b"email\na@example.com\n")
    import_path = f"/v1/lists/{list_id}/imports/{report['id']}"

    answers = [
        await api.get(f"/v1/lists/{list_id}", headers=other),
        await api.get(f"/v1/lists/{list_id}/contacts", headers=other),
        await api.delete(f"/v1/lists/{list_id}/contacts/a@example.com", headers=other),
        await api.post(f"/v1/lists/{list_id}/imports", content=b"email\n", headers=other | CSV),
        await api.get(import_path, headers=other),
    ]

    assert [a.status_code for a in answers] == [404] * 5
    assert (await api.get("/v1/lists", headers=other)).json() == {"data": []}
    assert (await api.get(import_path, headers=auth)).status_code == 200


@pytest.mark.parametrize(
    ("method", "path", "kw", "status", "code"),
    [
        ("POST", "/v1/lists", {"content": b"{", "headers": {}}, 400, "malformed_json"),
        ("POST", "/v1/lists", {"json": {"name": " "}}, 422, "invalid_fields"),
        ("POST", "/v1/lists", {"json": {"name": "a\nb"}}, 422, "invalid_fields"),
        ("POST", "/v1/lists", {"json": {"name": 5}}, 422, "invalid_fields"),
        ("POST", "/v1/lists", {"json": {"name": "x", "y": 1}}, 422, "invalid_fields"),
        ("GET", "/v1/lists/not-a-uuid", {}, 404, "not_found"),
        ("GET", "/v1/lists/9f1c2d3e-4b5a-4c6d-8e7f-0a1b2c3d4e5f", {}, 404, "not_found"),
        ("GET", "/v1/lists/{list}/imports/nope", {}, 404, "not_found"),
        (
            "GET",
            "/v1/lists/{list}/imports/6c1f0a2e-cb0b-11f0-8000-0242ac120002",
            {},
            404,
            "not_found",
        ),
        ("GET", "/v1/lists/{list}/contacts?limit=0", {}, 422, "invalid_fields"),
        ("GET", "/v1/lists/{list}/contacts?cursor=%%%", {}, 400, "bad_cursor"),
        ("POST", "/v1/lists/{list}/imports", {"content": b"email\na@b.co\n"}, 415, None),
        (
            "POST",
            "/v1/lists/{list}/imports",
            {"content": b"email\n", "headers": {"Content-Type": "application/json"}},
            415,
            "unsupported_media_type",
        ),
        ("POST", "/v1/lists/{list}/imports", {"content": b"", "headers": CSV}, 422, None),
        (
            "POST",
            "/v1/lists/{list}/imports",
            {"content": b"\xff\xfe\x00\x01", "headers": CSV},
            422,
            "invalid_csv",
        ),
        (
            "POST",
            "/v1/lists/{list}/imports",
            {"content": b"name,city\nAnn,Oslo\n", "headers": CSV},
            422,
            "invalid_csv",
        ),
    ],
)
async def test_hostile_requests_get_a_clear_client_error(
    api: httpx.AsyncClient,
    db: Database,
    method: str,
    path: str,
    kw: dict[str, Any],
    status: int,
    code: str | None,
) -> None:
    _, auth = await new_user(db)
    list_id = await new_list(api, auth)
    headers = auth | kw.pop("headers", {})

    answer = await api.request(method, path.format(list=list_id), headers=headers, **kw)

    assert answer.status_code == status, answer.text
    if code is not None:
        assert answer.json()["error"]["code"] == code


async def test_a_body_over_the_limit_is_refused_while_it_streams_in(
    small_api: httpx.AsyncClient, db: Database
) -> None:
    _, auth = await new_user(db)
    list_id = await new_list(small_api, auth)
    body = b"email\n" + b"a@example.com\n" * 200

    answer = await small_api.post(f"/v1/lists/{list_id}/imports", content=body, headers=auth | CSV)

    assert (answer.status_code, answer.json()["error"]["code"]) == (413, "body_too_large")


async def test_rows_past_the_limits_are_reported_over_the_limit(
    small_api: httpx.AsyncClient, db: Database
) -> None:
    """Five rows are read (in slices of two), three contacts fit in the list."""
    _, auth = await new_user(db)
    list_id = await new_list(small_api, auth)
    body = ("email\n" + "".join(f"r{i}@example.com\n" for i in range(7))).encode()

    report = await imported(small_api, auth, list_id, body)

    assert report["progress"]["rows_read"] == 7
    assert (report["progress"]["added"], report["progress"]["over_limit"]) == (3, 4)
    assert [p["row"] for p in report["problems"]] == [5, 6, 7, 8]
    assert (await small_api.get(f"/v1/lists/{list_id}", headers=auth)).json()["contacts"] == 3


async def test_a_file_failing_part_way_ends_the_import_failed_with_the_reason(
    api: httpx.AsyncClient, db: Database
) -> None:
    _, auth = await new_user(db)
    list_id = await new_list(api, auth)
    body = b'email\na@example.com\n"' + b"x" * 200_000 + b'"\n'

    report = await imported(api, auth, list_id, body)

    assert report["state"] == "failed"
    assert "row 3 is not CSV" in report["reason"]


async def test_one_import_at_a_time_and_a_stale_one_reads_as_failed(
    small_api: httpx.AsyncClient, db: Database
) -> None:
    """An import whose process stopped (its heartbeat is old) is shown failed, and no
    longer holds the list."""
    user, auth = await new_user(db)
    list_id = await new_list(small_api, auth)
    store = ContactLists(db)
    now = datetime.now(UTC)
    running_job = ImportJob(uuid.UUID(list_id), uuid.uuid1(), user, "running", now, now)
    assert await store.begin_import(running_job, None)
    path = f"/v1/lists/{list_id}/imports"

    busy = await small_api.post(path, content=b"email\na@example.com\n", headers=auth | CSV)
    await store.save_import(ImportJob(*_fields(running_job, now - timedelta(seconds=5))))
    shown = await small_api.get(f"{path}/{running_job.import_id}", headers=auth)
    listed = await small_api.get(f"/v1/lists/{list_id}", headers=auth)
    after = await small_api.post(path, content=b"email\na@example.com\n", headers=auth | CSV)

    assert (busy.status_code, busy.json()["error"]["code"]) == (409, "import_running")
    assert (shown.json()["state"], shown.json()["reason"]) == ("failed", INTERRUPTED)
    assert listed.json()["latest_import"]["state"] == "failed"
    assert after.status_code == 202


def _fields(job: ImportJob, heartbeat: datetime) -> tuple[Any, ...]:
    return (job.list_id, job.import_id, job.user_id, job.state, job.created_at, heartbeat)


async def test_the_dashboard_lists_the_users_lists_with_their_latest_import(
    api: httpx.AsyncClient, db: Database
) -> None:
    user, auth = await new_user(db)
    list_id = await new_list(api, auth, "Dashboard <b>list</b>")
    await imported(api, auth, list_id, b"email\na@example.com\nnope\n")
    await new_list(api, (await new_user(db))[1], "Someone else's")
    session_id, _ = await SessionStore(db).create(user)
    api.cookies.set(SESSION_COOKIE, session_id, domain="api.test")

    page = await api.get("/lists")

    assert page.status_code == 200
    assert f'data-list="{list_id}"' in page.text
    assert f'data-contacts="{list_id}">1<' in page.text
    assert 'data-import-state="done"' in page.text
    assert "2 rows read: 1 added, 1 invalid" in page.text
    assert "Dashboard &lt;b&gt;list&lt;/b&gt;" in page.text
    assert "Someone else" not in page.text
    assert 'href="/lists" aria-current="page"' in page.text


async def test_two_imports_sent_at_once_one_begins_and_the_other_is_told_to_wait(
    api: httpx.AsyncClient, db: Database
) -> None:
    _, auth = await new_user(db)
    list_id = await new_list(api, auth)
    body = ("email\n" + "".join(f"c{i}@example.com\n" for i in range(3000))).encode()
    path = f"/v1/lists/{list_id}/imports"

    answers = await asyncio.gather(
        api.post(path, content=body, headers=auth | CSV),
        api.post(path, content=body, headers=auth | CSV),
    )

    assert sorted(a.status_code for a in answers) == [202, 409]
    (started,) = [a for a in answers if a.status_code == 202]
    done_path = f"{path}/{started.json()['import_id']}"

    async def ended() -> bool:
        state: str = (await api.get(done_path, headers=auth)).json()["state"]
        return state == "done"

    await eventually(ended)
    listed = (await api.get(f"/v1/lists/{list_id}", headers=auth)).json()
    assert listed["contacts"] == 3000


async def test_an_import_ending_while_a_file_uploads_does_not_refuse_the_file(
    api: httpx.AsyncClient, db: Database
) -> None:
    """The list is read again once the body has arrived: the import that ended meanwhile
    is the latest (no false 409) and its contacts are the new import's base."""
    user, auth = await new_user(db)
    list_id = await new_list(api, auth)
    reading, gate = asyncio.Event(), asyncio.Event()

    async def slow_file() -> AsyncIterator[bytes]:
        yield b"email\n"
        reading.set()  # the handler is reading the body: it has read the list
        await gate.wait()
        yield b"new@example.com\n"

    upload = asyncio.create_task(
        api.post(f"/v1/lists/{list_id}/imports", content=slow_file(), headers=auth | CSV)
    )
    await asyncio.wait_for(reading.wait(), 10)
    store, now = ContactLists(db), datetime.now(UTC)
    other = ImportJob(uuid.UUID(list_id), uuid.uuid1(), user, "done", now, now, finished_at=now)
    assert await store.begin_import(other, None)
    await store.put(other.list_id, [Contact("a@example.com", {}), Contact("b@example.com", {})])
    await store.set_count(user, other.list_id, 2)
    gate.set()
    started = await upload

    assert started.status_code == 202, started.text
    path = f"/v1/lists/{list_id}/imports/{started.json()['import_id']}"

    async def ended() -> bool:
        state: str = (await api.get(path, headers=auth)).json()["state"]
        return state == "done"

    await eventually(ended)
    assert (await api.get(f"/v1/lists/{list_id}", headers=auth)).json()["contacts"] == 3
