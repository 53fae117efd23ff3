"""Holding creations to the caps (``services.api.capping.Caps``) over the ledger's twin:
concurrent claims at a cap's edge, a place leaked by a process that died (or a write whose
answer was lost) given back after the grace, things made before caps counted, and the 409
naming the cap."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Collection, Set
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from services.api.capping import Caps, Census
from shared.core.errors import DependencyUnavailable
from shared.infra.config import CapSettings
from shared.infra.http import ApiError, error_response
from tests.fakes.api import FakeCapStore
from tests.fakes.wire import LOOPBACK, Kind, Trip


@dataclass
class Clock:
    at: datetime = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.at


@dataclass
class Things:
    """What exists, as a census sees it, and how often it was taken."""

    ids: set[str] = field(default_factory=set)
    taken: int = 0

    async def census(self, _: Collection[str]) -> Set[str]:
        self.taken += 1
        await asyncio.sleep(0)
        return set(self.ids)


@dataclass
class _Lost:
    trip: Trip

    def landed(self) -> None:
        self.trip.landed()
        raise DependencyUnavailable("cassandra", "CAS write timeout (injected)")


@dataclass
class LosingWire:
    """Loses the answer of the next ledger write after it applied."""

    armed: bool = True

    async def trip(self, op: str, kind: Kind) -> Trip:
        trip = await LOOPBACK.trip(op, kind)
        if op == "caps.write" and self.armed:
            self.armed = False
            return _Lost(trip)
        return trip


def _caps(store: FakeCapStore, clock: Clock, **limits: int) -> Caps:
    return Caps(store, CapSettings(claim_grace=60).model_copy(update=limits), clock=clock)


async def _claim(caps: Caps, user: uuid.UUID, holder: str, census: Census) -> bool:
    try:
        await caps.claim(user, "lists", holder, census)
    except ApiError as exc:
        assert exc.code == "too_many_lists"
        return False
    return True


async def test_of_two_claims_at_once_for_the_last_place_exactly_one_gets_it() -> None:
    caps, user, things = _caps(FakeCapStore(), Clock(), lists=2), uuid.uuid4(), Things()
    assert await _claim(caps, user, "a", things.census)
    things.ids.add("a")

    got = await asyncio.gather(*(_claim(caps, user, h, things.census) for h in ("b", "c")))

    assert sorted(got) == [False, True]


async def test_many_claims_at_once_get_exactly_the_places_left() -> None:
    caps, user, things = _caps(FakeCapStore(), Clock(), lists=3), uuid.uuid4(), Things()

    got = await asyncio.gather(*(_claim(caps, user, f"h{i}", things.census) for i in range(10)))

    assert got.count(True) == 3
    assert len((await caps.store.read(user, "lists")).holders) == 3


async def test_a_refusal_is_a_409_naming_the_cap_and_its_limit() -> None:
    caps, user, things = _caps(FakeCapStore(), Clock(), lists=1), uuid.uuid4(), Things()
    await caps.claim(user, "lists", "a", things.census)
    things.ids.add("a")

    with pytest.raises(ApiError) as refused:
        await caps.claim(user, "lists", "b", things.census)

    body = error_response(refused.value).body
    assert refused.value.status == 409
    assert b'"code":"too_many_lists"' in body
    assert b'"limit":{"name":"lists","value":1}' in body


async def test_a_place_leaked_by_a_creation_that_died_is_given_back_after_the_grace() -> None:
    """``a`` was claimed and never made: within the grace it holds, after it is released."""
    clock, user, things = Clock(), uuid.uuid4(), Things()
    caps = _caps(FakeCapStore(), clock, lists=1)
    await caps.claim(user, "lists", "a", things.census)

    early = await _claim(caps, user, "b", things.census)
    clock.at += timedelta(seconds=61)
    late = await _claim(caps, user, "b", things.census)

    assert (early, late) == (False, True)
    assert set((await caps.store.read(user, "lists")).holders) == {"b"}


async def test_a_claim_whose_answer_was_lost_holds_a_place_until_the_grace_passes() -> None:
    """The write applied but the caller saw an outage (503): its place is healed like a
    leaked one, and the claim is never counted twice."""
    clock, user, things = Clock(), uuid.uuid4(), Things()
    store = FakeCapStore(wire=LosingWire())
    caps = _caps(store, clock, lists=1)

    with pytest.raises(DependencyUnavailable):
        await caps.claim(user, "lists", "a", things.census)
    refused = await _claim(caps, user, "b", things.census)
    clock.at += timedelta(seconds=61)

    assert refused is False
    assert await _claim(caps, user, "b", things.census)


async def test_things_made_before_the_caps_count_from_the_first_claim() -> None:
    caps, user = _caps(FakeCapStore(), Clock(), lists=2), uuid.uuid4()
    things = Things({"old1", "old2"})

    assert not await _claim(caps, user, "new", things.census)
    assert set((await caps.store.read(user, "lists")).holders) == {"old1", "old2"}


async def test_the_census_is_taken_only_when_the_ledger_is_new_or_full() -> None:
    caps, user, things = _caps(FakeCapStore(), Clock(), lists=3), uuid.uuid4(), Things()

    for holder in ("a", "b", "c"):
        await caps.claim(user, "lists", holder, things.census)
        things.ids.add(holder)

    assert things.taken == 1  # the first claim's (a new ledger)
    assert not await _claim(caps, user, "d", things.census)
    assert things.taken == 2


async def test_a_release_frees_the_place_and_a_repeated_one_changes_nothing() -> None:
    caps, user, things = _caps(FakeCapStore(), Clock(), lists=1), uuid.uuid4(), Things()
    await caps.claim(user, "lists", "a", things.census)

    await caps.release(user, "lists", "a")
    await caps.release(user, "lists", "a")

    assert await _claim(caps, user, "b", things.census)


async def test_a_check_claims_nothing() -> None:
    caps, user, things = _caps(FakeCapStore(), Clock(), versions=1), uuid.uuid4(), Things()
    scope = uuid.uuid1()

    await caps.check(user, "versions", things.census, scope=scope)
    await caps.check(user, "versions", things.census, scope=scope)
    await caps.claim(user, "versions", "1", things.census, scope=scope)
    things.ids.add("1")

    with pytest.raises(ApiError, match="versions of this template"):
        await caps.check(user, "versions", things.census, scope=scope)


async def test_an_imports_place_is_kept_through_its_upload() -> None:
    """Its job does not exist until the upload is in: the extra grace keeps its place."""
    clock, user, things = Clock(), uuid.uuid4(), Things()
    caps = _caps(FakeCapStore(), clock, imports=1)
    await caps.claim(user, "imports", "l/i", things.census, extra_grace=300)

    clock.at += timedelta(seconds=200)
    with pytest.raises(ApiError, match="imports in progress"):
        await caps.claim(user, "imports", "l/j", things.census, extra_grace=300)
    clock.at += timedelta(seconds=200)
    await caps.claim(user, "imports", "l/j", things.census, extra_grace=300)
