"""The contact list store's contract, asserted identically of the in-memory twin
(``tests/fakes/api.py``) and of :class:`services.api.contact_lists.ContactLists` on
Cassandra: lists per user, contacts by bucket in address order, paging a whole list, and one
import at a time per list."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from services.api.contact_lists import BUCKETS, ContactLists, Position, bucket_of, read_page
from services.api.contacts_csv import Contact
from services.api.list_import import ImportJob, Problem, Progress
from shared.infra.db import Database
from tests.contracts.conftest import IMPLEMENTATIONS
from tests.fakes.api import FakeContactLists


@pytest.fixture(params=IMPLEMENTATIONS)
def store(request: pytest.FixtureRequest) -> Any:
    if request.param == "fake":
        return FakeContactLists()
    db: Database = request.getfixturevalue("db")
    return ContactLists(db)


def _job(user_id: uuid.UUID, list_id: uuid.UUID) -> ImportJob:
    now = datetime.now(UTC).replace(microsecond=0)
    return ImportJob(list_id, uuid.uuid1(), user_id, "queued", now, now)


async def test_a_list_is_its_users_only_and_lists_come_newest_first(store: Any) -> None:
    """Another user's id finds nothing."""
    user, other = uuid.uuid4(), uuid.uuid4()
    first = await store.create(user, "customers")
    second = await store.create(user, "newsletter")

    assert [x.list_id for x in await store.lists(user)] == [second.list_id, first.list_id]
    assert await store.get(user, first.list_id) == first
    assert await store.get(other, first.list_id) is None
    assert await store.lists(other) == []
    assert (first.name, first.contacts, first.latest_import) == ("customers", 0, None)


async def test_contacts_are_kept_by_address_in_lower_case_and_replaced_when_put_again(
    store: Any,
) -> None:
    made = await store.create(uuid.uuid4(), "l")
    await store.put(made.list_id, [Contact("Ann@Example.com", {"name": "Ann", "city": "Oslo"})])
    await store.put(made.list_id, [Contact("ann@example.com", {"city": "Bergen"})])

    found = await store.contacts(made.list_id, bucket_of("ann@example.com"), None, 10)

    assert [(c.email, c.name, c.fields) for c in found] == [
        ("ann@example.com", None, {"city": "Bergen"})
    ]
    assert await store.existing(made.list_id, ["ANN@example.com", "bob@example.com"]) == {
        "ann@example.com"
    }


async def test_a_bucket_reads_in_address_order_after_a_given_address(store: Any) -> None:
    made = await store.create(uuid.uuid4(), "l")
    emails = [f"u{i}@example.com" for i in range(300)]
    await store.put(made.list_id, [Contact(e, {"name": e[:4]}) for e in emails])
    bucket = bucket_of(emails[0])
    mine = sorted(e for e in emails if bucket_of(e) == bucket)

    first = await store.contacts(made.list_id, bucket, None, 2)
    rest = await store.contacts(made.list_id, bucket, first[-1].email, 1000)

    assert [c.email for c in first + rest] == mine
    assert first[0].name == mine[0][:4]


async def test_pages_walk_every_contact_of_a_list_once(store: Any) -> None:
    made = await store.create(uuid.uuid4(), "l")
    emails = {f"p{i}@example.com" for i in range(150)}
    await store.put(made.list_id, [Contact(e, {}) for e in emails])
    seen: list[str] = []
    at: Position | None = Position()
    pages = 0

    while at is not None:
        page, at = await read_page(store, made.list_id, at, 40)
        seen.extend(c.email for c in page)
        pages += 1

    assert sorted(seen) == sorted(emails)
    assert pages in (4, 5)  # the last page may be found empty


async def test_an_empty_list_is_one_empty_page(store: Any) -> None:
    made = await store.create(uuid.uuid4(), "l")

    assert await read_page(store, made.list_id, Position(), 10) == ([], None)
    assert await read_page(store, made.list_id, Position(BUCKETS), 10) == ([], None)


async def test_a_contact_is_removed_once_and_the_recount_follows(store: Any) -> None:
    user = uuid.uuid4()
    made = await store.create(user, "l")
    await store.put(made.list_id, [Contact(f"c{i}@example.com", {}) for i in range(5)])

    assert await store.remove(made.list_id, "C1@example.com") is True
    assert await store.remove(made.list_id, "c1@example.com") is False
    assert await store.count(made.list_id) == 4
    await store.set_count(user, made.list_id, 4)
    stored = await store.get(user, made.list_id)
    assert stored is not None and stored.contacts == 4


