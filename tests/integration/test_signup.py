"""Sign-up policies through the real login flow (API app, real Cassandra, sandbox GitHub): a
newcomer who is not admitted gets a clear 403 page, no session, no user row and no key.

One API app serves the module: the login routes read the sign-up policy from the app's
settings at each request, so each login sets the policy it is made under (starting an app
per login cost two seconds of Cassandra and RabbitMQ set-up each, most of this file's time)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from urllib.parse import urlencode, urlsplit

import httpx
import pytest
from starlette.applications import Starlette

from sandbox.app import create_app as create_sandbox
from sandbox.oauth import default_org_id, find_user
from shared.accounts.signup import SignupRequests
from shared.infra.config import CassandraSettings, SandboxSettings, Settings
from shared.infra.db import Database
from tests.conftest import ROOT
from tests.integration.harness import served
from tests.integration.test_auth import api_app, browser_for, gh_login, make_settings


@pytest.fixture(scope="module")
async def github_url() -> AsyncIterator[str]:
    app = create_sandbox(SandboxSettings(webhook_url="http://127.0.0.1:9", webhook_delay=60))
    async with served(app) as url:
        yield url


@pytest.fixture(scope="module")
async def shared_app(migrated: CassandraSettings, github_url: str) -> AsyncIterator[Starlette]:
    async with api_app(make_settings(migrated, github_url)) as app:
        yield app


@pytest.fixture
def app(shared_app: Starlette) -> Iterator[Starlette]:
    """The module's app, its settings as they were before the test (whatever policy the
    test's logins set)."""
    base: Settings = shared_app.state.settings
    yield shared_app
    shared_app.state.settings = base


def github_id(login: str) -> int:
    """The id the sandbox's GitHub gives the account ``login``."""
    user = find_user(login)
    assert user is not None
    return user.id


def with_policy(app: Starlette, **policy: str) -> None:
    """The sign-up ``policy`` from the next request on (over the module's settings)."""
    base: Settings = app.state.settings
    app.state.settings = base.model_copy(update={"signup": None, "signup_allow": "", **policy})


async def log_in(app: Starlette, login: str, orgs: str = "", **policy: str) -> httpx.Response:
    """One complete GitHub login as ``login``, in a browser of its own, under the sign-up
    ``policy``."""
    with_policy(app, **policy)
    async with browser_for(app) as browser:
        started = await browser.start()
        extra = {"login": login, **({"orgs": orgs} if orgs else {})}
        approved = await browser.github.get(started.headers["location"] + "&" + urlencode(extra))
        parts = urlsplit(approved.headers["location"])
        answer = await browser.api.get(f"{parts.path}?{parts.query}")
        answer.extensions["session"] = browser.session
        answer.extensions["authorize"] = started.headers["location"]
        return answer


async def user_rows(db: Database, login: str) -> int:
    rows = await db.rows("SELECT login FROM users WHERE login = ? ALLOW FILTERING", (login,))
    return len(rows)


async def test_closed_sign_up_refuses_a_newcomer_with_a_page_and_no_rows(
    app: Starlette, db: Database
) -> None:
    login = gh_login()

    answer = await log_in(app, login, signup="closed")

    assert answer.status_code == 403
    assert "Not admitted" in answer.text and login in answer.text
    assert answer.extensions["session"] is None
    assert await user_rows(db, login) == 0


async def test_closed_sign_up_still_lets_an_existing_user_in(app: Starlette, db: Database) -> None:
    login = gh_login()
    await log_in(app, login, signup="open")

    answer = await log_in(app, login, signup="closed")

    assert answer.status_code == 302
    assert answer.extensions["session"] is not None


async def test_allowlist_admits_a_listed_login_and_refuses_another(
    app: Starlette, db: Database
) -> None:
    listed, other = gh_login(), gh_login()
    policy = {"signup": "allowlist", "signup_allow": f"1,{listed}:{github_id(listed)}"}

    admitted = await log_in(app, listed, **policy)
    refused = await log_in(app, other, **policy)

    assert (admitted.status_code, refused.status_code) == (302, 403)
    assert (await user_rows(db, listed), await user_rows(db, other)) == (1, 0)


