"""The Campaigns page's view model (``services.api.dashboard.campaign_pages``): the buttons
each state allows, progress in words, and the confirmation told after a step."""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from services.api.dashboard.campaign_pages import allowed, campaign_rows, create_body, done_notice
from shared.audience.campaigns import Campaign

AT = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)
TEMPLATE, LIST = uuid.uuid1(), uuid.uuid1()


def campaign(state: str = "draft", slices: int = 0, reason: str | None = None) -> Campaign:
    return Campaign(
        uuid.uuid4(), uuid.uuid1(), "News", TEMPLATE, LIST, {"email": "n@example.com"}, {},
        100, None, state, reason, AT, AT, 0, None, slices, 1_500 * slices, 3 * slices,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("state", "buttons"),
    [
        ("draft", ("schedule", "cancel")),
        ("scheduled", ("pause", "cancel")),
        ("sending", ("pause", "cancel")),
        ("paused", ("resume", "cancel")),
        ("sent", ()),
        ("cancelled", ()),
    ],
)
def test_each_state_offers_the_steps_its_lifecycle_allows(
    state: str, buttons: tuple[str, ...]
) -> None:
    assert allowed(campaign(state)) == buttons


def test_a_row_tells_progress_reason_and_names() -> None:
    paused = campaign("paused", slices=2, reason="the daily quota is used up")

    (row,) = campaign_rows(
        [(paused, Counter(queued=10, success=2_980, failed=10))],
        {TEMPLATE: "Autumn"},
        {LIST: "Subscribers"},
    )

    assert (row.state, row.tone, row.reason) == ("paused", "warn", "the daily quota is used up")
    assert (row.batches, row.released, row.skipped) == (2, "3,000", "6")
    assert (row.queued, row.success, row.failed) == ("10", "2,980", "10")
    assert (row.template, row.contact_list) == ("Autumn", "Subscribers")
    assert row.send_at == "As soon as scheduled"


def test_a_row_falls_back_to_ids_for_a_template_or_list_since_removed() -> None:
    (row,) = campaign_rows([(replace(campaign(), send_at=AT), Counter())], {}, {})

    assert (row.template, row.contact_list) == (str(TEMPLATE), str(LIST))
    assert row.send_at == "2026-11-26 10:00:00 UTC"


def test_the_confirmation_names_only_a_known_step_of_one_of_my_campaigns() -> None:
    rows = campaign_rows([(campaign("paused"), Counter())], {}, {})
    mine = str(rows[0].campaign_id)

    assert done_notice({"done": "pause", "campaign": mine}, rows) == (
        "“News” is paused: its held mail waits until you resume it."
    )
    assert done_notice({"done": "pause", "campaign": str(uuid.uuid4())}, rows) is None
    assert done_notice({"done": "<b>owned</b>", "campaign": mine}, rows) is None
    assert done_notice({}, rows) is None


def test_the_create_form_stands_for_the_api_body_without_its_blank_optional_fields() -> None:
    form = {"name": " News ", "from": "n@example.com", "template_id": "t", "list_id": "l"}

    assert create_body({**form, "rate": "", "send_at": ""}) == {
        "name": "News",
        "from": "n@example.com",
        "template_id": "t",
        "list_id": "l",
    }
    assert create_body({**form, "rate": "50"})["rate"] == 50
    assert create_body({**form, "rate": "lots"})["rate"] == "lots"
