"""The API's body budget through the real app, Cassandra and RabbitMQ: a large batch that
finds no room is answered 503 with Retry-After and nothing of it is accepted, a small one
is accepted meanwhile, the large one is accepted once there is room, and every request gives
back what it took, refused or accepted."""

from __future__ import annotations

import uuid

import orjson

from shared.accounts import accounts
from shared.delivery.batchstore import BatchStore
from shared.infra.config import Settings
from shared.infra.db import Database
from tests.conftest import unique
from tests.integration.unhappy import api_client, with_api

BUDGET = 1024 * 1024


def _batch(recipients: int, value: int) -> bytes:
    return orjson.dumps(
        {
            "from": "shop@example.com",
            "to": [
                {"email": f"r{i}@example.com", "substitutions": {"-v-": "x" * value}}
                for i in range(recipients)
            ],
            "subject": "Hi",
            "text": "-v-",
        }
    )


async def test_a_large_batch_without_room_is_refused_unaccepted_and_a_small_one_is_served(
    settings: Settings, db: Database
) -> None:
    """With the budget all taken, a 2 MB batch gets 503 + Retry-After naming the budget and
    no batch is stored for it; a small batch is accepted; once the budget is given back the
    large batch is accepted, and the budget is whole again."""
    user_id = await accounts.ensure_user(db, unique("budget"))
    key = await accounts.create_key(db, user_id, "budget")
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    large, small = _batch(200, 9_000), _batch(1, 10)
    assert len(large) > BUDGET

    configured = with_api(settings, body_budget_bytes=BUDGET, body_wait=0.0)
    async with api_client(configured) as (app, client):
        budget = app.state.body_budget
        held = await budget.take(BUDGET, wait=0)
        refused = await client.post("/v1/batches", content=large, headers=headers)
        served = await client.post("/v1/batches", content=small, headers=headers)
        listed = await client.get("/v1/batches", headers={"Authorization": f"Bearer {key}"})
        budget.give(held)
        accepted = await client.post("/v1/batches", content=large, headers=headers)
        free = budget.free

    assert refused.status_code == 503
    assert refused.headers["retry-after"]
    assert refused.json()["error"]["limit"] == {"name": "body_budget_bytes", "value": BUDGET}
    assert served.status_code == 202, served.text[:300]
    assert [b["batch_id"] for b in listed.json()["data"]] == [served.json()["batch_id"]]
    assert accepted.status_code == 202, accepted.text[:300]
    header = await BatchStore(db).header(uuid.UUID(accepted.json()["batch_id"]))
    assert header is not None and header.recipient_count == 200
    assert free == BUDGET
