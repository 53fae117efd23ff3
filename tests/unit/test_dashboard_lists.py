"""The Lists page's view model (``services.api.dashboard.lists``): counts and each list's
latest import in words."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from services.api.contact_lists import ContactList
from services.api.dashboard.lists import import_summary, list_rows
from services.api.list_import import ImportJob, Problem, Progress

AT = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)


def _job(progress: Progress, state: str = "done", reason: str | None = None) -> ImportJob:
    return ImportJob(
        uuid.uuid1(),
        uuid.uuid1(),
        uuid.uuid4(),
        state,  # type: ignore[arg-type]
        AT,
        AT,
        progress,
        (Problem(3, "x", "invalid", "not an address"),),
        reason,
    )


def test_a_summary_names_only_the_counts_that_happened() -> None:
    job = _job(Progress(rows_read=1200, added=1190, invalid=3, duplicates=1, unsubscribed=6))
    twice = _job(Progress(rows_read=3, added=1, duplicates=2))

    assert import_summary(job) == (
        "1,200 rows read: 1,190 added, 3 invalid, 1 duplicate, 6 unsubscribed"
    )
    assert import_summary(twice) == "3 rows read: 1 added, 2 duplicates"
    assert import_summary(_job(Progress(rows_read=1))) == "1 row read"


def test_a_row_shows_the_count_and_the_latest_import_badged_by_its_state() -> None:
    made = ContactList(uuid.uuid4(), uuid.uuid1(), "News", AT, 12_345, None)
    failed = _job(Progress(rows_read=2, added=2), "failed", "interrupted")

    with_import, without = list_rows([(made, failed), (made, None)])

    assert with_import.contacts == "12,345"
    assert with_import.latest is not None
    assert (with_import.latest.tone, with_import.latest.reason) == ("bad", "interrupted")
    assert with_import.latest.problems == 1
    assert with_import.created == "2026-11-26 10:00:00 UTC"
    assert without.latest is None
