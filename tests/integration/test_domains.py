"""Sender authorisation against the real API app, Cassandra, RabbitMQ and the sandbox's DNS:
a batch is accepted only ``from`` a domain its user verified by publishing a TXT record."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest

from services.api.app import create_app
from services.sandbox.app import create_app as create_sandbox
from shared import accounts
from shared.config import SandboxSettings, Settings
from shared.db import Database
from tests.conftest import unique
from tests.integration.harness import client_for, running, served


@dataclass
class World:
    api: httpx.AsyncClient
    sandbox: httpx.AsyncClient

    async def publish(self, record: dict[str, str]) -> None:
        body = {"name": record["name"], "value": record["value"]}
        assert (await self.sandbox.post("/_control/dns", json=body)).status_code == 200


@pytest.fixture
async def world(settings: Settings) -> AsyncIterator[World]:
    sandbox = create_sandbox(SandboxSettings(webhook_url="http://127.0.0.1:9", webhook_delay=60))
    async with served(sandbox) as sandbox_url:
        api = settings.api.model_copy(
            update={"sender_domains": "verified", "dns_url": f"{sandbox_url}/dns-query"}
        )
        app = create_app(settings.model_copy(update={"api": api}))
        async with (
            running(app),
            client_for(app) as client,
            httpx.AsyncClient(base_url=sandbox_url) as dns,
        ):
            await app.state.resources.broker.declare()
            try:
                yield World(client, dns)
            finally:
                await app.state.resources.broker.delete()


async def new_key(db: Database, *scopes: str) -> dict[str, str]:
    user = await accounts.ensure_user(db, unique("domains"))
    key = await accounts.create_key(db, user, "k", scopes=scopes or ("send", "read", "keys"))
    return {"Authorization": f"Bearer {key}"}


def domain() -> str:
    return f"{unique('d').replace('_', '-')}.example.net"


def batch(sender: str) -> dict[str, object]:
    return {"from": sender, "to": ["ann@example.com"], "subject": "Hi", "text": "Hello"}


async def verified(world: World, auth: dict[str, str], name: str) -> None:
    added = await world.api.post("/v1/domains", json={"domain": name}, headers=auth)
    await world.publish(added.json()["record"])
    assert (await world.api.post(f"/v1/domains/{name}/verify", headers=auth)).status_code == 200


async def test_a_batch_from_an_unverified_domain_is_a_422_naming_from(
    world: World, db: Database
) -> None:
    auth = await new_key(db)

    refused = await world.api.post("/v1/batches", json=batch("me@example.org"), headers=auth)

    assert refused.status_code == 422
    error = refused.json()["error"]
    assert error["code"] == "invalid_fields"
    assert "example.org is not a verified sending domain" in error["fields"]["from"]


async def test_adding_a_domain_shows_the_txt_record_to_publish(world: World, db: Database) -> None:
    auth = await new_key(db)
    name = domain()

    added = await world.api.post("/v1/domains", json={"domain": name.upper()}, headers=auth)

    assert added.status_code == 201, added.text
    view = added.json()
    assert (view["domain"], view["verified"]) == (name, False)
    assert view["record"]["type"] == "TXT"
    assert view["record"]["name"] == f"_safedelivr.{name}"
    assert view["record"]["value"].startswith("safedelivr-verification=")
    again = await world.api.post("/v1/domains", json={"domain": name}, headers=auth)
    assert again.json()["record"] == view["record"]  # adding again keeps the token


async def test_a_domain_is_verified_only_once_its_record_is_published(
    world: World, db: Database
) -> None:
    auth = await new_key(db)
    name = domain()
    added = (await world.api.post("/v1/domains", json={"domain": name}, headers=auth)).json()

    early = await world.api.post(f"/v1/domains/{name}/verify", headers=auth)
    await world.publish({"name": added["record"]["name"], "value": "safedelivr-verification=x"})
    wrong = await world.api.post(f"/v1/domains/{name}/verify", headers=auth)
    await world.publish(added["record"])
    right = await world.api.post(f"/v1/domains/{name}/verify", headers=auth)

    assert (early.status_code, wrong.status_code, right.status_code) == (422, 422, 200)
    assert early.json()["error"]["code"] == "not_verified"
    assert right.json()["verified"] is True and right.json()["verified_at"]


async def test_a_verified_domain_and_its_subdomains_may_send(world: World, db: Database) -> None:
    auth = await new_key(db)
    name = domain()
    await verified(world, auth, name)

    own = await world.api.post("/v1/batches", json=batch(f"shop@{name}"), headers=auth)
    sub = await world.api.post("/v1/batches", json=batch(f"news@mail.{name}"), headers=auth)
    other = await world.api.post("/v1/batches", json=batch(f"x@other-{name}"), headers=auth)

    assert (own.status_code, sub.status_code, other.status_code) == (202, 202, 422)


async def test_another_users_verified_domain_does_not_authorise_me(
    world: World, db: Database
) -> None:
    owner, other = await new_key(db), await new_key(db)
    name = domain()
    await verified(world, owner, name)

    refused = await world.api.post("/v1/batches", json=batch(f"shop@{name}"), headers=other)
    lookup = await world.api.get(f"/v1/domains/{name}", headers=other)

    assert refused.status_code == 422
    assert lookup.status_code == 404


async def test_a_removed_domain_no_longer_authorises_sending(world: World, db: Database) -> None:
    auth = await new_key(db)
    name = domain()
    await verified(world, auth, name)

    removed = await world.api.delete(f"/v1/domains/{name}", headers=auth)
    again = await world.api.delete(f"/v1/domains/{name}", headers=auth)
    sent = await world.api.post("/v1/batches", json=batch(f"shop@{name}"), headers=auth)

    assert (removed.status_code, again.status_code, sent.status_code) == (204, 404, 422)
    assert (await world.api.get("/v1/domains", headers=auth)).json()["data"] == []


@pytest.mark.parametrize("text", ["localhost", "1.2.3.4", "not a domain", "a..b"])
async def test_a_name_that_is_not_a_domain_is_a_422(world: World, db: Database, text: str) -> None:
    auth = await new_key(db)

    added = await world.api.post("/v1/domains", json={"domain": text}, headers=auth)

    assert added.status_code == 422
    assert "domain" in added.json()["error"]["fields"]


async def test_verifying_needs_the_send_scope(world: World, db: Database) -> None:
    auth = await new_key(db, "read")

    added = await world.api.post("/v1/domains", json={"domain": domain()}, headers=auth)

    assert added.status_code == 403


async def test_a_dns_resolver_that_cannot_answer_is_a_503(settings: Settings, db: Database) -> None:
    api = settings.api.model_copy(
        update={"sender_domains": "verified", "dns_url": "http://127.0.0.1:9/dns-query"}
    )
    app = create_app(settings.model_copy(update={"api": api}))
    auth = await new_key(db)
    name = domain()
    async with running(app), client_for(app) as client:
        await client.post("/v1/domains", json={"domain": name}, headers=auth)

        answer = await client.post(f"/v1/domains/{name}/verify", headers=auth)

    assert answer.status_code == 503
    assert "Retry-After" in answer.headers
