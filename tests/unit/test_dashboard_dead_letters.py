"""The operators' dead letters page (``services.api.dashboard.operations``): its pages over
the archive, newest first, of one queue when asked (read a chunk at a time, within a budget),
and its HTML: each form carries the CSRF token and comes back to the filtered page."""

from __future__ import annotations

import dataclasses
import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from services.api.dashboard import create_templates
from services.api.dashboard.operations import SCAN_BUDGET, letter_page
from services.api.sessions import SessionUser
from shared.infra.topology import dispatch_key
from shared.ops.deadletters import Letter, letter_of, view
from tests.fakes.ops import FakeLetters

AT = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)
USER = SessionUser(uuid.uuid4(), "op", None, None, None, "CSRF-TOKEN-1", "s", 1)


def letter(n: int, queue: str) -> Letter:
    made = letter_of(dispatch_key("sg", uuid.uuid1()), None, {}, b"{}", AT + timedelta(seconds=n))
    return dataclasses.replace(made, queue=queue)


async def archive(*queues: str) -> FakeLetters:
    store = FakeLetters()
    for n, queue in enumerate(queues):
        await store.archive(letter(n, queue))
    return store


async def test_pages_go_from_the_newest_letter_to_the_oldest() -> None:
    store = await archive(*["q.send"] * 30)

    first = await letter_page(store, None, None)
    second = await letter_page(store, None, first.next_after)

    assert (len(first.letters), len(second.letters)) == (25, 5)
    assert second.next_after is None
    stamps = [x["dead_at"] for x in first.letters + second.letters]
    assert stamps == sorted(stamps, reverse=True) and len(set(stamps)) == 30


async def test_a_queue_filter_keeps_only_that_queues_letters_across_chunks() -> None:
    store = await archive(*(["q.send", "q.events"] * 300))

    first = await letter_page(store, "q.events", None)
    rest = await letter_page(store, "q.events", first.next_after, limit=1000)

    assert {x["queue"] for x in first.letters + rest.letters} == {"q.events"}
    assert (len(first.letters), len(first.letters) + len(rest.letters)) == (25, 300)
    assert rest.next_after is None


async def test_a_filter_that_matches_nothing_stops_at_its_budget_and_goes_on_after() -> None:
    store = await archive(*["q.send"] * (SCAN_BUDGET + 10))

    first = await letter_page(store, "q.events", None)
    rest = await letter_page(store, "q.events", first.next_after)

    assert first.letters == [] and first.next_after is not None
    assert rest.letters == [] and rest.next_after is None


def rendered(letters: list[Letter], **context: Any) -> str:
    base: dict[str, Any] = {"user": USER, "operator": True, "active": "operations"}
    base |= {"notice": None, "title": "Dead letters", "waiting": len(letters), "paged": False}
    base |= {"letters": [view(x) for x in letters], "next_cursor": None, "queue": None}
    return create_templates().env.get_template("dead_letters.html").render({**base, **context})


def test_the_filtered_page_keeps_its_queue_in_its_forms_and_its_pager() -> None:
    page = rendered([letter(1, "q.events")], queue="q.events", next_cursor="abc=")

    forms = re.findall(r"<form .*?</form>", page, re.S)
    assert len(forms) == 3  # log out, replay, delete
    assert all('name="csrf_token" value="CSRF-TOKEN-1"' in f for f in forms)
    assert sum('name="queue" value="q.events"' in f for f in forms) == 2
    assert 'href="/operations/dead-letters?queue=q.events&amp;cursor=abc%3D"' in page
    assert "Every queue" in page


def test_a_replayed_letter_offers_no_replay() -> None:
    replayed = dataclasses.replace(letter(1, "q.send"), state="replayed", replayed_at=AT)

    page = rendered([replayed])

    assert 'value="replay"' not in page and 'value="delete"' in page
