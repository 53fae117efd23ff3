"""What a sender may not do to their recipients, through the real API, Cassandra and RabbitMQ:
set headers that are ours or that pass for another sender or a receiver's verdict."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from shared.config import CassandraSettings
from shared.db import Database
from shared.validation import HEADER_RESERVED
from tests.conftest import stack_settings, unique
from tests.integration.unhappy import Account, api_client, new_account

GOOD: dict[str, Any] = {
    "from": "Shop <shop@example.com>",
    "to": ["ann@example.com"],
    "subject": "Hi",
    "text": "Hello",
}


@pytest.fixture(scope="module")
async def client(migrated: CassandraSettings) -> AsyncIterator[httpx.AsyncClient]:
    """One API app for the module: tests never share data (each makes its own users)."""
    async with api_client(stack_settings(migrated, unique("t").replace("_", "-"))) as pair:
        yield pair[1]


@pytest.fixture
async def me(db: Database) -> Account:
    return await new_account(db, "trust")


async def batches_of(client: httpx.AsyncClient, account: Account) -> list[Any]:
    answer = await client.get("/v1/batches", headers=account.auth)
    data: list[Any] = answer.json()["data"]
    return data


@pytest.mark.parametrize(
    "name",
    [
        "Resent-From",
        "Resent-Sender",
        "resent-to",
        "RESENT-MESSAGE-ID",
        "Authentication-Results",
        "ARC-Seal",
        "ARC-Message-Signature",
        "arc-authentication-results",
        "List-Unsubscribe",
        "List-Unsubscribe-Post",
    ],
)
async def test_a_newly_reserved_header_is_a_422_naming_it(
    client: httpx.AsyncClient, me: Account, name: str
) -> None:
    """Each is refused with the error every reserved header gets, and nothing is stored."""
    body = {**GOOD, "headers": {name: "<https://sender.example/x>", "X-Campaign": "spring"}}

    answer = await client.post("/v1/batches", json=body, headers=me.auth)

    assert answer.status_code == 422
    assert answer.json()["error"]["fields"] == {f"headers.{name}": HEADER_RESERVED}
    assert await batches_of(client, me) == []
