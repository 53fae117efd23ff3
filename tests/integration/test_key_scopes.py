"""API key scopes, expiry and the per-user cap, and logging out everywhere, against the real
API app, Cassandra and RabbitMQ: a key does only what its scopes allow (403 otherwise), never
grants more than it holds, and stops at its expiry (401)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from starlette.applications import Starlette

from sandbox.app import create_app as create_sandbox
from services.api.app import create_app
from shared.accounts import accounts
from shared.infra.config import SandboxSettings, Settings
from shared.infra.db import Database
from tests.conftest import unique
from tests.integration.conftest import app_for
from tests.integration.harness import client_for, running, served
from tests.integration.test_auth import browser_for, gh_login, make_settings, user_of

BATCH = {"from": "shop@example.com", "to": ["ann@example.com"], "subject": "Hi", "text": "x"}


@pytest.fixture(scope="module")
async def app(module_settings: Settings) -> AsyncIterator[Starlette]:
    """One API for the module (each test makes its own user), with 3 keys a user at most."""
    settings = module_settings
    s = settings.model_copy(
        update={"api": settings.api.model_copy(update={"max_keys_per_user": 3})}
    )
    async with app_for(s) as app:
        yield app


@pytest.fixture
async def api(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(app) as client:
        yield client


async def key_with(db: Database, *scopes: str, **options: object) -> tuple[str, dict[str, str]]:
    user = await accounts.ensure_user(db, unique("scoped"))
    key = await accounts.create_key(db, user, "k", scopes=scopes, **options)  # type: ignore[arg-type]
    return key, {"Authorization": f"Bearer {key}"}


def refused_for_scope(response: httpx.Response, scope: str) -> bool:
    error = response.json()["error"]
    return (
        response.status_code == 403 and error["code"] == "forbidden" and scope in error["message"]
    )


async def test_a_send_only_key_sends_but_cannot_read_or_manage_keys(
    api: httpx.AsyncClient, db: Database
) -> None:
    _, auth = await key_with(db, "send")

    sent = await api.post("/v1/batches", json=BATCH, headers=auth)
    listed = await api.get("/v1/batches", headers=auth)
    keys = await api.get("/v1/keys", headers=auth)
    minted = await api.post("/v1/keys", json={"name": "more"}, headers=auth)

    assert sent.status_code == 202, sent.text
    assert refused_for_scope(listed, "read")
    assert refused_for_scope(keys, "keys")
    assert refused_for_scope(minted, "keys")


async def test_a_read_only_key_reads_but_cannot_send(api: httpx.AsyncClient, db: Database) -> None:
    _, auth = await key_with(db, "read")

    sent = await api.post("/v1/batches", json=BATCH, headers=auth)
    stats = await api.get("/v1/stats", headers=auth)
    suppress = await api.post("/v1/suppressions", json={"email": "x@example.com"}, headers=auth)

    assert refused_for_scope(sent, "send")
    assert stats.status_code == 200
    assert refused_for_scope(suppress, "send")


async def test_a_key_can_mint_a_narrower_key_that_works(
    api: httpx.AsyncClient, db: Database
) -> None:
    _, auth = await key_with(db, "keys", "send")

    made = await api.post("/v1/keys", json={"name": "ci", "scopes": ["send"]}, headers=auth)

    assert made.status_code == 201, made.text
    assert made.json()["scopes"] == ["send"]
    narrow = {"Authorization": f"Bearer {made.json()['key']}"}
    assert (await api.post("/v1/batches", json=BATCH, headers=narrow)).status_code == 202
    assert refused_for_scope(await api.get("/v1/stats", headers=narrow), "read")


async def test_a_key_cannot_grant_a_scope_it_lacks(api: httpx.AsyncClient, db: Database) -> None:
    _, auth = await key_with(db, "keys", "send")

    wider = await api.post("/v1/keys", json={"scopes": ["send", "read"]}, headers=auth)
    operator = await api.post("/v1/keys", json={"scopes": ["operator"]}, headers=auth)

    assert (wider.status_code, operator.status_code) == (403, 403)
    assert wider.json()["error"]["fields"] == {"scopes": "read is beyond what you hold"}


@pytest.mark.parametrize("scopes", [["mail"], [], "send"])
async def test_a_bad_scope_list_is_422(
    api: httpx.AsyncClient, db: Database, scopes: object
) -> None:
    _, auth = await key_with(db, "keys")

    made = await api.post("/v1/keys", json={"scopes": scopes}, headers=auth)

    assert made.status_code == 422, made.text
    assert all(field.startswith("scopes") for field in made.json()["error"]["fields"])


async def test_the_keys_list_shows_scopes_expiry_and_last_use(
    api: httpx.AsyncClient, db: Database
) -> None:
    until = datetime.now(UTC) + timedelta(days=30)
    _, auth = await key_with(db, "keys", "read", expires_at=until)

    listed = (await api.get("/v1/keys", headers=auth)).json()["data"]

    (view,) = listed
    assert view["scopes"] == ["keys", "read"]
    assert abs(datetime.fromisoformat(view["expires_at"]) - until) < timedelta(seconds=1)
    assert "last_used_at" in view


async def test_an_expired_key_is_a_401(api: httpx.AsyncClient, db: Database) -> None:
    _, auth = await key_with(
        db, "send", "read", expires_at=datetime.now(UTC) - timedelta(seconds=1)
    )

    response = await api.get("/v1/stats", headers=auth)

    assert (response.status_code, response.json()["error"]["code"]) == (401, "unauthorized")


async def test_an_expiry_in_the_past_is_refused_when_minting(
    api: httpx.AsyncClient, db: Database
) -> None:
    _, auth = await key_with(db, "keys", "send")

    made = await api.post("/v1/keys", json={"expires_at": "2020-01-01T00:00:00Z"}, headers=auth)

    assert made.status_code == 422
    assert made.json()["error"]["fields"] == {"expires_at": "must be in the future"}


async def test_a_user_holds_at_most_the_configured_number_of_live_keys(
    api: httpx.AsyncClient, db: Database
) -> None:
    _, auth = await key_with(db, "keys", "send", "read")  # the first of three

    made = [await api.post("/v1/keys", json={}, headers=auth) for _ in range(3)]

    assert [r.status_code for r in made] == [201, 201, 409]
    other = made[0].json()["key"].split("_")[2]  # sd_live_<key_id>_<secret>
    revoked = await api.delete(f"/v1/keys/{other}", headers=auth)
    assert revoked.status_code == 204
    assert (await api.post("/v1/keys", json={}, headers=auth)).status_code == 201


async def test_the_original_api_holds_keys_to_their_scopes(
    api: httpx.AsyncClient, db: Database
) -> None:
    key, _ = await key_with(db, "read")

    posted = await api.post(
        "/api/batch",
        data={"to": "ann@example.com", "from": "shop@example.com", "subject": "s", "body": "b"},
        headers={"Authorization": f"Bearer {key}"},
    )

    assert posted.status_code == 403
    assert "scope" in posted.text


async def test_logging_out_everywhere_ends_every_session(migrated: object) -> None:
    async with served(
        create_sandbox(SandboxSettings(webhook_url="http://127.0.0.1:9", webhook_delay=60))
    ) as github_url:
        app = create_app(make_settings(migrated, github_url))  # type: ignore[arg-type]
        async with running(app):
            await app.state.resources.broker.declare()
            try:
                login = gh_login()
                async with browser_for(app) as here, browser_for(app) as elsewhere:
                    await here.login(login)
                    await elsewhere.login(login)
                    user = await user_of(app, here.session)
                    assert user is not None and await user_of(app, elsewhere.session)

                    ended = await here.api.post(
                        "/sessions/end-all",
                        data={"csrf_token": user.csrf_token},
                        follow_redirects=False,
                    )

                    assert ended.status_code == 303
                    assert await user_of(app, user.session_id) is None
                    assert await user_of(app, elsewhere.session) is None
                    await here.login(login)  # a new login works again
                    assert await user_of(app, here.session) is not None
            finally:
                await app.state.resources.broker.delete()
