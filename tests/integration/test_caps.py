"""Per-user caps through the real API app and Cassandra: for lists, templates, versions,
campaigns and imports in progress, the limit reached is a 409 naming it and its value,
deleting one (an import ending) frees its place, and of two creations at once at the edge
exactly one succeeds; a CSV import of more rows than one may carry is a 413 naming the
limit; a place leaked by a creation that died is given back after the grace."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from services.api.cap_store import CapStore
from services.api.contact_lists import ContactLists
from services.api.schema import ErrorBody
from shared.accounts import accounts
from shared.infra.config import CapSettings, Settings
from shared.infra.db import Database
from tests.conftest import unique
from tests.integration.conftest import app_for
from tests.integration.harness import client_for, eventually


@pytest.fixture(scope="module")
def settings(module_settings: Settings) -> Settings:
    """One stack for the module (``tests/integration/conftest.py``)."""
    return module_settings


CSV = {"Content-Type": "text/csv"}
TEMPLATE = {"name": "welcome", "subject": "Hi", "text": "Hello"}


@pytest.fixture(scope="module")
async def app(settings: Settings) -> AsyncIterator[Starlette]:
    """The API with two of each thing, one import at a time, three contacts an import."""
    caps = CapSettings(
        lists=2,
        templates=2,
        versions=2,
        campaigns=2,
        imports=1,
        contacts_per_import=3,
        claim_grace=10,
    )
    async with app_for(settings.model_copy(update={"caps": caps})) as started:
        yield started


@pytest.fixture
async def api(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(app) as client:
        yield client


async def new_user(db: Database) -> tuple[uuid.UUID, dict[str, str]]:
    user = await accounts.ensure_user(db, unique("caps"))
    key = await accounts.create_key(db, user, "k", scopes=("send", "read"))
    return user, {"Authorization": f"Bearer {key}"}


def refused(answer: httpx.Response, status: int, code: str, name: str, value: int) -> None:
    """``answer`` is the refusal naming the cap and its value, in the error envelope."""
    assert answer.status_code == status, answer.text
    error = ErrorBody.model_validate(answer.json()).error
    assert error.code == code
    assert error.limit is not None and (error.limit.name, error.limit.value) == (name, value)
    assert f"{value}" in error.message


async def make(api: httpx.AsyncClient, auth: dict[str, str], path: str, body: Any) -> str:
    made = await api.post(path, json=body, headers=auth)
    assert made.status_code == 201, made.text
    return str(made.json()["id"])


async def both_at_once(
    api: httpx.AsyncClient, auth: dict[str, str], path: str, body: Any
) -> list[int]:
    answers = await asyncio.gather(
        api.post(path, json=body, headers=auth), api.post(path, json=body, headers=auth)
    )
    return sorted(a.status_code for a in answers)


# -- lists ------------------------------------------------------------------------------------


async def test_the_lists_cap_is_a_409_naming_it_and_deleting_a_list_frees_its_place(
    api: httpx.AsyncClient, db: Database
) -> None:
    _, auth = await new_user(db)
    first = await make(api, auth, "/v1/lists", {"name": "a"})
    await make(api, auth, "/v1/lists", {"name": "b"})

    refused(
        await api.post("/v1/lists", json={"name": "c"}, headers=auth),
        409,
        "too_many_lists",
        "lists",
        2,
    )
    deleted = await api.delete(f"/v1/lists/{first}", headers=auth)
    again = await api.post("/v1/lists", json={"name": "c"}, headers=auth)

    assert (deleted.status_code, again.status_code) == (204, 201)
    assert (await api.get(f"/v1/lists/{first}", headers=auth)).status_code == 404
    names = [x["name"] for x in (await api.get("/v1/lists", headers=auth)).json()["data"]]
    assert sorted(names) == ["b", "c"]


async def test_of_two_lists_made_at_once_for_the_last_place_one_is_made(
    api: httpx.AsyncClient, db: Database
) -> None:
    _, auth = await new_user(db)
    await make(api, auth, "/v1/lists", {"name": "a"})

    assert await both_at_once(api, auth, "/v1/lists", {"name": "b"}) == [201, 409]
    assert len((await api.get("/v1/lists", headers=auth)).json()["data"]) == 2


async def test_a_deleted_list_takes_its_contacts_with_it(
    api: httpx.AsyncClient, db: Database
) -> None:
    _, auth = await new_user(db)
    list_id = await make(api, auth, "/v1/lists", {"name": "a"})
    await _imported(api, auth, list_id, b"email\na@example.com\n")
    store = ContactLists(db)
    assert await store.existing(uuid.UUID(list_id), ["a@example.com"]) == {"a@example.com"}

    assert (await api.delete(f"/v1/lists/{list_id}", headers=auth)).status_code == 204
    assert await store.existing(uuid.UUID(list_id), ["a@example.com"]) == set()
    assert (await api.delete(f"/v1/lists/{list_id}", headers=auth)).status_code == 404


# -- templates and their versions -------------------------------------------------------------


async def test_the_templates_cap_is_a_409_naming_it_and_deleting_one_frees_its_place(
    api: httpx.AsyncClient, db: Database
) -> None:
    _, auth = await new_user(db)
    first = await make(api, auth, "/v1/templates", TEMPLATE)
    await make(api, auth, "/v1/templates", TEMPLATE)

    refused(
        await api.post("/v1/templates", json=TEMPLATE, headers=auth),
        409,
        "too_many_templates",
        "templates",
        2,
    )
    deleted = await api.delete(f"/v1/templates/{first}", headers=auth)
    again = await api.post("/v1/templates", json=TEMPLATE, headers=auth)

    assert (deleted.status_code, again.status_code) == (204, 201)
    assert (await api.get(f"/v1/templates/{first}", headers=auth)).status_code == 404


async def test_of_two_templates_made_at_once_for_the_last_place_one_is_made(
    api: httpx.AsyncClient, db: Database
) -> None:
    _, auth = await new_user(db)
    await make(api, auth, "/v1/templates", TEMPLATE)

    assert await both_at_once(api, auth, "/v1/templates", TEMPLATE) == [201, 409]
    assert len((await api.get("/v1/templates", headers=auth)).json()["data"]) == 2


async def test_the_versions_cap_is_a_409_naming_it_and_deleting_a_version_frees_its_place(
    api: httpx.AsyncClient, db: Database
) -> None:
    _, auth = await new_user(db)
    template = await make(api, auth, "/v1/templates", TEMPLATE)
    path = f"/v1/templates/{template}/versions"
    version = {"subject": "Hi again", "text": "Hello"}
    second = await api.post(path, json=version, headers=auth)
    assert (second.status_code, second.json()["version"]) == (201, 2)

    refused(
        await api.post(path, json=version, headers=auth), 409, "too_many_versions", "versions", 2
    )
    deleted = await api.delete(f"{path}/2", headers=auth)
    again = await api.post(path, json=version, headers=auth)

    assert deleted.status_code == 204
    assert (again.status_code, again.json()["version"]) == (201, 3)
    shown = (await api.get(f"/v1/templates/{template}", headers=auth)).json()
    assert [v["version"] for v in shown["versions"]] == [3, 1]


async def test_the_live_version_cannot_be_deleted(api: httpx.AsyncClient, db: Database) -> None:
    _, auth = await new_user(db)
    template = await make(api, auth, "/v1/templates", TEMPLATE)
    published = await api.post(
        f"/v1/templates/{template}/publish", json={"version": 1}, headers=auth
    )
    assert published.status_code == 200, published.text

    answer = await api.delete(f"/v1/templates/{template}/versions/1", headers=auth)
    missing = await api.delete(f"/v1/templates/{template}/versions/9", headers=auth)

    assert (answer.status_code, answer.json()["error"]["code"]) == (409, "version_in_use")
    assert missing.status_code == 404


async def test_of_two_versions_added_at_once_for_the_last_place_one_is_added(
    api: httpx.AsyncClient, db: Database
) -> None:
    _, auth = await new_user(db)
    template = await make(api, auth, "/v1/templates", TEMPLATE)
    version = {"subject": "Hi again", "text": "Hello"}

    statuses = await both_at_once(api, auth, f"/v1/templates/{template}/versions", version)

    assert statuses == [201, 409]
    shown = (await api.get(f"/v1/templates/{template}", headers=auth)).json()
    assert len(shown["versions"]) == 2


# -- campaigns ----------------------------------------------------------------------------------


async def _campaign_body(api: httpx.AsyncClient, auth: dict[str, str]) -> dict[str, Any]:
    template = await make(api, auth, "/v1/templates", TEMPLATE)
    list_id = await make(api, auth, "/v1/lists", {"name": "subscribers"})
    return {
        "name": "autumn",
        "template_id": template,
        "list_id": list_id,
        "from": "news@example.com",
    }


async def test_the_campaigns_cap_is_a_409_naming_it_and_deleting_a_draft_frees_its_place(
    api: httpx.AsyncClient, db: Database
) -> None:
    _, auth = await new_user(db)
    body = await _campaign_body(api, auth)
    first = await make(api, auth, "/v1/campaigns", body)
    await make(api, auth, "/v1/campaigns", body)

    refused(
        await api.post("/v1/campaigns", json=body, headers=auth),
        409,
        "too_many_campaigns",
        "campaigns",
        2,
    )
    deleted = await api.delete(f"/v1/campaigns/{first}", headers=auth)
    again = await api.post("/v1/campaigns", json=body, headers=auth)

    assert (deleted.status_code, again.status_code) == (204, 201)
    assert (await api.get(f"/v1/campaigns/{first}", headers=auth)).status_code == 404


async def test_a_running_campaign_is_not_deleted_and_keeps_its_list_and_template(
    api: httpx.AsyncClient, db: Database
) -> None:
    """Scheduled for tomorrow: cancel it first; its list and template are in use until
    then."""
    _, auth = await new_user(db)
    body = await _campaign_body(api, auth)
    campaign = await make(api, auth, "/v1/campaigns", body)
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    scheduled = await api.post(
        f"/v1/campaigns/{campaign}/schedule", json={"send_at": tomorrow}, headers=auth
    )
    assert scheduled.status_code == 200, scheduled.text

    running_one = await api.delete(f"/v1/campaigns/{campaign}", headers=auth)
    the_list = await api.delete(f"/v1/lists/{body['list_id']}", headers=auth)
    the_template = await api.delete(f"/v1/templates/{body['template_id']}", headers=auth)
    await api.post(f"/v1/campaigns/{campaign}/cancel", headers=auth)
    cancelled = await api.delete(f"/v1/campaigns/{campaign}", headers=auth)
    list_after = await api.delete(f"/v1/lists/{body['list_id']}", headers=auth)

    assert (running_one.status_code, running_one.json()["error"]["code"]) == (
        409,
        "campaign_state",
    )
    assert [a.json()["error"]["code"] for a in (the_list, the_template)] == ["in_use"] * 2
    assert (cancelled.status_code, list_after.status_code) == (204, 204)


async def test_of_two_campaigns_made_at_once_for_the_last_place_one_is_made(
    api: httpx.AsyncClient, db: Database
) -> None:
    _, auth = await new_user(db)
    body = await _campaign_body(api, auth)
    await make(api, auth, "/v1/campaigns", body)

    assert await both_at_once(api, auth, "/v1/campaigns", body) == [201, 409]
    assert len((await api.get("/v1/campaigns", headers=auth)).json()["data"]) == 2


# -- imports --------------------------------------------------------------------------------------


async def _imported(
    api: httpx.AsyncClient, auth: dict[str, str], list_id: str, body: bytes
) -> dict[str, Any]:
    started = await api.post(f"/v1/lists/{list_id}/imports", content=body, headers=auth | CSV)
    return await _imported_from(api, auth, list_id, started)


class Upload:
    """An upload that holds until it is let go (its import's place is held meanwhile)."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.go = asyncio.Event()

    async def stream(self) -> AsyncIterator[bytes]:
        yield self.body[:6]
        await self.go.wait()
        yield self.body[6:]

    def post(
        self, api: httpx.AsyncClient, auth: dict[str, str], list_id: str
    ) -> asyncio.Task[httpx.Response]:
        return asyncio.create_task(
            api.post(f"/v1/lists/{list_id}/imports", content=self.stream(), headers=auth | CSV)
        )


async def test_imports_in_progress_are_capped_and_one_ending_frees_its_place(
    api: httpx.AsyncClient, db: Database
) -> None:
    """An upload holds its place: another import is refused until it has ended."""
    user, auth = await new_user(db)
    first = await make(api, auth, "/v1/lists", {"name": "a"})
    second = await make(api, auth, "/v1/lists", {"name": "b"})
    upload = Upload(b"email\na@example.com\n")
    pending = upload.post(api, auth, first)

    async def claimed() -> bool:
        return bool((await CapStore(db).read(user, "imports")).holders)

    await eventually(claimed, timeout=15, interval=0.05)  # its place is claimed, its body waits

    refused(
        await api.post(f"/v1/lists/{second}/imports", content=b"email\n", headers=auth | CSV),
        409,
        "too_many_imports",
        "imports",
        1,
    )
    upload.go.set()
    accepted = await pending
    assert accepted.status_code == 202, accepted.text

    async def ended() -> bool:
        path = f"/v1/lists/{first}/imports/{accepted.json()['import_id']}"
        state: str = (await api.get(path, headers=auth)).json()["state"]
        return state == "done"

    await eventually(ended)
    report = await eventually(lambda: _maybe_imported(api, auth, second))
    assert report["state"] == "done"


async def _maybe_imported(
    api: httpx.AsyncClient, auth: dict[str, str], list_id: str
) -> dict[str, Any] | None:
    """The import's report, or None while the last one's place is being given back."""
    started = await api.post(
        f"/v1/lists/{list_id}/imports", content=b"email\nb@example.com\n", headers=auth | CSV
    )
    if started.status_code == 409:
        return None
    return await _imported_from(api, auth, list_id, started)


async def _imported_from(
    api: httpx.AsyncClient, auth: dict[str, str], list_id: str, started: httpx.Response
) -> dict[str, Any]:
    assert started.status_code == 202, started.text
    path = f"/v1/lists/{list_id}/imports/{started.json()['import_id']}"

    async def ended() -> dict[str, Any] | None:
        job = (await api.get(path, headers=auth)).json()
        return job if job["state"] in ("done", "failed") else None

    report: dict[str, Any] = await eventually(ended)
    return report


async def test_of_two_imports_begun_at_once_for_the_last_place_one_begins(
    api: httpx.AsyncClient, db: Database
) -> None:
    _, auth = await new_user(db)
    lists = [await make(api, auth, "/v1/lists", {"name": n}) for n in ("a", "b")]
    uploads = [Upload(b"email\na@example.com\n") for _ in lists]

    tasks = [u.post(api, auth, x) for u, x in zip(uploads, lists, strict=True)]
    done, _ = await asyncio.wait(tasks, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    for u in uploads:
        u.go.set()
    answers = [await t for t in tasks]

    assert len(done) == 1
    assert next(iter(done)).result().json()["error"]["code"] == "too_many_imports"
    assert sorted(a.status_code for a in answers) == [202, 409]


async def test_a_file_of_more_contacts_than_an_import_may_carry_is_a_413_naming_it(
    api: httpx.AsyncClient, db: Database
) -> None:
    """Nothing of it is imported, and its place is given back at once."""
    _, auth = await new_user(db)
    list_id = await make(api, auth, "/v1/lists", {"name": "a"})
    four = b"email\n" + b"".join(b"r%d@example.com\n" % i for i in range(4))

    refused(
        await api.post(f"/v1/lists/{list_id}/imports", content=four, headers=auth | CSV),
        413,
        "too_many_contacts",
        "contacts_per_import",
        3,
    )
    shown = (await api.get(f"/v1/lists/{list_id}", headers=auth)).json()
    report = await _imported(api, auth, list_id, four[: four.rindex(b"r3@")])

    assert (shown["contacts"], shown["latest_import"]) == (0, None)
    assert (report["state"], report["progress"]["added"]) == ("done", 3)


# -- healing --------------------------------------------------------------------------------------


async def test_a_place_leaked_by_a_creation_that_died_is_given_back_after_the_grace(
    api: httpx.AsyncClient, db: Database
) -> None:
    """A list's place claimed by a process that died before making it: it holds while it
    may still be made (the grace), then the next creation at the cap takes it."""
    user, auth = await new_user(db)
    await make(api, auth, "/v1/lists", {"name": "a"})
    caps = CapStore(db)
    ledger = await caps.read(user, "lists")
    leaked = {**ledger.holders, str(uuid.uuid1()): datetime.now(UTC)}
    assert await caps.write(user, "lists", ledger.version, leaked)

    young = await api.post("/v1/lists", json={"name": "b"}, headers=auth)
    ledger = await caps.read(user, "lists")
    aged = {h: at - timedelta(seconds=11) for h, at in ledger.holders.items()}
    assert await caps.write(user, "lists", ledger.version, aged)
    old = await api.post("/v1/lists", json={"name": "b"}, headers=auth)

    assert (young.status_code, old.status_code) == (409, 201)
    assert len((await caps.read(user, "lists")).holders) == 2


async def test_lists_made_before_the_caps_count(api: httpx.AsyncClient, db: Database) -> None:
    user, auth = await new_user(db)
    store = ContactLists(db)
    await store.create(user, "old 1")
    await store.create(user, "old 2")

    answer = await api.post("/v1/lists", json={"name": "new"}, headers=auth)

    refused(answer, 409, "too_many_lists", "lists", 2)
