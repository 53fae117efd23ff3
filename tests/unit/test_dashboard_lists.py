"""The Lists pages (``services.api.dashboard.lists``): counts and each list's latest import in
words, a list's contacts, and a list's page as rendered (its forms' CSRF token, the import it
follows)."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from typing import Any

from services.api.contact_lists import ContactList, ListContact
from services.api.dashboard import create_templates
from services.api.dashboard.lists import contact_rows, done_notice, import_summary, list_rows
from services.api.list_import import ImportJob, Problem, Progress
from services.api.sessions import SessionUser

AT = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)
USER = SessionUser(uuid.uuid4(), "ann", None, None, None, "CSRF-TOKEN-1", "s")


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


def _rendered_list(latest: ImportJob | None, **context: Any) -> str:
    list_id = latest.list_id if latest else uuid.uuid1()
    made = ContactList(uuid.uuid4(), list_id, "News", AT, 2, None)
    (row,) = list_rows([(made, latest)])
    base: dict[str, Any] = {"user": USER, "operator": False, "active": "lists", "notice": None}
    base |= {"title": "List", "l": row, "running": False, "problem": None}
    base |= {"contacts": [], "next_cursor": None, "paged": False}
    return create_templates().env.get_template("list.html").render({**base, **context})


def test_a_contact_row_shows_its_fields_in_order() -> None:
    (row,) = contact_rows(
        [ListContact("a@example.com", "Ann", {"plan": "pro", "city": "Oslo"}, AT)]
    )

    assert (row.email, row.name, row.fields) == ("a@example.com", "Ann", "city: Oslo, plan: pro")


def test_a_running_import_is_followed_by_the_page_and_a_finished_one_is_not() -> None:
    running = _job(Progress(rows_read=10, added=10), "running")

    followed = _rendered_list(running, running=True)
    done = _rendered_list(_job(Progress(rows_read=2, added=2)))

    assert f'data-import-poll="/lists/{running.list_id}/imports/{running.import_id}"' in followed
    assert (
        re.search(r"<progress[^>]*>", followed)
        and '<progress id="import-progress" hidden' not in followed
    )
    assert "data-import-poll" not in done and "2 rows read: 2 added" in done


def test_every_form_of_a_list_page_carries_the_csrf_token_and_the_upload_its_header() -> None:
    contacts = contact_rows([ListContact("a@example.com", None, {}, AT)])

    page = _rendered_list(None, contacts=contacts, next_cursor="abc=", paged=True)

    forms = re.findall(r"<form .*?</form>", page, re.S)
    posted = [f for f in forms if "data-import" not in f]
    assert len(posted) == 3  # log out, remove the contact, delete the list
    assert all('name="csrf_token" value="CSRF-TOKEN-1"' in f for f in posted)
    assert 'data-csrf="CSRF-TOKEN-1"' in page
    assert "?cursor=abc%3D" in page and "← First page" in page


def test_the_notice_names_only_a_known_outcome() -> None:
    assert done_notice({"done": "created"}) == (
        "The list was created: import a CSV file into it below."
    )
    assert done_notice({"done": "<b>"}) is None
