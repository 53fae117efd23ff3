"""The one-click unsubscribe a batch gets by default (``shared.delivery.validation``):
the bulk lane brings it, as Gmail and Yahoo require of bulk senders; a request saying
``false`` wins; shared messages and deployments without tracking go without, with a
warning in the 202 and never a 422 the sender did not cause."""

from __future__ import annotations

import itertools
import uuid

import pytest

from services.api.sending import answer
from shared.accounts.preferences import Preferences
from shared.core import lanes
from shared.core.models import Engagement
from shared.delivery import validation
from shared.delivery.validation import (
    SHARED_NO_UNSUBSCRIBE,
    UNTRACKED_NO_UNSUBSCRIBE,
    Unsubscribe,
    unsubscribe_of,
)

TWO = ["a@example.com", "b@example.com"]


def _expected(
    lane: lanes.Priority,
    asked: bool | None,
    preferred: bool,
    listed: bool,
    shared: bool,
    tracking: bool,
) -> Unsubscribe:
    """The truth table written out as the rules read, independently of the code's order."""
    if asked is not None:
        return Unsubscribe(on=asked and not shared)
    if shared:
        return Unsubscribe(False, SHARED_NO_UNSUBSCRIBE if lane == "bulk" else None)
    if preferred or listed:
        return Unsubscribe(True)
    if lane == "bulk":
        return Unsubscribe(tracking, None if tracking else UNTRACKED_NO_UNSUBSCRIBE)
    return Unsubscribe(False)


@pytest.mark.parametrize(
    ("lane", "asked", "preferred", "listed", "shared", "tracking"),
    list(
        itertools.product(
            lanes.PRIORITIES,
            (None, True, False),
            (False, True),
            (False, True),
            (False, True),
            (False, True),
        )
    ),
)
def test_the_unsubscribe_decision_follows_the_truth_table(
    lane: lanes.Priority,
    asked: bool | None,
    preferred: bool,
    listed: bool,
    shared: bool,
    tracking: bool,
) -> None:
    got = unsubscribe_of(
        lane=lane,
        asked=asked,
        preferred=preferred,
        listed=listed,
        shared=shared,
        tracking=tracking,
    )

    assert got == _expected(lane, asked, preferred, listed, shared, tracking)


def test_a_bulk_lane_personal_batch_gets_one_click_unsubscribe_by_default() -> None:
    assert unsubscribe_of(
        lane="bulk", asked=None, preferred=False, listed=False, shared=False, tracking=True
    ) == Unsubscribe(True)


def test_unsubscribe_false_wins_over_the_bulk_lane_without_a_warning() -> None:
    assert unsubscribe_of(
        lane="bulk", asked=False, preferred=True, listed=True, shared=False, tracking=True
    ) == Unsubscribe(False)


def test_a_transactional_batch_keeps_going_without_by_default() -> None:
    assert unsubscribe_of(
        lane="transactional",
        asked=None,
        preferred=False,
        listed=False,
        shared=False,
        tracking=True,
    ) == Unsubscribe(False)


def _request(body: dict[str, object], *, threshold: int = 1_000) -> validation.BatchRequest:
    base = {"from": "s@example.com", "to": ["a@example.com"], "subject": "s", "text": "t"}
    return validation.parse_batch_request(
        {**base, **body}, max_recipients=10, bulk_threshold=threshold
    )


def test_priority_bulk_brings_the_header_to_each_copy() -> None:
    out = validation.with_engagement(_request({"priority": "bulk"}), Preferences())

    assert out.message.engagement == Engagement(unsubscribe=True)
    assert out.warnings == ()


def test_a_batch_over_the_bulk_threshold_brings_the_header() -> None:
    out = validation.with_engagement(_request({"to": TWO}, threshold=1), Preferences())

    assert out.message.lane == "bulk"
    assert out.message.engagement == Engagement(unsubscribe=True)


def test_message_bulk_copies_alone_are_not_the_bulk_lane() -> None:
    """``bulk: true`` asks for per-recipient copies, not for the bulk lane."""
    request = _request({"bulk": True, "to": TWO})

    assert validation.with_engagement(request, Preferences()) == request


def test_a_shared_bulk_batch_goes_without_and_the_answer_says_why() -> None:
    shared = _request({"priority": "bulk", "shared": True, "to": TWO})

    out = validation.with_engagement(shared, Preferences())

    assert out.message.engagement is None
    assert out.warnings == (SHARED_NO_UNSUBSCRIBE,)


def test_without_tracking_the_default_does_not_apply_and_nothing_is_refused() -> None:
    out = validation.with_engagement(_request({"priority": "bulk"}), Preferences(), tracking=False)

    assert out.message.engagement is None
    assert out.warnings == (UNTRACKED_NO_UNSUBSCRIBE,)


def test_the_202_answer_says_what_the_batch_goes_without() -> None:
    shared = _request({"priority": "bulk", "shared": True, "to": TWO})
    warned = validation.with_engagement(shared, Preferences())

    out = answer(uuid.uuid4(), warned)
    quiet = answer(uuid.uuid4(), validation.with_engagement(_request({}), Preferences()))

    assert out.warnings == [SHARED_NO_UNSUBSCRIBE]
    assert "warnings" not in quiet.model_fields_set
