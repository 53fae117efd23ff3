"""The caps' ledger store's contract, asserted identically of the in-memory twin
(``tests/fakes/api.py``) and of :class:`services.api.cap_store.CapStore` on Cassandra: a
ledger never written reads empty with no version; a write applies only from the version it
was decided from (of two from one reading, one applies) and moves it; a drop likewise; claim
times come back at Cassandra's precision; ledgers are each user's and each name's own."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from services.api.cap_store import CapStore, ledger_name
from services.api.caps import Holds
from shared.infra.db import Database
from tests.contracts.conftest import IMPLEMENTATIONS
from tests.fakes.api import FakeCapStore


@pytest.fixture(params=IMPLEMENTATIONS)
def store(request: pytest.FixtureRequest) -> Any:
    if request.param == "fake":
        return FakeCapStore()
    db: Database = request.getfixturevalue("db")
    return CapStore(db)


AT = datetime(2026, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)
KEPT = AT.replace(microsecond=123000)


async def test_a_ledger_never_written_is_empty_without_a_version(store: Any) -> None:
    assert await store.read(uuid.uuid4(), "lists") == Holds(None, {})


async def test_a_write_from_the_version_read_applies_and_moves_it(store: Any) -> None:
    """Claim times come back in UTC at millisecond precision."""
    user = uuid.uuid4()

    first = await store.write(user, "lists", None, {"a": AT})
    second = await store.write(user, "lists", 1, {"a": AT, "b": AT})

    assert (first, second) == (True, True)
    assert await store.read(user, "lists") == Holds(2, {"a": KEPT, "b": KEPT})


async def test_a_write_from_a_stale_version_applies_nothing(store: Any) -> None:
    user = uuid.uuid4()
    await store.write(user, "lists", None, {"a": AT})

    assert not await store.write(user, "lists", None, {"x": AT})
    assert not await store.write(user, "lists", 7, {"x": AT})
    assert await store.read(user, "lists") == Holds(1, {"a": KEPT})


async def test_of_two_writes_from_one_reading_exactly_one_applies(store: Any) -> None:
    user = uuid.uuid4()
    await store.write(user, "templates", None, {"a": AT})

    applied = await asyncio.gather(
        store.write(user, "templates", 1, {"a": AT, "b": AT}),
        store.write(user, "templates", 1, {"a": AT, "c": AT}),
    )

    assert sorted(applied) == [False, True]
    found = await store.read(user, "templates")
    assert found.version == 2 and len(found.holders) == 2


async def test_a_ledger_may_be_written_empty(store: Any) -> None:
    user = uuid.uuid4()
    await store.write(user, "lists", None, {"a": AT})

    assert await store.write(user, "lists", 1, {})
    assert await store.read(user, "lists") == Holds(2, {})


async def test_a_drop_applies_only_from_the_version_read(store: Any) -> None:
    """A ledger never written, or gone, is dropped already."""
    user, scope = uuid.uuid4(), uuid.uuid1()
    name = ledger_name("versions", scope)
    await store.write(user, name, None, {"1": AT})

    stale = await store.drop(user, name, 5)
    kept = await store.read(user, name)
    dropped = await store.drop(user, name, 1)

    assert (stale, kept.version, dropped) == (False, 1, True)
    assert await store.read(user, name) == Holds(None, {})
    assert await store.drop(user, name, 1)
    assert await store.drop(user, name, None)


async def test_ledgers_are_each_users_and_each_names_own(store: Any) -> None:
    ann, bob = uuid.uuid4(), uuid.uuid4()
    await store.write(ann, "lists", None, {"a": AT})

    assert await store.read(bob, "lists") == Holds(None, {})
    assert await store.read(ann, "campaigns") == Holds(None, {})
    assert await store.read(ann, ledger_name("versions", uuid.uuid1())) == Holds(None, {})
