"""The contracts of the operators' stores: the live settings with their audit
(:class:`shared.ops.livesettings.SettingsStore`) and the dead-letter archive
(:class:`shared.ops.deadletters.DeadLetterStore`), asserted identically of their twins
(``tests/fakes/ops.py``) and of the real tables.

The archive is one partition per keyspace, shared by every test of a worker: each test here
reads only the letters it made (its own ids, death times in an instant of its own)."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared.infra.db import Database
from shared.ops.deadletters import REPLAY_LEASE, DeadLetterStore, Letter, letter_of
from shared.ops.livesettings import SettingsError, SettingsStore
from tests.contracts.conftest import IMPLEMENTATIONS
from tests.fakes.ops import FakeLetters, FakeSettings


@pytest.fixture(params=IMPLEMENTATIONS)
def settings_store(request: pytest.FixtureRequest) -> Any:
    scope = f"s-{uuid.uuid4().hex[:12]}"
    if request.param == "fake":
        return FakeSettings(scope)
    db: Database = request.getfixturevalue("db")
    return SettingsStore(db, scope)


@pytest.fixture(params=IMPLEMENTATIONS)
def letters(request: pytest.FixtureRequest) -> Any:
    if request.param == "fake":
        return FakeLetters()
    db: Database = request.getfixturevalue("db")
    return DeadLetterStore(db)


# --------------------------------------------------------------------------- live settings


async def test_a_change_is_stored_in_its_canonical_form_and_audited(settings_store: Any) -> None:
    done = await settings_store.change({"providers.max_attempts": " 4 "}, by="ops@example.com")

    assert [(c.name, c.old, c.new, c.by) for c in done] == [
        ("providers.max_attempts", None, "4", "ops@example.com")
    ]
    assert await settings_store.stored() == {"providers.max_attempts": "4"}
    (audited,) = await settings_store.audit()
    assert (audited.name, audited.old, audited.new) == ("providers.max_attempts", None, "4")


async def test_setting_a_value_it_already_has_changes_and_audits_nothing(
    settings_store: Any,
) -> None:
    await settings_store.change({"alerts.cool_off": "60"}, by="a")

    again = await settings_store.change({"alerts.cool_off": "60"}, by="b")

    assert again == []
    assert [c.by for c in await settings_store.audit()] == ["a"]


async def test_the_audit_reads_newest_first_with_old_and_new_values(settings_store: Any) -> None:
    for value in ("3", "5", "2"):
        await settings_store.change({"providers.max_attempts": value}, by="ops")

    audit = await settings_store.audit()

    assert [(c.old, c.new) for c in audit] == [("5", "2"), ("3", "5"), (None, "3")]
    assert [(c.old, c.new) for c in await settings_store.audit(limit=1)] == [("5", "2")]
    assert all(c.at.tzinfo is not None for c in audit)


async def test_a_value_that_is_not_a_setting_is_refused_and_not_stored(
    settings_store: Any,
) -> None:
    with pytest.raises(SettingsError):
        await settings_store.change({"providers.max_attempts": "many"}, by="ops")

    assert await settings_store.stored() == {}
    assert await settings_store.audit() == []


async def test_scopes_are_apart(settings_store: Any, request: pytest.FixtureRequest) -> None:
    await settings_store.change({"capacity.enabled": "true"}, by="ops")

    if isinstance(settings_store, FakeSettings):
        other: Any = FakeSettings(settings_store.scope + "-other")
    else:
        other = SettingsStore(request.getfixturevalue("db"), settings_store.scope + "-other")

    assert await other.stored() == {}
    assert await other.audit() == []


# --------------------------------------------------------------------------- dead letters


def _instant() -> datetime:
    """A death time of this test's own (the archive's partition is shared)."""
    return datetime(2001, 1, 1, tzinfo=UTC) + timedelta(
        milliseconds=random.randrange(10**12)  # about 31 years of milliseconds
    )


def _letter(dead_at: datetime, body: bytes = b"{}", key: str = "batch.x") -> Letter:
    headers = {"x-death": [{"reason": "rejected", "queue": "q", "count": 2, "time": dead_at}]}
    return letter_of(key, f"m-{uuid.uuid4().hex}", {**headers, "app": "v"}, body, dead_at)


async def test_a_letter_reads_back_as_archived_and_waiting(letters: Any) -> None:
    letter = _letter(_instant(), body=b'{"batch_id": "b"}')

    assert await letters.archive(letter) is True
    got = await letters.get(letter.id)

    assert got is not None
    assert (got.id, got.dead_at, got.routing_key, got.reason, got.queue, got.deaths) == (
        letter.id,
        letter.dead_at,
        "batch.x",
        "rejected",
        "q",
        2,
    )
    assert (got.headers, got.body, got.state, got.replayed_at) == (
        {"app": "v"},
        b'{"batch_id": "b"}',
        "waiting",
        None,
    )


async def test_a_letter_archived_twice_is_stored_once(letters: Any) -> None:
    letter = _letter(_instant())
    before = await letters.waiting()

    first, again = await asyncio.gather(letters.archive(letter), letters.archive(letter))

    assert sorted([first, again]) == [False, True]
    assert await letters.waiting() == before + 1


async def test_pages_run_newest_first_after_a_letter(letters: Any) -> None:
    start = _instant()
    made = [_letter(start + timedelta(milliseconds=i)) for i in range(4)]
    for letter in made:
        await letters.archive(letter)

    page = await letters.page(2, after=made[3].id)
    rest = await letters.page(1, after=page[-1].id)

    assert [x.id for x in page] == [made[2].id, made[1].id]
    assert [x.id for x in rest] == [made[0].id]


async def test_an_id_that_is_not_one_finds_nothing(letters: Any) -> None:
    for text in ("", "nope", "123-xyz", "9" * 16 + "-" + "a" * 24, f"1-{'a' * 24}"):
        assert await letters.get(text) is None
        assert await letters.delete(text) is False


async def test_one_claim_wins_and_a_replayed_letter_is_not_claimed_again(letters: Any) -> None:
    letter = _letter(_instant())
    await letters.archive(letter)
    now = datetime.now(UTC)
    owners = [uuid.uuid4(), uuid.uuid4()]

    won = await asyncio.gather(*(letters.claim(letter, o, now) for o in owners))
    assert sorted(won) == [False, True]
    winner = owners[won.index(True)]
    replaying = await letters.get(letter.id)
    assert replaying is not None and replaying.state == "replaying"

    await letters.finish(letter, winner, now)
    done = await letters.get(letter.id)

    assert done is not None and done.state == "replayed" and done.replayed_at is not None
    assert await letters.claim(letter, uuid.uuid4(), now + 2 * REPLAY_LEASE) is False


async def test_a_claim_whose_lease_ran_out_is_taken_over_and_the_old_owner_finishes_nothing(
    letters: Any,
) -> None:
    letter = _letter(_instant())
    await letters.archive(letter)
    now = datetime.now(UTC)
    old, new = uuid.uuid4(), uuid.uuid4()
    assert await letters.claim(letter, old, now)

    assert await letters.claim(letter, new, now + REPLAY_LEASE / 2) is False
    assert await letters.claim(letter, new, now + REPLAY_LEASE + timedelta(seconds=1))
    await letters.finish(letter, old, now)

    held = await letters.get(letter.id)
    assert held is not None and held.state == "replaying"


async def test_a_released_claim_leaves_the_letter_waiting_for_anyone(letters: Any) -> None:
    letter = _letter(_instant())
    await letters.archive(letter)
    now = datetime.now(UTC)
    owner = uuid.uuid4()
    await letters.claim(letter, owner, now)

    await letters.release(letter, uuid.uuid4())  # not the owner: nothing happens
    still = await letters.get(letter.id)
    await letters.release(letter, owner)
    back = await letters.get(letter.id)

    assert still is not None and still.state == "replaying"
    assert back is not None and back.state == "waiting"
    assert await letters.claim(letter, uuid.uuid4(), now)


async def test_a_letter_archived_under_an_old_truncated_id_is_still_found(letters: Any) -> None:
    # Old ids took a float timestamp times 1000 and truncated it: for this death time, one
    # millisecond early.
    died = datetime(2004, 6, 28, 16, 26, 55, 699000, tzinfo=UTC)
    letter = _letter(died)
    old_id = f"{int(died.timestamp() * 1000)}-{letter.id.partition('-')[2]}"
    assert old_id != letter.id
    await letters.archive(dataclasses.replace(letter, id=old_id))

    got = await letters.get(old_id)

    assert got is not None and got.id == old_id and got.dead_at == died
    assert await letters.delete(old_id) is True
    assert await letters.get(old_id) is None


async def test_a_page_after_a_letter_with_an_old_truncated_id_skips_nothing(letters: Any) -> None:
    """The old id names the millisecond before its row: a letter of that millisecond whose
    id sorts after the old one still comes on the next page."""
    died = datetime(2003, 3, 3, 3, 3, 3, 3000, tzinfo=UTC) + timedelta(
        seconds=random.randrange(10**6)
    )
    millis = (died - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)
    old = dataclasses.replace(_letter(died), id=f"{millis - 1}-{'0' * 24}")
    before = dataclasses.replace(
        _letter(died - timedelta(milliseconds=1)), id=f"{millis - 1}-{'f' * 24}"
    )
    await letters.archive(old)
    await letters.archive(before)

    page = await letters.page(1, after=old.id)

    assert [x.id for x in page] == [before.id]


async def test_a_deleted_letter_is_gone_and_no_claim_brings_it_back(letters: Any) -> None:
    letter = _letter(_instant())
    await letters.archive(letter)
    before = await letters.waiting()

    assert await letters.delete(letter.id) is True
    assert await letters.delete(letter.id) is False
    assert await letters.claim(letter, uuid.uuid4(), datetime.now(UTC)) is False

    assert await letters.get(letter.id) is None
    assert await letters.waiting() == before - 1
