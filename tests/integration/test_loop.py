"""The whole loop: API → consumers → sandbox providers → signed webhooks → logs, stats and
suppressions, with every service real and in process (as `make run` wires them)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from sandbox import signing
from sandbox.app import create_app as create_sandbox
from services.api.app import create_app as create_api
from services.consumers.main import create_app as create_consumers
from services.webhooks.app import create_app as create_webhooks
from shared.accounts import accounts
from shared.infra.config import ProviderSettings, SandboxSettings, Settings, WebhookSettings
from shared.infra.db import Database
from tests.conftest import unique
from tests.integration.harness import batch_stats, client_for, eventually, running, served

MG_KEY = "loop-mailgun-signing-key"


@pytest.fixture
async def loop(settings: Settings, db: Database) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    private_pem, public_b64 = signing.generate_key_pair()
    s = settings.model_copy(
        update={
            "webhooks": WebhookSettings(
                sendgrid_public_key=public_b64, mailgun_signing_key=SecretStr(MG_KEY)
            )
        }
    )
    async with served(create_webhooks(s)) as hooks_url:
        sandbox = create_sandbox(
            SandboxSettings(
                webhook_url=hooks_url,
                webhook_delay=0.1,
                sendgrid_private_key=SecretStr(private_pem),
                mailgun_signing_key=SecretStr(MG_KEY),
            )
        )
        async with served(sandbox) as sandbox_url:
            s = s.model_copy(
                update={
                    "providers": ProviderSettings(
                        **{
                            **s.providers.model_dump(),
                            "sendgrid_base_url": f"{sandbox_url}/sendgrid",
                            "mailgun_base_url": f"{sandbox_url}/mailgun",
                        }
                    )
                }
            )
            api = create_api(s)
            key = await accounts.create_key(
                db, await accounts.ensure_user(db, unique("loop")), "loop"
            )
            async with running(api), client_for(api) as client:
                await api.state.resources.broker.declare()
                async with running(create_consumers(s)):
                    client.headers["Authorization"] = f"Bearer {key}"
                    yield client, key
                await api.state.resources.broker.delete()


async def _logs(api: httpx.AsyncClient, batch_id: str) -> dict[str, dict[str, Any]]:
    resp = await api.get(f"/v1/batches/{batch_id}/logs", params={"limit": "100"})
    return {r["email"].split("@")[0].split(".")[0]: r for r in resp.json()["data"]}


async def test_batch_goes_from_queued_to_outcomes_with_stats(
    loop: tuple[httpx.AsyncClient, str],
) -> None:
    """Delivered, bounced, complained and provider-dropped recipients all reach the right end."""
    api, _ = loop
    tag = uuid.uuid4().hex[:6]
    to = [f"{name}.{tag}@example.com" for name in ("ann", "bounce", "sgdrop", "complaint")]
    resp = await api.post(
        "/v1/batches",
        json={
            "from": "Shop <shop@example.com>",
            "to": to,
            "subject": "Hi",
            "text": "Hello",
            "bulk": True,
        },
    )
    assert resp.status_code == 202, resp.text
    batch_id = resp.json()["batch_id"]

    async def settled() -> dict[str, dict[str, Any]] | None:
        logs = await _logs(api, batch_id)
        done = (
            len(logs) == 4
            and all(r["state"] != "queued" for r in logs.values())
            and logs["complaint"]["event"] == "complained"
        )
        return logs if done else None

    logs = await eventually(settled, timeout=60)

    assert (logs["ann"]["state"], logs["ann"]["event"]) == ("success", "delivered")
    assert (logs["bounce"]["state"], logs["bounce"]["event"]) == ("failed", "bounced")
    assert (logs["sgdrop"]["state"], logs["sgdrop"]["event"]) == ("success", "delivered")
    assert logs["sgdrop"]["providers"]["sg"].startswith("dropped")
    assert logs["sgdrop"]["providers"]["mg"] == "delivered"
    assert logs["complaint"]["state"] == "success"

    stats = await batch_stats(api, batch_id)
    assert {k: stats[k] for k in ("queued", "success", "failed", "bounced", "complained")} == {
        "queued": 4,
        "success": 3,
        "failed": 1,
        "bounced": 1,
        "complained": 1,
    }

    again = await api.post(
        "/v1/batches",
        json={"from": "shop@example.com", "to": [to[0], to[1]], "subject": "Again", "text": "x"},
    )
    assert again.status_code == 202
    assert again.json()["suppressed"] == [to[1]]
    assert again.json()["accepted"] == 1
