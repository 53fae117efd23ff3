"""Managing keys and suppressions: the rules every interface shares (real Cassandra)."""

from __future__ import annotations

import uuid

import pytest

from services.api.managing import Managing
from shared.accounts import accounts
from shared.accounts.apikeys import DEFAULT_SCOPES
from shared.audience.suppressions import SuppressionStore
from shared.infra.db import Database
from shared.infra.http import ApiError
from tests.conftest import unique


@pytest.fixture
def managing(db: Database) -> Managing:
    return Managing(db, SuppressionStore(db))


@pytest.fixture
async def user(db: Database) -> uuid.UUID:
    return await accounts.ensure_user(db, unique("mg"))


async def test_a_suppression_is_stored_under_its_address_key(
    managing: Managing, user: uuid.UUID
) -> None:
    done = await managing.suppress(user, " Ann@Example.COM ", "", source="api")

    assert (done.email, done.reason) == ("ann@example.com", "manual")
    assert await managing.suppressions.suppressed(user, ["ANN@example.com"]) == {
        "ann@example.com": "manual"
    }
    assert await managing.unsuppress(user, "ann@example.com") is True
    assert await managing.unsuppress(user, "ann@example.com") is False


@pytest.mark.parametrize(
    ("email", "reason", "field"),
    [
        ("", None, "email"),
        ("not an address", None, "email"),
        ("a@example.com", "x" * 201, "reason"),
    ],
)
async def test_an_invalid_suppression_names_its_field(
    managing: Managing, user: uuid.UUID, email: str, reason: str | None, field: str
) -> None:
    with pytest.raises(ApiError) as caught:
        await managing.suppress(user, email, reason, source="api")

    assert caught.value.status == 422
    assert list(caught.value.fields or {}) == [field]
    assert await managing.suppressions.page(user, 10, None) == []


async def test_a_key_gets_its_default_name_and_a_long_name_is_refused(
    managing: Managing, user: uuid.UUID
) -> None:
    made = await managing.create_key(user, "  ", default="dashboard", holder=DEFAULT_SCOPES)
    with pytest.raises(ApiError) as caught:
        await managing.create_key(user, "n" * 101, default="dashboard", holder=DEFAULT_SCOPES)

    assert made.name == "dashboard" and made.plaintext.startswith("sd_live_")
    assert caught.value.fields == {"name": "must be at most 100 characters"}
    [key] = await managing.keys(user)
    assert key.name == "dashboard"
    assert await managing.revoke_key(user, key.key_id) is True
