"""Browser-test fixtures: the whole stack on real ports, and Debian's Chromium driven by Playwright.

One stack serves every browser test of the session: webhooks, the sandbox (SendGrid, Mailgun
and GitHub stand-ins), the API with the dashboard, and the consumers, all real and in process,
against a Cassandra keyspace and a RabbitMQ topology of its own: the stack runs in the
background while other tests run, so it must neither see their rows nor touch their queues.
The hooks worker delivers users' webhooks, whose endpoints may be the sandbox's receiver
(plain http on loopback). The browser reaches them over loopback, so a login is the real
redirect dance:
``/auth/github/login`` → the sandbox's authorize page → ``/auth/github/callback`` → the
dashboard.

Chromium comes from ``deploy/local/chromium.sh`` (Debian's package; Playwright never downloads
a browser). When it cannot be installed the tests skip locally and fail under ``CI=true``.
Each test gets a fresh browser profile (``--user-data-dir``), a GitHub user of its own (the
sandbox approves any login name GitHub is asked for) and a 1366x768 window.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

import pytest
from playwright.async_api import BrowserContext, Page, Route, async_playwright, expect
from pydantic import SecretStr
from starlette.applications import Starlette

from sandbox import signing
from sandbox.app import create_app as create_sandbox
from sandbox.oauth import find_user
from services.api.app import create_app as create_api
from services.api.dashboard import dashboard_routes
from services.consumers.main import create_app as create_consumers
from services.hooks.main import create_app as create_hooks
from services.webhooks.app import create_app as create_webhooks
from shared.infra.config import (
    CassandraSettings,
    GitHubSettings,
    SandboxSettings,
    Settings,
    WebhookSettings,
)
from tests.conftest import CI, ROOT, KeyspacePool, private_keyspace, stack_settings, unique
from tests.integration.harness import running, served
from tests.integration.hookstack import hooks_settings

#: Debian's Chromium (deploy/local/chromium.sh installs it; the same variable overrides both).
CHROMIUM = Path(os.environ.get("SAFEDELIVR_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1366, "height": 768}
SCREENSHOTS = ROOT / "tests/artifacts/screenshots"
MG_KEY = "browser-mailgun-signing-key"
GITHUB_SECRET = "browser-github-secret"


@dataclass(frozen=True)
class Stack:
    """Base URLs of the served services."""

    api: str
    sandbox: str
    webhooks: str
    settings: Settings
    """What the API runs with (for a second API instance in a test)."""


@pytest.fixture(scope="session")
def chromium() -> Path:
    """Debian's Chromium, installed by the project's script when missing."""
    proc = subprocess.run(
        [str(ROOT / "deploy/local/chromium.sh"), "up"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if proc.returncode != 0 or not CHROMIUM.exists():
        message = f"Chromium is not available:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        if CI:
            pytest.fail(message)
        pytest.skip(message)
    return CHROMIUM


def api_with_dashboard(settings: Settings) -> Starlette:
    """The API app with the dashboard's routes (added here until the app wires them itself)."""
    api = create_api(settings)
    if not any(getattr(r, "path", None) == "/login" for r in api.routes):
        api.router.routes.extend(dashboard_routes())
    return api


@pytest.fixture(scope="session")
async def stack(keyspace_pool: KeyspacePool) -> AsyncIterator[Stack]:
    """Every service on its own loopback port, wired as ``make run`` wires them."""
    async with private_keyspace(keyspace_pool) as cassandra:
        async for stack in _stack(cassandra):
            yield stack


