"""Campaigns (pure): the lifecycle's moves, the runner's pace and slices, and which batches
the consumers hold."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from services.api.campaign_runner import SLICE, pace, recipients_of, slice_body
from services.api.contact_lists import ListContact
from services.consumers.campaign_hold import campaign_of
from shared.audience.campaigns import METADATA_KEY, Campaign, LifecycleError, next_state
from shared.core.models import Address, Message


@pytest.mark.parametrize(
    ("state", "action", "started", "after"),
    [
        ("draft", "schedule", False, "scheduled"),
        ("scheduled", "pause", False, "paused"),
        ("sending", "pause", True, "paused"),
        ("paused", "resume", True, "sending"),
        ("paused", "resume", False, "scheduled"),
        ("draft", "cancel", False, "cancelled"),
        ("paused", "cancel", True, "cancelled"),
        ("sending", "cancel", True, "cancelled"),
    ],
)
def test_each_allowed_step_moves_to_its_state(
    state: str, action: str, started: bool, after: str
) -> None:
    assert next_state(state, action, started=started) == after  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("state", "action"),
    [
        ("scheduled", "schedule"),
        ("draft", "pause"),
        ("paused", "pause"),
        ("sending", "resume"),
        ("sent", "cancel"),
        ("cancelled", "resume"),
    ],
)
def test_a_step_the_state_does_not_allow_is_refused_naming_the_state(
    state: str, action: str
) -> None:
    with pytest.raises(LifecycleError, match=state):
        next_state(state, action, started=True)  # type: ignore[arg-type]


def test_the_pace_follows_the_rate_in_slices_no_larger_than_a_batch() -> None:
    assert pace(100) == (1, 50)
    assert pace(2_000) == (2, SLICE)
    assert pace(1) == (1, 1)  # a pass always makes progress


def test_a_contact_without_a_field_the_template_wants_gets_it_empty() -> None:
    when = datetime(2026, 11, 26, tzinfo=UTC)
    contacts = [
        ListContact("a@example.com", "Ann", {"first_name": "Ann", "city": "Oslo"}, when),
        ListContact("b@example.com", None, {}, when),
    ]

    to = recipients_of(contacts, frozenset({"first_name"}))

    assert to == [
        {
            "email": "a@example.com",
            "name": "Ann",
            "substitutions": {"first_name": "Ann", "city": "Oslo"},
        },
        {"email": "b@example.com", "substitutions": {"first_name": ""}},
    ]


def _campaign() -> Campaign:
    when = datetime(2026, 11, 26, tzinfo=UTC)
    return Campaign(
        uuid.uuid4(), uuid.uuid1(), "n", uuid.uuid1(), uuid.uuid1(), {"email": "s@example.com"},
        {"shop": "x"}, 100, None, "sending", None, when, None, 0, None, 0, 0, 0,
    )  # fmt: skip


def test_a_slice_is_bulk_mail_of_the_template_naming_its_list_and_campaign() -> None:
    c = _campaign()

    body = slice_body(c, [{"email": "a@example.com"}])

    assert body["template_id"] == str(c.template_id)
    assert body["list"] == str(c.list_id)
    assert body["unsubscribe"] is True
    assert body["priority"] == "bulk"
    assert body["metadata"] == {METADATA_KEY: str(c.campaign_id)}
    assert "subject" not in body


def test_only_batches_naming_a_campaign_are_held() -> None:
    sender = Address(email="s@example.com")
    cid = uuid.uuid1()
    named = Message(sender=sender, subject="s", metadata={METADATA_KEY: str(cid)})

    assert campaign_of(named) == cid
    assert campaign_of(Message(sender=sender, subject="s")) is None
    assert campaign_of(Message(sender=sender, subject="s", metadata={METADATA_KEY: "x"})) is None
