"""The dashboard's Webhooks pages through the real API app and Cassandra: an endpoint is added
(its secret shown once), changed, disabled, rotated and deleted through the same use cases as
``/v1/webhooks``; bad input is told beside its field; another user's endpoint is a 404; a form
without the CSRF token is refused."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from starlette.applications import Starlette

from services.api.session_store import SESSION_COOKIE, SessionStore
from shared.accounts import accounts
from shared.infra.config import CassandraSettings, Settings
from shared.infra.db import Database
from shared.outbound.hook_store import HookStore
from tests.conftest import delete_topology, stack_settings, unique
from tests.integration.conftest import app_for
from tests.integration.harness import client_for
from tests.integration.hookstack import hooks_settings

#: An endpoint URL the checks accept here (an address literal of an allowed network: no DNS).
URL = "http://127.0.0.1:9/hooks"


@pytest.fixture(scope="module")
async def module_settings(migrated: CassandraSettings) -> AsyncIterator[Settings]:
    s = stack_settings(migrated, unique("t").replace("_", "-"))
    s = s.model_copy(update={"hooks": hooks_settings()})
    yield s
    await delete_topology(s)


@pytest.fixture(scope="module")
async def module_app(module_settings: Settings) -> AsyncIterator[Starlette]:
    async with app_for(module_settings) as app:
        yield app


@pytest.fixture
async def api(module_app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(module_app) as client:
        client.follow_redirects = True
        yield client


@dataclass(frozen=True, slots=True)
class Visitor:
    user_id: uuid.UUID
    csrf: str


async def logged_in(api: httpx.AsyncClient, db: Database) -> Visitor:
    user = await accounts.ensure_user(db, unique("hook_dash"))
    session_id, csrf = await SessionStore(db).create(user)
    api.cookies.set(SESSION_COOKIE, session_id, domain="api.test")
    return Visitor(user, csrf)


async def add(
    api: httpx.AsyncClient, visitor: Visitor, url: str = URL, *events: str
) -> httpx.Response:
    form = {"csrf_token": visitor.csrf, "url": url, **{f"event:{e}": "on" for e in events}}
    return await api.post("/webhooks", data=form, follow_redirects=False)


def secret_of(page: str) -> str:
    found = re.search(r'id="new-secret"[^>]*value="(whsec_[^"]+)"', page)
    assert found is not None, page
    return found.group(1)


async def test_an_endpoint_is_added_with_its_events_and_its_secret_shown_once(
    api: httpx.AsyncClient, db: Database
) -> None:
    visitor = await logged_in(api, db)

    made = await add(api, visitor, URL, "recipient.bounced", "recipient.delivered")
    listed = await api.get("/webhooks")

    assert made.status_code == 201
    secret = secret_of(made.text)
    (stored,) = await HookStore(db).endpoints(visitor.user_id)
    assert stored.secret == secret and stored.url == URL
    assert stored.events == {"recipient.bounced", "recipient.delivered"}
    assert f'href="/webhooks/{stored.endpoint_id}"' in listed.text
    assert "recipient.bounced, recipient.delivered" in listed.text
    assert secret not in listed.text


async def test_a_url_the_checks_refuse_is_told_beside_its_field_and_kept(
    api: httpx.AsyncClient, db: Database
) -> None:
    visitor = await logged_in(api, db)

    refused = await add(api, visitor, "ftp://hooks.example.com/x")

    assert refused.status_code == 422
    assert 'id="url-errors"' in refused.text
    assert 'value="ftp://hooks.example.com/x"' in refused.text
    assert await HookStore(db).endpoints(visitor.user_id) == []


async def test_an_endpoint_is_changed_disabled_rotated_and_deleted(
    api: httpx.AsyncClient, db: Database
) -> None:
    visitor = await logged_in(api, db)
    secret = secret_of((await add(api, visitor)).text)
    (made,) = await HookStore(db).endpoints(visitor.user_id)
    path = f"/webhooks/{made.endpoint_id}"
    csrf = {"csrf_token": visitor.csrf}

    saved = await api.post(
        path, data={**csrf, "action": "save", "url": URL + "/v2", "event:recipient.opened": "on"}
    )
    disabled = await api.post(path, data={**csrf, "action": "disable"})
    rotated = await api.post(f"{path}/rotate", data=csrf)
    changed = await HookStore(db).endpoint(visitor.user_id, made.endpoint_id)
    deleted = await api.post(f"{path}/delete", data=csrf)
    gone = await api.get(path)

    assert "The endpoint was changed." in saved.text
    assert "Disabled" in disabled.text and 'value="enable"' in disabled.text
    assert rotated.status_code == 200
    assert changed is not None
    assert (changed.url, changed.events, changed.enabled) == (
        URL + "/v2",
        frozenset({"recipient.opened"}),
        False,
    )
    assert secret_of(rotated.text) == changed.secret != secret
    assert changed.previous_secret == secret
    assert "The endpoint was deleted." in deleted.text
    assert gone.status_code == 404


async def test_a_replay_while_the_endpoint_is_disabled_is_told_on_its_page(
    api: httpx.AsyncClient, db: Database
) -> None:
    visitor = await logged_in(api, db)
    await add(api, visitor)
    (made,) = await HookStore(db).endpoints(visitor.user_id)
    path = f"/webhooks/{made.endpoint_id}"
    await api.post(path, data={"csrf_token": visitor.csrf, "action": "disable"})

    refused = await api.post(
        f"{path}/replay", data={"csrf_token": visitor.csrf, "msg_id": "msg_x", "replay_key": "a1"}
    )

    assert refused.status_code == 409
    assert 'id="webhook-problem"' in refused.text and "enable it, then replay" in refused.text


async def test_another_users_endpoint_is_not_found(api: httpx.AsyncClient, db: Database) -> None:
    owner = await logged_in(api, db)
    await add(api, owner)
    (theirs,) = await HookStore(db).endpoints(owner.user_id)
    visitor = await logged_in(api, db)
    path = f"/webhooks/{theirs.endpoint_id}"
    csrf = {"csrf_token": visitor.csrf}

    answers = [
        await api.get(path),
        await api.post(path, data={**csrf, "action": "disable"}),
        await api.post(f"{path}/rotate", data=csrf),
        await api.post(f"{path}/delete", data=csrf),
        await api.post(f"{path}/replay", data={**csrf, "msg_id": "m"}),
    ]

    assert [a.status_code for a in answers] == [404] * 5
    still = await HookStore(db).endpoint(owner.user_id, theirs.endpoint_id)
    assert still is not None and still.enabled and still.secret == theirs.secret


async def test_a_form_without_the_csrf_token_changes_nothing(
    api: httpx.AsyncClient, db: Database
) -> None:
    visitor = await logged_in(api, db)

    refused = await api.post("/webhooks", data={"url": URL})

    assert refused.status_code == 403
    assert await HookStore(db).endpoints(visitor.user_id) == []
