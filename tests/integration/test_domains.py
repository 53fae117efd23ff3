"""Sender authorisation against the real API app, Cassandra, RabbitMQ and the sandbox's DNS:
a batch is accepted only ``from`` a domain its user verified by publishing a TXT record."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from starlette.applications import Starlette

from sandbox.app import create_app as create_sandbox
from services.api.app import create_app
from services.api.session_store import SESSION_COOKIE, SessionStore
from services.consumers.domain_checks import DomainChecker
from shared.accounts import accounts
from shared.accounts.domain_checks import CheckRules
from shared.accounts.domains import WAKE as DOMAINS_WAKE
from shared.accounts.domains import DohResolver, DomainStore, SendingDomain
from shared.delivery.schedule_store import ScheduleStore
from shared.infra.config import SandboxSettings, Settings
from shared.infra.db import Database
from shared.infra.user_cache import UserChanges
from tests.conftest import unique
from tests.integration.conftest import app_for
from tests.integration.harness import client_for, eventually, running, served


@dataclass
class World:
    api: httpx.AsyncClient
    sandbox: httpx.AsyncClient
    app: Starlette
    dns_url: str
    settings: Settings

    async def publish(self, record: dict[str, str]) -> None:
        body = {"name": record["name"], "value": record["value"]}
        assert (await self.sandbox.post("/_control/dns", json=body)).status_code == 200

    async def unpublish(self, name: str) -> None:
        """Every TXT value at ``name`` gone (the domain expired, or changed hands)."""
        answer = await self.sandbox.delete("/_control/dns", params={"name": name})
        assert answer.status_code == 200


@pytest.fixture(scope="module")
async def served_world(module_settings: Settings) -> AsyncIterator[tuple[Starlette, str]]:
    """The API and the sandbox's DNS, one of each for the module: every test has its own
    user and domain names, and a client of its own (:func:`world`)."""
    sandbox = create_sandbox(SandboxSettings(webhook_url="http://127.0.0.1:9", webhook_delay=60))
    async with served(sandbox) as sandbox_url:
        api = module_settings.api.model_copy(
            update={
                "sender_domains": "verified",
                "dns_url": f"{sandbox_url}/dns-query",
                # Far longer than any test: every change must reach the API's cache by its
                # broadcast (or the writer's own drop), never by the cache's expiry.
                "domain_cache_ttl": 600.0,
            }
        )
        async with app_for(module_settings.model_copy(update={"api": api})) as app:
            yield app, sandbox_url


@pytest.fixture
async def world(served_world: tuple[Starlette, str]) -> AsyncIterator[World]:
    app, sandbox_url = served_world
    async with client_for(app) as client, httpx.AsyncClient(base_url=sandbox_url) as dns:
        yield World(client, dns, app, f"{sandbox_url}/dns-query", app.state.settings)


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


# --------------------------------------------------------------------------- periodic checks


class OwnDomains(DomainStore):
    """The real store, its scan narrowed to some users (the keyspace is the whole run's)."""

    def __init__(self, db: Database, users: set[uuid.UUID]) -> None:
        super().__init__(db)
        self.users = users

    async def every(self) -> AsyncIterator[tuple[uuid.UUID, SendingDomain]]:
        async for user_id, d in super().every():
            if user_id in self.users:
                yield user_id, d


async def user_key(db: Database, *scopes: str) -> tuple[uuid.UUID, dict[str, str]]:
    user = await accounts.ensure_user(db, unique("domains"))
    key = await accounts.create_key(db, user, "k", scopes=scopes or ("send", "read", "keys"))
    return user, {"Authorization": f"Bearer {key}"}


async def test_a_domain_whose_record_is_removed_is_unverified_after_the_grace(
    world: World, db: Database
) -> None:
    """The consumers' checker, on a clock the test moves, looks the record up in the
    sandbox's DNS: missing, the domain stays verified through the grace (its owner sees since
    when); past it, it is unverified with the reason and sending from it is refused until it
    is verified again."""
    user, auth = await user_key(db)
    name = domain()
    await verified(world, auth, name)
    rules = CheckRules(every=timedelta(hours=6), grace=timedelta(days=3))
    clock = datetime.now(UTC) + timedelta(hours=6, seconds=1)
    async with httpx.AsyncClient() as http:
        checker = DomainChecker(
            OwnDomains(db, {user}),
            DohResolver(http, world.dns_url),
            rules,
            ScheduleStore(db, unique("domains")),
            clock=lambda: clock,
            changes=UserChanges(world.app.state.resources.broker, wake=DOMAINS_WAKE),
        )
        await world.unpublish(f"_safedelivr.{name}")

        first = await checker.pass_once()
        missing = (await world.api.get(f"/v1/domains/{name}", headers=auth)).json()
        during = await world.api.post("/v1/batches", json=batch(f"shop@{name}"), headers=auth)
        clock += rules.grace
        last = await checker.pass_once()

    unverified = (await world.api.get(f"/v1/domains/{name}", headers=auth)).json()

    async def refusal() -> httpx.Response | None:
        # The API's cache holds the domain as verified (its TTL is far longer than the
        # test) until the checker's announcement reaches it over RabbitMQ.
        answer = await world.api.post("/v1/batches", json=batch(f"shop@{name}"), headers=auth)
        return answer if answer.status_code != 202 else None

    refused = await eventually(refusal)
    assert (first.missing, last.unverified) == (1, 1)
    assert (missing["state"], missing["verified"], during.status_code) == (
        "record_missing",
        True,
        202,
    )
    assert missing["checks"]["missing_since"] and missing["checks"]["unverified_after"]
    assert (unverified["state"], unverified["verified"]) == ("unverified", False)
    assert f"_safedelivr.{name} was not found" in unverified["checks"]["reason"]
    assert unverified["checks"]["last_seen_at"] == missing["checks"]["last_seen_at"] is not None
    assert refused.status_code == 422
    assert f"{name} is not a verified sending domain" in refused.json()["error"]["fields"]["from"]

    await verified(world, auth, name)  # the way back: publish it again and verify
    again = await world.api.post("/v1/batches", json=batch(f"shop@{name}"), headers=auth)
    assert again.status_code == 202


async def test_a_second_claimant_is_shown_to_the_first_never_who_they_are(
    world: World, db: Database
) -> None:
    (owner, owner_auth), (other, other_auth) = await user_key(db), await user_key(db)
    name = domain()
    await verified(world, owner_auth, name)
    alone = (await world.api.get(f"/v1/domains/{name}", headers=owner_auth)).json()
    added = await world.api.post("/v1/domains", json={"domain": name}, headers=other_auth)
    pending = (await world.api.get(f"/v1/domains/{name}", headers=owner_auth)).json()
    await world.publish(added.json()["record"])  # beside the owner's value
    proven = await world.api.post(f"/v1/domains/{name}/verify", headers=other_auth)
    both = (await world.api.get("/v1/domains", headers=owner_auth)).json()["data"]
    session, _ = await SessionStore(db).create(owner)
    page = await world.api.get("/domains", headers={"Cookie": f"{SESSION_COOKIE}={session}"})

    assert alone["other_claims"] == {"accounts": 0, "verified": 0, "claims": [], "more": False}
    assert added.json()["other_claims"] is None  # nothing before one's own claim is verified
    assert pending["other_claims"]["claims"] == [{"domain": name, "state": "pending"}]
    assert proven.json()["other_claims"]["claims"] == [{"domain": name, "state": "verified"}]
    assert [d["other_claims"] for d in both] == [
        {
            "accounts": 1,
            "verified": 1,
            "claims": [{"domain": name, "state": "verified"}],
            "more": False,
        }
    ]
    assert str(other) not in str(both) and str(owner) not in proven.text
    assert page.status_code == 200 and "Also claimed by 1 other account" in page.text


async def test_operators_see_every_claim_in_full(world: World, db: Database) -> None:
    (owner, owner_auth), (other, other_auth) = await user_key(db), await user_key(db)
    _, ops = await user_key(db, "operator")
    name = domain()
    await verified(world, owner_auth, name)
    await world.api.post("/v1/domains", json={"domain": f"news.{name}"}, headers=other_auth)

    listed = await world.api.get(f"/v1/domain-claims/{name.upper()}", headers=ops)
    refused = await world.api.get(f"/v1/domain-claims/{name}", headers=owner_auth)

    assert listed.status_code == 200 and refused.status_code == 403
    claims = listed.json()["data"]
    assert [(c["domain"], c["user_id"], c["state"]) for c in claims] == [
        (name, str(owner), "verified"),
        (f"news.{name}", str(other), "pending"),
    ]
    assert claims[0]["login"] and claims[0]["last_seen_at"]


async def test_the_operations_page_looks_up_who_claims_a_domain(world: World, db: Database) -> None:
    (owner, owner_auth), operator_id = await user_key(db), 40_000_000 + uuid.uuid4().int % 10**7
    name = domain()
    await verified(world, owner_auth, name)
    operator = await accounts.upsert_github_user(
        db,
        github_id=operator_id,
        login=unique("op").replace("_", "-"),
        name=None,
        email=None,
        avatar_url=None,
    )
    settings = world.app.state.settings
    world.app.state.settings = settings.model_copy(update={"operators": str(operator_id)})
    session, _ = await SessionStore(db).create(operator)
    cookie = {"Cookie": f"{SESSION_COOKIE}={session}"}
    try:
        page = await world.api.get("/operations", params={"claims": name}, headers=cookie)
    finally:
        world.app.state.settings = settings

    assert page.status_code == 200
    assert f'data-claims="{name}"' in page.text and str(owner) in page.text


async def test_a_domain_removed_through_one_api_process_stops_another_at_once(
    world: World, db: Database
) -> None:
    """A second API process that holds the user's verified domains (its cache's TTL far
    longer than the test) refuses the domain once it is removed through the first: the
    removal's broadcast drops its copy, with no request to it in between."""
    auth = await new_key(db)
    name = domain()
    await verified(world, auth, name)
    second = create_app(world.settings)
    async with running(second), client_for(second) as other:
        before = await other.post("/v1/batches", json=batch(f"shop@{name}"), headers=auth)
        assert before.status_code == 202, before.text
        assert len(second.state.domain_cache) == 1
        removed = await world.api.delete(f"/v1/domains/{name}", headers=auth)
        assert removed.status_code == 204, removed.text

        async def dropped() -> bool:
            return len(second.state.domain_cache) == 0

        await eventually(dropped)
        after = await other.post("/v1/batches", json=batch(f"shop@{name}"), headers=auth)

    assert after.status_code == 422
    assert f"{name} is not a verified sending domain" in after.json()["error"]["fields"]["from"]
