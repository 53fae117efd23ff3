"""The alert sink (``alerts.webhook_url``) through the real API and dashboard, Cassandra and
RabbitMQ: one our servers may not post to is refused when it is set, naming why."""

from __future__ import annotations

import re

import pytest

from sandbox.app import create_app as create_sandbox
from services.api.app import create_app
from shared.accounts import accounts
from shared.infra.config import GitHubSettings, SandboxSettings, Settings
from shared.infra.db import Database
from tests.conftest import unique
from tests.integration.harness import client_for, running, served
from tests.integration.test_auth import browser_for
from tests.integration.test_operator_accounts import log_in, new_id


@pytest.mark.parametrize(
    "url",
    ["https://169.254.169.254/latest/meta-data/", "https://127.0.0.1:8080/", "http://[::1]/"],
)
async def test_an_operator_key_cannot_point_alerts_into_our_network(
    settings: Settings, db: Database, url: str
) -> None:
    user = await accounts.ensure_user(db, unique("ops"))
    key = await accounts.create_key(db, user, "ops", scopes=("operator",))
    auth = {"Authorization": f"Bearer {key}"}
    app = create_app(settings)
    async with running(app), client_for(app) as client:
        await app.state.resources.broker.declare()
        try:
            refused = await client.patch(
                "/v1/settings", json={"alerts": {"webhook_url": url}}, headers=auth
            )
            shown = await client.get("/v1/settings", headers=auth)
        finally:
            await app.state.resources.broker.delete()

    assert refused.status_code == 422, refused.text
    assert "alerts.webhook_url" in refused.json()["error"]["fields"]
    assert shown.json()["alerts"]["webhook_url"] != url


async def test_the_operations_page_refuses_an_internal_sink_too(
    settings: Settings, db: Database
) -> None:
    operator_id = new_id()
    sandbox = create_sandbox(SandboxSettings(webhook_url="http://127.0.0.1:9", webhook_delay=60))
    async with served(sandbox) as github_url:
        github = GitHubSettings(
            oauth_base_url=f"{github_url}/github", api_base_url=f"{github_url}/github/api"
        )
        app = create_app(
            settings.model_copy(update={"operators": str(operator_id), "github": github})
        )
        async with running(app), browser_for(app) as browser:
            await app.state.resources.broker.declare()
            try:
                await log_in(browser, unique("ops").replace("_", "-"), operator_id)
                page = await browser.api.get("/operations")
                token = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
                assert token is not None
                form = {"csrf_token": token[1], "alert_url": "https://169.254.169.254/"}
                refused = await browser.api.post("/operations/settings", data=form)
            finally:
                await app.state.resources.broker.delete()

    assert refused.status_code == 422
    assert "link-local" in refused.text
