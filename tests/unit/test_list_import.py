"""Deciding a contact list's import (``services.api.list_import``): what becomes of each row, the
progress and report, and a stale import read as failed."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from services.api.contacts_csv import Contact, Rejected
from services.api.list_import import (
    INTERRUPTED,
    MAX_PROBLEMS,
    ImportJob,
    Problem,
    Progress,
    advance,
    finish,
    live,
    shown,
    sort_slice,
)

NOW = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)
STALE = timedelta(seconds=60)


def _job(state: str = "queued", heartbeat: datetime = NOW) -> ImportJob:
    return ImportJob(uuid.uuid1(), uuid.uuid1(), uuid.uuid4(), state, NOW, heartbeat)  # type: ignore[arg-type]


def test_each_row_is_added_updated_or_reported_with_its_row() -> None:
    items: list[Contact | Rejected] = [
        Contact("new@example.com", {}, 2),
        Contact("Sup@example.com", {}, 3),
        Contact("unsub@example.com", {}, 4),
        Contact("old@example.com", {"city": "Oslo"}, 5),
        Rejected(6, "nope", "not an address"),
        Rejected(7, "new@example.com", "already in the file", "duplicate"),
    ]

    done = sort_slice(
        items,
        suppressed={"sup@example.com": "bounce"},
        unsubscribed={"unsub@example.com": "unsubscribe"},
        existing={"old@example.com"},
        room=10,
    )

    assert [c.email for c in done.write] == ["new@example.com", "old@example.com"]
    assert done.progress == Progress(
        rows_read=6, added=1, updated=1, invalid=1, duplicates=1, suppressed=1, unsubscribed=1
    )
    assert [(p.row, p.kind) for p in done.problems] == [
        (3, "suppressed"),
        (4, "unsubscribed"),
        (5, "existing"),
        (6, "invalid"),
        (7, "duplicate"),
    ]
    assert done.problems[0].reason == "suppressed: bounce"


def test_a_suppression_for_all_mail_wins_over_the_lists_unsubscribe() -> None:
    done = sort_slice(
        [Contact("a@example.com", {}, 2)],
        suppressed={"a@example.com": "complaint"},
        unsubscribed={"a@example.com": "unsubscribe"},
        existing=set(),
        room=1,
    )

    assert [p.kind for p in done.problems] == ["suppressed"]


def test_new_addresses_beyond_the_lists_room_are_over_the_limit_but_updates_go_on() -> None:
    items = [Contact(f"n{i}@example.com", {}, i + 2) for i in range(3)]
    items.append(Contact("old@example.com", {}, 9))

    done = sort_slice(items, suppressed={}, unsubscribed={}, existing={"old@example.com"}, room=2)

    assert [c.email for c in done.write] == ["n0@example.com", "n1@example.com", "old@example.com"]
    assert (done.progress.added, done.progress.over_limit, done.progress.updated) == (2, 1, 1)


def test_progress_adds_up_and_keeps_only_the_first_problems() -> None:
    many = [Rejected(i, "x", "not an address") for i in range(MAX_PROBLEMS + 5)]
    done = sort_slice(many, suppressed={}, unsubscribed={}, existing=set(), room=0)
    later = NOW + timedelta(seconds=5)

    once = advance(_job(), done, later)
    twice = advance(once, done, later)

    assert once.state == "running" and once.heartbeat == later
    assert twice.progress.invalid == 2 * (MAX_PROBLEMS + 5)
    assert len(twice.problems) == MAX_PROBLEMS
    assert twice.problems[0] == Problem(0, "x", "invalid", "not an address")


def test_an_import_ends_done_or_failed_with_its_reason() -> None:
    assert (finish(_job(), NOW).state, finish(_job(), NOW).finished_at) == ("done", NOW)
    assert (finish(_job(), NOW, "boom").state, finish(_job(), NOW, "boom").reason) == (
        "failed",
        "boom",
    )


def test_an_import_without_a_heartbeat_for_too_long_reads_as_failed() -> None:
    fresh = _job("running", NOW - STALE)
    stale = _job("running", NOW - STALE - timedelta(seconds=1))

    assert live(fresh, NOW, STALE) and shown(fresh, NOW, STALE) == fresh
    assert not live(stale, NOW, STALE)
    assert (shown(stale, NOW, STALE).state, shown(stale, NOW, STALE).reason) == (
        "failed",
        INTERRUPTED,
    )


def test_a_finished_import_is_never_live_nor_rewritten() -> None:
    done = finish(_job(), NOW - timedelta(days=1))

    assert not live(done, NOW, STALE)
    assert shown(done, NOW, STALE) == done