async def test_allowlist_admits_members_of_a_listed_organisation(
    app: Starlette, db: Database
) -> None:
    member, outsider = gh_login(), gh_login()
    policy = {"signup": "allowlist", "signup_allow": f"org:acme:{default_org_id('acme')}"}

    admitted = await log_in(app, member, orgs="beta,acme", **policy)
    refused = await log_in(app, outsider, orgs="beta", **policy)

    assert "read%3Aorg" in admitted.extensions["authorize"]
    assert (admitted.status_code, refused.status_code) == (302, 403)


async def test_approval_keeps_a_request_until_an_operator_approves_it(
    app: Starlette, db: Database
) -> None:
    login = gh_login()

    waiting = await log_in(app, login, signup="approval")
    again = await log_in(app, login, signup="approval")
    assert (waiting.status_code, again.status_code) == (403, 403)
    assert "waiting for an operator" in waiting.text
    assert await user_rows(db, login) == 0

    requests = SignupRequests(db)
    assert [r.state for r in await requests.all(100_000) if r.login == login] == ["pending"]
    assert await requests.answer(github_id(login), "approved", "test-operator")
    admitted = await log_in(app, login, signup="approval")

    assert admitted.status_code == 302
    assert await user_rows(db, login) == 1
    assert [r for r in await requests.all(100_000) if r.login == login] == []


async def test_a_refused_request_stays_refused(app: Starlette, db: Database) -> None:
    login = gh_login()
    await log_in(app, login, signup="approval")
    assert await SignupRequests(db).answer(github_id(login), "refused", "test-operator")

    answer = await log_in(app, login, signup="approval")

    assert answer.status_code == 403
    assert "does not let new accounts sign up" in answer.text
    assert await user_rows(db, login) == 0


async def test_a_json_caller_gets_the_error_envelope(app: Starlette) -> None:
    with_policy(app, signup="closed")
    async with browser_for(app) as browser:
        started = await browser.start()
        approved = await browser.github.get(
            started.headers["location"] + "&" + urlencode({"login": gh_login()})
        )
        parts = urlsplit(approved.headers["location"])
        answer = await browser.api.get(
            f"{parts.path}?{parts.query}", headers={"Accept": "application/json"}
        )

    assert answer.status_code == 403
    assert answer.json()["error"]["code"] == "signup_closed"


async def test_the_cli_approves_a_request(
    app: Starlette, migrated: CassandraSettings, db: Database
) -> None:
    login = gh_login()
    await log_in(app, login, signup="approval")
    env = {
        "SAFEDELIVR_CASSANDRA_HOSTS": migrated.hosts,
        "SAFEDELIVR_CASSANDRA_PORT": str(migrated.port),
        "SAFEDELIVR_CASSANDRA_KEYSPACE": migrated.keyspace,
        "PATH": "/usr/bin:/bin",
    }

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "services.cli", "signups", *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=60,
            check=False,
        )

    listed = cli("list")
    by_login = cli("approve", login)
    approved = cli("approve", str(github_id(login)))
    unknown = cli("approve", str(github_id(gh_login())))

    assert listed.returncode == 0 and f"{github_id(login)}\t{login}" in listed.stdout
    assert by_login.returncode == 2 and f"id is {github_id(login)}" in by_login.stderr
    assert approved.returncode == 0 and f"{github_id(login)}: approved" in approved.stdout
    assert unknown.returncode == 1 and "no sign-up request" in unknown.stderr
    assert [r.state for r in await SignupRequests(db).all(100_000) if r.login == login] == [
        "approved"
    ]


async def test_the_login_page_does_not_repeat_text_from_its_link(app: Starlette) -> None:
    async with browser_for(app) as browser:
        page = await browser.api.get("/login", params={"error": "Account suspended: call 0900"})

    assert page.status_code == 200
    assert "login did not complete" in page.text
    assert "0900" not in page.text
