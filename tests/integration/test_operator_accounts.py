"""Operators and sign-up by GitHub account id, through the real login flow (API app and
dashboard, real Cassandra, the sandbox's GitHub): a login is a name anyone may hold next, so
neither the Operations pages nor the allowlist follow one."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlencode, urlsplit

import httpx
import pytest
from starlette.applications import Starlette

from sandbox.app import create_app as create_sandbox
from shared.accounts import accounts
from shared.accounts.signup import SignupRequests
from shared.infra.config import CassandraSettings, SandboxSettings
from shared.infra.db import Database
from tests.integration.harness import served
from tests.integration.test_auth import Browser, api_app, browser_for, gh_login, make_settings


@pytest.fixture(scope="module")
async def github_url() -> AsyncIterator[str]:
    app = create_sandbox(SandboxSettings(webhook_url="http://127.0.0.1:9", webhook_delay=60))
    async with served(app) as url:
        yield url


def new_id() -> int:
    return 50_000_000 + uuid.uuid4().int % 10_000_000


async def log_in(browser: Browser, login: str, github_id: int) -> httpx.Response:
    """A whole GitHub login as the account ``github_id`` holding the login ``login`` now."""
    started = await browser.start()
    query = urlencode({"login": login, "id": str(github_id)})
    approved = await browser.github.get(f"{started.headers['location']}&{query}")
    parts = urlsplit(approved.headers["location"])
    return await browser.api.get(f"{parts.path}?{parts.query}")


async def operations_as(app: Starlette, login: str, github_id: int) -> int:
    """The status of ``/operations`` for the account after it logs in."""
    async with browser_for(app) as browser:
        assert (await log_in(browser, login, github_id)).status_code == 302
        return (await browser.api.get("/operations")).status_code


async def test_operator_pages_follow_the_github_account_not_its_login(
    migrated: CassandraSettings, github_url: str, db: Database
) -> None:
    """The operator keeps the pages under a new login; whoever registers the login they let
    go gets no page, and a user of their own that inherits nothing."""
    listed, operator_id, newcomer_id = gh_login(), new_id(), new_id()
    settings = make_settings(migrated, github_url).model_copy(
        update={"operators": f"{listed}:{operator_id}"}
    )
    async with api_app(settings) as app:
        before = await operations_as(app, listed, operator_id)
        renamed = await operations_as(app, gh_login(), operator_id)
        taken = await operations_as(app, listed, newcomer_id)

    assert (before, renamed, taken) == (200, 200, 404)
    operator, newcomer = (
        await accounts.github_user(db, operator_id),
        await accounts.github_user(db, newcomer_id),
    )
    assert operator is not None and newcomer is not None and operator != newcomer


async def test_a_renamed_account_is_the_same_user_and_a_taken_login_inherits_nothing(
    migrated: CassandraSettings, github_url: str, db: Database
) -> None:
    """The user record is found by GitHub id at sign-in: keys stay with the account."""
    login, first_id, second_id = gh_login(), new_id(), new_id()
    async with api_app(make_settings(migrated, github_url)) as app:
        async with browser_for(app) as browser:
            await log_in(browser, login, first_id)
        owner = await accounts.github_user(db, first_id)
        assert owner is not None
        await accounts.create_key(db, owner, "kept")
        async with browser_for(app) as browser:
            await log_in(browser, gh_login(), first_id)
            renamed = await accounts.github_user(db, first_id)
        async with browser_for(app) as browser:
            await log_in(browser, login, second_id)
            other = await accounts.github_user(db, second_id)

    assert renamed == owner and other not in (None, owner)
    assert other is not None and await accounts.list_keys(db, other) == []
    assert [k.name for k in await accounts.list_keys(db, owner)] == ["kept"]


async def test_the_allowlist_admits_the_account_it_names_whatever_its_login(
    migrated: CassandraSettings, github_url: str, db: Database
) -> None:
    listed, listed_id = gh_login(), new_id()
    settings = make_settings(migrated, github_url).model_copy(
        update={"signup": "allowlist", "signup_allow": f"{listed}:{listed_id}"}
    )
    async with api_app(settings) as app:
        async with browser_for(app) as browser:
            taken = await log_in(browser, listed, new_id())
        async with browser_for(app) as browser:
            renamed = await log_in(browser, gh_login(), listed_id)

    assert (taken.status_code, renamed.status_code) == (403, 302)


async def test_an_operator_answers_the_request_of_the_account_they_saw(
    migrated: CassandraSettings, github_url: str, db: Database
) -> None:
    """Two requests carry one login (the first asker renamed, another took the name): the
    Operations page answers by id, so approving one admits that one only."""
    login, first_id, second_id, operator_id = gh_login(), new_id(), new_id(), new_id()
    settings = make_settings(migrated, github_url).model_copy(
        update={"signup": "approval", "operators": str(operator_id)}
    )
    operator_login = gh_login()
    await accounts.upsert_github_user(  # signed up before
        db, github_id=operator_id, login=operator_login, name=None, email=None, avatar_url=None
    )
    async with api_app(settings) as app:
        for github_id in (first_id, second_id):
            async with browser_for(app) as browser:
                assert (await log_in(browser, login, github_id)).status_code == 403
        async with browser_for(app) as ops:
            await log_in(ops, operator_login, operator_id)
            page = await ops.api.get("/operations")
            token = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
            assert token is not None and f'value="{first_id}"' in page.text
            answered = await ops.api.post(
                "/operations/signups",
                data={"csrf_token": token[1], "github_id": str(first_id), "answer": "approved"},
            )
        async with browser_for(app) as browser:
            first = await log_in(browser, gh_login(), first_id)
        async with browser_for(app) as browser:
            second = await log_in(browser, login, second_id)

    assert answered.status_code == 303, answered.text
    assert (first.status_code, second.status_code) == (302, 403)
    states = {r.github_id: r.state for r in await SignupRequests(db).all(100_000)}
    assert states.get(second_id) == "pending" and first_id not in states