async def _stack(migrated: CassandraSettings) -> AsyncIterator[Stack]:
    private_pem, public_b64 = signing.generate_key_pair()
    exchange = unique("b").replace("_", "-")
    base = stack_settings(migrated, exchange).model_copy(
        update={
            "webhooks": WebhookSettings(
                sendgrid_public_key=public_b64, mailgun_signing_key=SecretStr(MG_KEY)
            ),
            # Users' endpoints may be the sandbox's receiver, on loopback over http.
            "hooks": hooks_settings(),
        }
    )
    async with served(create_webhooks(base)) as hooks_url:
        sandbox = create_sandbox(
            SandboxSettings(
                webhook_url=hooks_url,
                webhook_delay=0.1,
                sendgrid_private_key=SecretStr(private_pem),
                mailgun_signing_key=SecretStr(MG_KEY),
            )
        )
        async with served(sandbox) as sandbox_url:
            settings = base.model_copy(
                update={
                    "api": base.api.model_copy(update={"dns_url": f"{sandbox_url}/dns-query"}),
                    "providers": base.providers.model_copy(
                        update={
                            "sendgrid_base_url": f"{sandbox_url}/sendgrid",
                            "mailgun_base_url": f"{sandbox_url}/mailgun",
                        }
                    ),
                    "github": GitHubSettings(
                        client_id="safedelivr-browser-tests",
                        client_secret=SecretStr(GITHUB_SECRET),
                        oauth_base_url=f"{sandbox_url}/github",
                        api_base_url=f"{sandbox_url}/github/api",
                    ),
                }
            )
            api = api_with_dashboard(settings)
            async with served(api) as api_url:
                # The API's own address is known only now: the OAuth callback and the public
                # URL (used for cookie flags and origin checks) are read per request.
                api.state.settings = settings.model_copy(
                    update={
                        "operators": ",".join(f"{o}:{github_id(o)}" for o in OPERATORS),
                        "api": settings.api.model_copy(update={"public_url": api_url}),
                        "github": settings.github.model_copy(
                            update={"redirect_uri": f"{api_url}/auth/github/callback"}
                        ),
                    }
                )
                broker = api.state.resources.broker
                await broker.declare()
                try:
                    async with (
                        running(create_consumers(settings)),
                        running(create_hooks(settings)),
                    ):
                        yield Stack(api_url, sandbox_url, hooks_url, api.state.settings)
                finally:
                    await broker.delete()


#: GitHub logins of the accounts the stack's dashboard treats as operators (by their ids; one
#: per test that needs one).
OPERATORS = ("sd-operator-settings", "sd-operator-dead-letters", "sd-operator-letters-page")


def github_id(login: str) -> int:
    """The id of the sandbox's account ``login``."""
    user = find_user(login)
    assert user is not None, login
    return user.id


@pytest.fixture
def github_login() -> str:
    """This test's own GitHub user (the sandbox makes one up for any valid login), so no two
    tests share a dashboard user: neither batches, keys, suppressions nor sessions."""
    return f"user-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def context(chromium: Path, stack: Stack, github_login: str) -> AsyncIterator[BrowserContext]:
    """A fresh Chromium profile per test, whose GitHub logins approve as ``github_login``."""
    with tempfile.TemporaryDirectory(prefix="sd-chromium-") as profile:
        async with async_playwright() as pw:
            ctx = await pw.chromium.launch_persistent_context(
                profile,
                executable_path=str(chromium),
                headless=True,
                args=CHROMIUM_ARGS,
                viewport=VIEWPORT,  # type: ignore[arg-type]
                locale="en-GB",
                timezone_id="UTC",
            )
            ctx.set_default_timeout(15_000)
            # expect() has its own default, 5 s: a page rendered after a form's POST, on the
            # loop the whole stack shares with Chromium on two loaded cores, may take longer.
            expect.set_options(timeout=15_000)
            start = re.compile(re.escape(f"{stack.api}/auth/github/login") + r"(\?|$)")
            await ctx.route(start, _as_user(github_login))
            try:
                yield ctx
            finally:
                await ctx.close()


def _as_user(login: str) -> Callable[[Route], Awaitable[None]]:
    """Add GitHub's ``login`` hint to the API's redirect to GitHub's authorize page (the
    sandbox approves as that user). Playwright does not route redirects, so the start of the
    login is fetched and its answer fulfilled with the hint added."""

    async def handle(route: Route) -> None:
        response = await route.fetch(max_redirects=0)
        location = response.headers["location"]
        hinted = f"{location}&{urlencode({'login': login})}"
        await route.fulfill(response=response, headers={**response.headers, "location": hinted})

    return handle


@pytest.fixture
async def page(context: BrowserContext) -> Page:
    return context.pages[0] if context.pages else await context.new_page()


async def log_in(page: Page, stack: Stack, path: str = "/") -> None:
    """Open ``path`` logged out and go through the GitHub login to land back on it."""
    await page.goto(stack.api + path)
    await expect(page).to_have_url(re.compile(r"/login(\?|$)"))
    await page.get_by_role("link", name="Log in with GitHub").click()
    await expect(page.get_by_role("button", name="Log out")).to_be_visible()


async def screenshot(page: Page, name: str) -> Path:
    """Save a full-page PNG of the current page under tests/artifacts/screenshots/."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    return path
