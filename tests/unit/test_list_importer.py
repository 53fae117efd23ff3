"""Running an import (``services.api.importing.Importer``) over the stores' twins: slices
written with progress saved after each, the list's count recounted at the end, and an
import that cannot finish ends failed with its reason instead of running forever."""

from __future__ import annotations

import io
import itertools
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from cassandra import InvalidRequest

from services.api.contact_lists import list_scope
from services.api.contacts_csv import READ_CHUNK, Contact
from services.api.importing import STORE_FAILED, UNEXPECTED, Importer
from services.api.list_import import ImportJob
from shared.core.errors import DependencyUnavailable
from shared.infra.config import ListSettings
from shared.infra.gil import CpuLane
from tests.fakes.api import FakeContactLists
from tests.fakes.audience import FakeSuppressionStore


class Recording(FakeContactLists):
    """Keeps every saved state of every import; fails ``put`` from the ``fail_at``-th call
    (with ``error``, an outage unless told)."""

    def __init__(self, fail_at: int | None = None, error: Exception | None = None) -> None:
        super().__init__()
        self.saved: list[ImportJob] = []
        self.puts = 0
        self.fail_at = fail_at
        self.error = error or DependencyUnavailable("cassandra", "WriteTimeout (injected)")

    async def save_import(self, job: ImportJob) -> None:
        self.saved.append(job)
        await super().save_import(job)

    async def put(self, list_id: uuid.UUID, contacts: Sequence[Contact]) -> None:
        self.puts += 1
        if self.fail_at is not None and self.puts >= self.fail_at:
            raise self.error
        await super().put(list_id, contacts)


async def _run(store: Recording, body: bytes, suppressions: Any = None) -> ImportJob:
    user = uuid.uuid4()
    made = await store.create(user, "l")
    now = datetime.now(UTC)
    job = ImportJob(made.list_id, uuid.uuid1(), user, "queued", now, now)
    assert await store.begin_import(job, None)
    importer = Importer(
        store,
        suppressions or FakeSuppressionStore(),
        ListSettings(import_slice=2),
        CpuLane(),
    )
    return await importer.run(job, body, base=0)


async def test_progress_is_saved_after_every_slice_and_the_count_recounted() -> None:
    store = Recording()
    body = b"email\n" + b"".join(b"r%d@example.com\n" % i for i in range(5))

    ended = await _run(store, body)

    assert [(j.state, j.progress.rows_read) for j in store.saved] == [
        ("running", 0),
        ("running", 2),
        ("running", 4),
        ("running", 5),
        ("done", 5),
    ]
    (listed,) = await store.lists(ended.user_id)
    assert listed.contacts == 5 == await store.count(ended.list_id)


async def test_only_this_lists_unsubscribes_keep_an_address_out() -> None:
    store, suppressions = Recording(), FakeSuppressionStore()
    ended = await _run(store, b"email\n", suppressions)  # makes the list
    await suppressions.add(
        ended.user_id, "a@example.com", reason="u", source="t", scope=list_scope(ended.list_id)
    )
    await suppressions.add(ended.user_id, "b@example.com", reason="u", source="t", scope="x")
    job = ImportJob(
        ended.list_id, uuid.uuid1(), ended.user_id, "queued", ended.created_at, ended.created_at
    )
    assert await store.begin_import(job, ended.import_id)
    importer = Importer(store, suppressions, ListSettings(), CpuLane())

    done = await importer.run(job, b"email\na@example.com\nb@example.com\n", base=0)

    assert (done.progress.unsubscribed, done.progress.added) == (1, 1)
    assert await store.existing(ended.list_id, ["a@example.com", "b@example.com"]) == {
        "b@example.com"
    }


async def test_an_outage_part_way_ends_the_import_failed_with_the_reason() -> None:
    store = Recording(fail_at=2)
    body = b"email\n" + b"".join(b"r%d@example.com\n" % i for i in range(5))

    ended = await _run(store, body)

    assert (ended.state, ended.reason) == ("failed", STORE_FAILED)
    assert ended.progress.added == 2
    assert store.saved[-1] == ended


async def test_a_file_failing_part_way_ends_the_import_failed_saying_where() -> None:
    store = Recording()

    ended = await _run(store, b'email\na@example.com\nb@example.com\n"' + b"x" * 200_000 + b'"\n')

    assert ended.state == "failed"
    assert ended.reason is not None and "row 4 is not CSV" in ended.reason
    assert (ended.progress.rows_read, ended.progress.added) == (2, 2)


async def test_an_unexpected_error_ends_the_import_failed_and_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A request the database refuses (not an outage) must not leave the import running."""
    store = Recording(fail_at=2, error=InvalidRequest("Batch too large"))
    body = b"email\n" + b"".join(b"r%d@example.com\n" % i for i in range(5))

    ended = await _run(store, body)

    assert (ended.state, ended.reason) == ("failed", UNEXPECTED)
    assert ended.finished_at is not None and ended.progress.added == 2
    assert store.saved[-1] == ended
    (listed,) = await store.lists(ended.user_id)
    assert listed.contacts == 2
    (record,) = [r for r in caplog.records if r.name == "services.api.importing"]
    assert record.exc_info is not None and "Batch too large" in str(record.exc_info[1])


class Watched(io.BytesIO):
    """The import's file, remembering how far it had been read at each progress write."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.furthest = 0
        self.read_by_save: list[int] = []

    def read(self, size: int | None = -1, /) -> bytes:
        out = super().read(size)
        self.furthest = max(self.furthest, self.tell())
        return out


class Tracking(Recording):
    file: Watched | None = None

    async def save_import(self, job: ImportJob) -> None:
        if self.file is not None:
            self.file.read_by_save.append(self.file.furthest)
        await super().save_import(job)


async def test_the_file_is_read_as_the_import_goes_never_whole() -> None:
    """Each slice reads about one more chunk of the file: what the import holds does not
    grow with the file."""
    store = Tracking()
    body = b"email\n" + b"".join(b"r%06d@example.com\n" % i for i in range(40_000))
    store.file = Watched(body)
    user = uuid.uuid4()
    made = await store.create(user, "l")
    now = datetime.now(UTC)
    job = ImportJob(made.list_id, uuid.uuid1(), user, "queued", now, now)
    assert await store.begin_import(job, None)
    importer = Importer(
        store,
        FakeSuppressionStore(),
        ListSettings(import_slice=1_000),
        CpuLane(),
    )

    ended = await importer.run(job, store.file, base=0)

    assert (ended.state, ended.progress.added) == ("done", 40_000)
    read = store.file.read_by_save
    assert read[1] <= 2 * READ_CHUNK < len(body) // 4  # after the first slice
    steps = [b - a for a, b in itertools.pairwise(read[1:-1])]
    assert max(steps) <= 2 * READ_CHUNK
