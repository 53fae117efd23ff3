"""Which write of a recipient's state wins, and what readers see (pure)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from cassandra.util import uuid_from_time

from shared import precedence

ACCEPTED = datetime(2026, 11, 25, 12, 0, 0, 250_000, tzinfo=UTC)
BATCH = uuid_from_time(ACCEPTED)


def test_acceptance_time_is_read_from_the_batch_id() -> None:
    assert abs(precedence.accepted_at(BATCH) - ACCEPTED) < timedelta(milliseconds=1)


def test_queued_loses_to_our_give_up_which_loses_to_any_provider_evidence() -> None:
    queued = precedence.queued_stamp(BATCH)
    gave_up = precedence.give_up_stamp(BATCH)
    evidence = precedence.provider_stamp(BATCH, ACCEPTED, 0)
    assert queued < gave_up < evidence


def test_a_delivery_reported_long_after_the_give_up_still_wins() -> None:
    late = precedence.provider_stamp(BATCH, ACCEPTED + timedelta(days=2), 0)
    assert late > precedence.give_up_stamp(BATCH)


def test_a_provider_clock_behind_ours_never_loses_to_queued() -> None:
    behind = precedence.provider_stamp(BATCH, ACCEPTED - timedelta(minutes=5), 0)
    assert behind > precedence.queued_stamp(BATCH)


def test_within_one_second_the_higher_ranked_kind_wins() -> None:
    assert precedence.provider_stamp(BATCH, ACCEPTED, 2) > precedence.provider_stamp(
        BATCH, ACCEPTED, 1
    )


@pytest.mark.parametrize("rank", [-1, 1000])
def test_ranks_outside_a_second_are_refused(rank: int) -> None:
    with pytest.raises(ValueError, match="rank"):
        precedence.provider_stamp(BATCH, ACCEPTED, rank)


def test_readers_see_a_provider_outcome_over_our_give_up() -> None:
    row = {"state": "success", "event": "delivered", "gave_up_reason": "all providers failed"}
    assert precedence.visible(row) == precedence.Visible("success", "delivered", None)


def test_readers_see_failed_when_we_gave_up_and_no_provider_spoke() -> None:
    row = {"state": None, "event": "sent", "gave_up_reason": "every provider failed"}
    assert precedence.visible(row) == precedence.Visible(
        "failed", "failed", "every provider failed"
    )


def test_a_recipient_nobody_decided_is_queued_with_its_latest_event() -> None:
    assert precedence.visible({"state": "queued", "event": "deferred"}).state == "queued"
    assert precedence.visible({}).event == "queued"


def test_ids_from_other_clocks_are_ordered_by_their_own_time() -> None:
    other = uuid.uuid1()
    assert precedence.queued_stamp(other) < precedence.give_up_stamp(other)


def test_queued_and_give_up_are_stamped_just_below_the_whole_acceptance_second() -> None:
    """Write timestamps are integer microseconds; the acceptance second is truncated."""
    second = int(ACCEPTED.timestamp())
    assert precedence.queued_stamp(BATCH) == second * 1_000_000 - 1000
    assert precedence.give_up_stamp(BATCH) == second * 1_000_000 - 500


def test_provider_evidence_from_behind_our_clock_is_stamped_at_the_acceptance_second() -> None:
    behind = precedence.provider_stamp(BATCH, ACCEPTED - timedelta(minutes=5), 3)
    assert behind == int(ACCEPTED.timestamp()) * 1_000_000 + 3


def test_readers_see_the_reason_of_a_provider_outcome() -> None:
    row = {"state": "failed", "event": "bounced", "reason_detail": "550 no such user"}
    assert precedence.visible(row) == precedence.Visible("failed", "bounced", "550 no such user")


def test_a_queued_recipient_shows_its_latest_event() -> None:
    row = {"state": "queued", "event": "deferred"}
    assert precedence.visible(row) == precedence.Visible("queued", "deferred", None)
