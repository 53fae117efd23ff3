"""The ``signup_requests`` contract: what the sign-up policy and the operators' approvals rely
on from :class:`shared.accounts.signup.SignupRequests`, asserted of its twin
(``tests/fakes/accounts.py``) and of the real table. Each test uses GitHub ids of its own
(the table is shared by every test of a worker) and reads back only those."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from shared.accounts.signup import SignupRequests
from shared.infra.db import Database
from tests.contracts.conftest import IMPLEMENTATIONS
from tests.fakes.accounts import FakeSignupRequests


@pytest.fixture(params=IMPLEMENTATIONS)
def requests_(request: pytest.FixtureRequest) -> Any:
    if request.param == "fake":
        return FakeSignupRequests()
    db: Database = request.getfixturevalue("db")
    return SignupRequests(db)


def _ids(n: int) -> list[int]:
    return random.sample(range(10**12, 10**15), n)


async def _mine(store: Any, ids: list[int]) -> list[Any]:
    return [r for r in await store.all() if r.github_id in ids]


async def test_an_unknown_account_has_no_request(requests_: Any) -> None:
    (gid,) = _ids(1)

    assert await requests_.state(gid) is None
    assert await requests_.answer(gid, "approved", "ops") is False
    assert await requests_.state(gid) is None


async def test_a_request_is_pending_until_answered_by_id(requests_: Any) -> None:
    gid, other = _ids(2)
    await requests_.ask(gid, "ann", "Ann", "ann@example.com")
    await requests_.ask(other, "ann", None, None)  # a renamed account: same login, another id

    assert await requests_.state(gid) == "pending"
    assert await requests_.answer(gid, "refused", "ops") is True

    assert await requests_.state(gid) == "refused"
    assert await requests_.state(other) == "pending"
    (mine,) = await _mine(requests_, [gid])
    assert (mine.login, mine.name, mine.email, mine.decided_by) == (
        "ann",
        "Ann",
        "ann@example.com",
        "ops",
    )


async def test_asking_again_keeps_the_first_time_and_the_answer(requests_: Any) -> None:
    (gid,) = _ids(1)
    await requests_.ask(gid, "bob", None, None)
    (first,) = await _mine(requests_, [gid])
    await requests_.answer(gid, "approved", "ops")

    await asyncio.gather(*(requests_.ask(gid, "bob2", "B", "b@example.com") for _ in range(2)))

    (again,) = await _mine(requests_, [gid])
    assert (again.login, again.requested_at, again.state) == ("bob", first.requested_at, "approved")
    assert again.requested_at.tzinfo is not None


async def test_open_requests_read_oldest_first_and_done_removes_one(requests_: Any) -> None:
    ids = _ids(3)
    for gid in ids:
        await requests_.ask(gid, f"u{gid}", None, None)
        await asyncio.sleep(0.002)  # distinct request times (milliseconds are stored)

    await requests_.done(ids[1])

    assert [r.github_id for r in await _mine(requests_, ids)] == [ids[0], ids[2]]
    assert await requests_.state(ids[1]) is None
