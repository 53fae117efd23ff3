"""The ``sending_domains`` and ``domain_claims`` contract: what the API, the periodic checks
and the claims shown to owners rely on from :class:`shared.accounts.domains.DomainStore`, asserted
of its twin and of the real tables."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared.accounts.domain_checks import Outcome
from shared.accounts.domains import DomainStore
from shared.infra.db import Database
from tests.conftest import unique
from tests.contracts.conftest import IMPLEMENTATIONS
from tests.fakes.accounts import FakeDomainStore

NOW = datetime(2026, 11, 26, 2, 0, tzinfo=UTC)


@pytest.fixture(params=IMPLEMENTATIONS)
def store(request: pytest.FixtureRequest) -> Any:
    if request.param == "fake":
        return FakeDomainStore()
    db: Database = request.getfixturevalue("db")
    return DomainStore(db)


@pytest.fixture
def zone() -> str:
    return f"{unique('z').replace('_', '-')}.example"


async def legacy(store: Any, user_id: uuid.UUID, domain: str) -> None:
    """A verified domain as the releases before the checks wrote it: no index entry."""
    if isinstance(store, FakeDomainStore):
        store.legacy(user_id, domain)
        return
    await store.db.execute(
        "INSERT INTO sending_domains (user_id, domain, proof, created_at, verified_at) "
        "VALUES (?, ?, ?, ?, ?)",
        (user_id, domain, "t", NOW, NOW),
    )


async def test_a_domain_is_added_once_with_one_token(store: Any, zone: str) -> None:
    user = uuid.uuid4()

    first = await store.add(user, zone)
    again = await store.add(user, zone)

    assert again == first and first.token and not first.verified
    assert (first.seen_at, first.checked_at, first.missing_since, first.unverified_at) == (
        None,
        None,
        None,
        None,
    )


async def test_verifying_records_the_successful_check_and_clears_a_lapse(
    store: Any, zone: str
) -> None:
    user = uuid.uuid4()
    read = await store.add(user, zone)
    await store.mark_verified(user, zone)
    verified = await store.get(user, zone)
    assert await store.record(user, verified, Outcome("unverified", NOW, reason="gone").cells())

    assert await store.mark_verified(user, zone)
    again = await store.get(user, zone)

    assert verified.verified and verified.seen_at == verified.checked_at == verified.verified_at
    assert read.token == again.token and again.verified and again.verified_at > NOW
    assert (again.missing_since, again.unverified_at, again.unverified_reason) == (None,) * 3


async def test_verifying_a_removed_domain_brings_nothing_back(store: Any, zone: str) -> None:
    user = uuid.uuid4()
    await store.add(user, zone)
    assert await store.remove(user, zone)

    assert not await store.mark_verified(user, zone)
    assert await store.get(user, zone) is None
    assert not await store.remove(user, zone)


async def test_checks_record_the_record_seen_missing_and_the_domain_unverified(
    store: Any, zone: str
) -> None:
    user = uuid.uuid4()
    await store.add(user, zone)
    await store.mark_verified(user, zone)
    read = await store.get(user, zone)

    assert await store.record(user, read, Outcome("missing", NOW, missing_since=NOW).cells())
    missing = await store.get(user, zone)
    later = NOW + timedelta(days=4)
    assert await store.record(user, missing, Outcome("unverified", later, reason="gone").cells())
    unverified = await store.get(user, zone)

    assert (missing.verified, missing.missing_since, missing.checked_at) == (True, NOW, NOW)
    assert not unverified.verified and zone not in await store.verified(user)
    assert (unverified.unverified_at, unverified.unverified_reason) == (later, "gone")
    assert unverified.seen_at == read.seen_at  # the last successful check stays readable


async def test_a_check_lands_only_on_the_domain_as_it_was_read(store: Any, zone: str) -> None:
    """Verified again, removed and added again, or checked by another meanwhile: the check
    that read the domain before writes nothing."""
    user = uuid.uuid4()
    await store.add(user, zone)
    await store.mark_verified(user, zone)
    read = await store.get(user, zone)
    lapse = Outcome("unverified", NOW, reason="gone").cells()
    assert await store.record(user, read, Outcome("missing", NOW, missing_since=NOW).cells())

    stale = await store.record(user, read, lapse)  # another check moved it meanwhile
    await store.remove(user, zone)
    readded = await store.add(user, zone)
    gone = await store.record(user, read, lapse)
    removed_then = await store.record(uuid.uuid4(), read, lapse)

    assert (stale, gone, removed_then) == (False, False, False)
    assert await store.get(user, zone) == readded
    assert await store.get(uuid.uuid4(), zone) is None


async def test_a_check_writes_only_check_columns(store: Any, zone: str) -> None:
    user = uuid.uuid4()
    read = await store.add(user, zone)

    with pytest.raises(ValueError, match="proof"):
        await store.record(user, read, {"proof": "mine now"})


async def test_every_domain_of_every_user_is_scanned(store: Any, zone: str) -> None:
    one, two = uuid.uuid4(), uuid.uuid4()
    await store.add(one, zone)
    await store.add(one, f"mail.{zone}")
    await store.add(two, zone)

    found = {(u, d.domain) async for u, d in store.every()}

    assert {(one, zone), (one, f"mail.{zone}"), (two, zone)} <= found


async def test_claims_are_those_on_the_domain_its_parents_and_its_subdomains(
    store: Any, zone: str
) -> None:
    """Every account's, whatever its state; never a sibling or a name that only looks alike."""
    a, b, c, d = (uuid.uuid4() for _ in range(4))
    mine = f"mail.{zone}"
    for user, name in [
        (a, mine),
        (b, mine),
        (c, zone),
        (d, f"eu.{mine}"),
        (d, f"news.{zone}"),
        (d, f"mail-x.{zone}"),
        (d, f"x{zone}"),
    ]:
        await store.add(user, name)
    await store.mark_verified(b, mine)

    found = {
        (claim.user_id, claim.domain.domain, claim.domain.verified)
        for claim in await store.claims(mine)
    }

    assert found == {(a, mine, False), (b, mine, True), (c, zone, False), (d, f"eu.{mine}", False)}


async def test_a_removed_claim_is_gone_and_an_index_entry_without_its_domain_is_not_a_claim(
    store: Any, zone: str
) -> None:
    one, two = uuid.uuid4(), uuid.uuid4()
    await store.add(one, zone)
    await store.index(two, zone)  # as an add that died before writing its row leaves it
    await store.remove(one, zone)

    assert await store.claims(zone) == []


async def test_domains_added_before_the_index_are_indexed_once_asked(store: Any, zone: str) -> None:
    user = uuid.uuid4()
    await legacy(store, user, zone)
    before = await store.claims(zone)

    assert await store.index_all() >= 1
    after = await store.claims(zone)

    assert before == []
    assert [(c.user_id, c.domain.domain, c.domain.verified) for c in after] == [(user, zone, True)]
    assert replace(after[0].domain, checked_at=None) == after[0].domain  # never checked yet
