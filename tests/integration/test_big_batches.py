"""Batches as large as the API accepts, stored through the real API in the real Cassandra:
a batch whose content passes Cassandra's ``batch_size_fail_threshold`` (640 KiB in
``deploy/``) many times over is stored whole, and one the store cannot hold is a 413 naming
the limit before anything is accepted, never a 500."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import orjson
import pytest

from shared.accounts import accounts
from shared.accounts.ratelimit import RecipientQuota
from shared.delivery.batchstore import BatchStore, most_stored
from shared.delivery.recipients import RecipientStore
from shared.infra.config import Settings
from shared.infra.db import Database
from tests.conftest import unique
from tests.integration.unhappy import api_client

#: A substitution value of this many characters keeps a recipient's substitutions within
#: the API's 10,000 bytes of JSON.
VALUE = 9_900


async def _key(db: Database) -> tuple[uuid.UUID, str]:
    user_id = await accounts.ensure_user(db, unique("big"))
    return user_id, await accounts.create_key(db, user_id, "big")


def _personal(recipients: int) -> dict[str, object]:
    """``recipients`` recipients, each with about 10 kB of substitutions of their own."""
    return {
        "from": "shop@example.com",
        "to": [
            {
                "email": f"r{i}@example.com",
                "substitutions": {"-code-": f"{i:05d}" + "x" * (VALUE - 5)},
            }
            for i in range(recipients)
        ],
        "subject": "Your code",
        "text": "Here it is: -code-",
    }


async def test_a_batch_of_a_thousand_recipients_with_10_kb_substitutions_is_stored(
    settings: Settings, db: Database
) -> None:
    """A body of nearly 10 MB (the API's cap is 10 MiB): 1,000 recipients, each with 10 kB of
    substitutions, one chunk's list of 10 MB: 202, and every recipient reads back with its
    own substitutions."""
    _, key = await _key(db)
    body = orjson.dumps(_personal(1_000))
    assert len(body) <= settings.api.max_body_bytes

    async with api_client(settings) as (_, client):
        resp = await client.post(
            "/v1/batches",
            content=body,
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )

    assert resp.status_code == 202, resp.text[:500]
    assert resp.json()["accepted"] == 1_000
    batch_id = uuid.UUID(resp.json()["batch_id"])
    header = await BatchStore(db).header(batch_id)
    assert header is not None
    assert (header.recipient_count, header.status) == (1_000, "accepted")
    listed = await RecipientStore(db).batch_rows(batch_id)
    assert len(listed) == 1_000
    last = next(r for r in listed if r["email"] == "r999@example.com")
    assert last["substitutions"]["-code-"].startswith("00999x")


async def test_a_mailgun_batch_with_800_kb_of_html_is_stored(
    settings: Settings, db: Database
) -> None:
    """A message of 800 kB of html, pinned to Mailgun: 202, and the html reads back whole."""
    _, key = await _key(db)
    html = "<p>" + "Lorem ipsum dolor sit amet. " * 29_000 + "</p>"
    assert len(html) > 800_000
    body = {
        "from": "shop@example.com",
        "to": ["ann@example.com", "bob@example.com"],
        "subject": "Catalogue",
        "html": html,
        "provider": "mg",
    }

    async with api_client(settings) as (_, client):
        resp = await client.post(
            "/v1/batches", json=body, headers={"Authorization": f"Bearer {key}"}
        )

    assert resp.status_code == 202, resp.text[:500]
    header = await BatchStore(db).header(uuid.UUID(resp.json()["batch_id"]))
    assert header is not None
    assert header.message.html == html


@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "keyless"])
async def test_a_batch_the_store_cannot_hold_is_a_413_naming_the_limit(
    settings: Settings, db: Database, keyed: bool
) -> None:
    """Within the body cap, but more than one batch may store (a cluster whose
    max_mutation_size is 1 MiB): 413 ``batch_too_large`` naming the limit, nothing stored,
    nothing charged, and the Idempotency-Key free for a corrected request."""
    user_id, key = await _key(db)
    small = settings.model_copy(
        update={"cassandra": settings.cassandra.model_copy(update={"max_mutation_bytes": 2**20})}
    )
    headers = {"Authorization": f"Bearer {key}"}
    if keyed:
        headers["Idempotency-Key"] = unique("big")

    async with api_client(small) as (_, client):
        resp = await client.post("/v1/batches", json=_personal(150), headers=headers)
        fixed = await client.post("/v1/batches", json=_personal(50), headers=headers)

    assert resp.status_code == 413, resp.text[:500]
    error = resp.json()["error"]
    assert error["code"] == "batch_too_large"
    assert f"{most_stored(2**20):,} bytes" in error["message"]
    assert error["limit"] == {"name": "batch_bytes", "value": most_stored(2**20)}
    assert fixed.status_code == 202, fixed.text[:500]
    listed = await db.rows(
        "SELECT batch_id FROM batches_by_user WHERE user_id = ? ALLOW FILTERING", (user_id,)
    )
    assert [r["batch_id"] for r in listed] == [uuid.UUID(fixed.json()["batch_id"])]
    quota = RecipientQuota(db, settings.api.daily_recipient_quota)
    assert await quota.used(user_id, datetime.now(UTC).date()) == 50