async def test_one_of_two_imports_begun_at_once_wins(store: Any) -> None:
    """Both saw no latest import: the lightweight transaction lets one through."""
    user = uuid.uuid4()
    made = await store.create(user, "l")
    a, b = _job(user, made.list_id), _job(user, made.list_id)

    won = await asyncio.gather(store.begin_import(a, None), store.begin_import(b, None))

    assert sorted(won) == [False, True]
    winner = a if won[0] else b
    stored = await store.get(user, made.list_id)
    assert stored is not None and stored.latest_import == winner.import_id
    assert await store.get_import(made.list_id, winner.import_id) == winner
    loser = b if won[0] else a
    assert await store.get_import(made.list_id, loser.import_id) is None


async def test_a_next_import_begins_from_the_latest_one(store: Any) -> None:
    user = uuid.uuid4()
    made = await store.create(user, "l")
    first, second = _job(user, made.list_id), _job(user, made.list_id)
    assert await store.begin_import(first, None)

    assert await store.begin_import(second, None) is False
    assert await store.begin_import(second, first.import_id) is True


async def test_an_import_of_another_users_list_does_not_begin(store: Any) -> None:
    made = await store.create(uuid.uuid4(), "l")

    assert await store.begin_import(_job(uuid.uuid4(), made.list_id), None) is False


async def test_an_imports_progress_and_problems_are_read_back_as_saved(store: Any) -> None:
    user = uuid.uuid4()
    made = await store.create(user, "l")
    job = _job(user, made.list_id)
    assert await store.begin_import(job, None)
    later = ImportJob(
        job.list_id,
        job.import_id,
        user,
        "failed",
        job.created_at,
        job.created_at,
        Progress(rows_read=5, added=1, updated=1, invalid=1, duplicates=1, suppressed=1),
        (Problem(3, "x", "invalid", "not an address"), Problem(4, "a@b.co", "duplicate", "d")),
        "the file is not UTF-8 text (byte 3)",
        job.created_at,
    )

    await store.save_import(later)

    assert await store.get_import(made.list_id, job.import_id) == later


async def test_wide_contacts_sharing_a_bucket_are_all_written(store: Any) -> None:
    """Twenty contacts of one bucket with fifty 1,000-character fields each (about 1 MB): the
    writes are split so that no batch passes the database's batch size limit."""
    made = await store.create(uuid.uuid4(), "l")
    bucket = bucket_of("w0@example.com")
    emails = [e for e in (f"w{i}@example.com" for i in range(5000)) if bucket_of(e) == bucket]
    wide = {f"f{j}": chr(ord("a") + j % 26) * 1000 for j in range(50)}
    contacts = [Contact(e, wide) for e in emails[:20]]

    await store.put(made.list_id, contacts)

    found = await store.contacts(made.list_id, bucket, None, 100)
    assert sorted(c.email for c in found) == sorted(emails[:20])
    assert all(c.fields == wide for c in found)


async def test_a_list_is_made_with_the_id_it_is_given(store: Any) -> None:
    """The id its place under the cap was claimed for."""
    user, list_id = uuid.uuid4(), uuid.uuid1()

    made = await store.create(user, "claimed", list_id)

    assert made.list_id == list_id
    assert await store.get(user, list_id) == made


async def test_a_deleted_list_takes_its_contacts_and_imports_with_it(store: Any) -> None:
    """Another of the user's lists is untouched; deleting again answers False."""
    user = uuid.uuid4()
    gone, kept = await store.create(user, "gone"), await store.create(user, "kept")
    for made in (gone, kept):
        await store.put(made.list_id, [Contact("ann@example.com", {"n": "1"})])
    job = _job(user, gone.list_id)
    assert await store.begin_import(job, None)

    assert await store.delete(user, gone.list_id)
    assert not await store.delete(user, gone.list_id)
    assert await store.get(user, gone.list_id) is None
    assert [x.list_id for x in await store.lists(user)] == [kept.list_id]
    assert await store.existing(gone.list_id, ["ann@example.com"]) == set()
    assert await store.get_import(gone.list_id, job.import_id) is None
    assert await store.existing(kept.list_id, ["ann@example.com"]) == {"ann@example.com"}


async def test_a_deleted_list_stays_gone_when_its_count_is_set_after(store: Any) -> None:
    """An import or a removal racing the deletion sets the count of a list that is gone:
    no list comes back, and no import can begin on it."""
    user = uuid.uuid4()
    made = await store.create(user, "gone")
    await store.delete(user, made.list_id)

    await store.set_count(user, made.list_id, 5)

    assert await store.get(user, made.list_id) is None
    assert await store.lists(user) == []
    assert not await store.begin_import(_job(user, made.list_id), None)


async def test_a_list_deleted_at_once_after_its_creation_stays_gone(store: Any) -> None:
    """A deletion right after the creation wins, every time: both writes of the row are
    ordered by the store, not by two clocks (a plain insert stamped in microseconds by the
    client outlived a transaction stamped in milliseconds by the server, 48 of 300 times)."""
    user = uuid.uuid4()
    for _ in range(40):
        made = await store.create(user, "gone")
        assert await store.delete(user, made.list_id)
        assert await store.get(user, made.list_id) is None
