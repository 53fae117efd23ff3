"""The recipient state machine, re-send routing and stats bucketing (pure)."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, timedelta

import pytest

from services.webhooks.transitions import Effects, effects, write_timestamp
from shared.reconcile import expected_marks
from shared.resend import next_provider
from shared.stats import is_closed, zero_filled
from shared.webhook_events import Kind, ProviderEvent
from tests.unit.webhooks.fixtures import provider_event

T0 = datetime(2026, 11, 20, 12, 0, 0, tzinfo=UTC)


def ev(
    kind: Kind,
    *,
    at: datetime = T0,
    provider_side: bool = False,
    suppress: bool = False,
    provider: str = "sg",
) -> ProviderEvent:
    return provider_event(
        kind, provider=provider, at=at, provider_side=provider_side, suppress=suppress
    )


def test_delivered_settles_success_and_counts_it() -> None:
    """Delivery is an outcome: success, counted once per recipient."""
    e = effects(ev("delivered"))
    assert (e.event, e.state, e.metrics) == ("delivered", "success", ("success",))


def test_hard_bounce_is_final_and_suppresses() -> None:
    """A bounce fails the recipient, counts failed and bounced, and never re-sends."""
    e = effects(ev("bounced"))
    assert (e.state, e.metrics, e.suppress, e.resend) == (
        "failed",
        ("failed", "bounced"),
        True,
        False,
    )


def test_provider_side_drop_resends_without_an_outcome() -> None:
    """The provider's own drop leaves the recipient queued and re-sends it elsewhere."""
    e = effects(ev("dropped", provider_side=True))
    assert (e.state, e.metrics, e.resend) == (None, (), True)


def test_recipient_side_drop_is_final() -> None:
    """A drop because the address is on the provider's bounce list is a final failure."""
    e = effects(ev("dropped", suppress=True))
    assert (e.state, e.resend, e.suppress) == ("failed", False, True)


def test_engagement_never_changes_the_outcome() -> None:
    """Opens and clicks are counted but leave the event and state columns alone."""
    for kind in ("opened", "clicked"):
        e = effects(ev(kind))
        assert (e.event, e.state, e.metrics) == (None, None, (kind,))


def test_complaint_counts_and_suppresses_but_keeps_delivery() -> None:
    """A complaint after delivery is recorded and suppresses; the mail was delivered."""
    e = effects(ev("complained"))
    assert (e.event, e.state, e.metrics, e.suppress) == ("complained", None, ("complained",), True)


def test_deferral_past_the_deadline_resends() -> None:
    """A recipient deferred for longer than the deadline is handed to another provider."""
    late = ev("deferred", at=T0 + timedelta(hours=5))
    assert effects(late, deferred_since=T0, deadline=4 * 3600).resend
    assert not effects(ev("deferred"), deferred_since=T0, deadline=4 * 3600).resend


def test_unknown_events_only_reach_the_timeline() -> None:
    """Unknown kinds are recorded without touching state or stats."""
    assert effects(ev("unknown")) == Effects(None, None)


def test_same_second_later_stage_wins() -> None:
    """Within one second, delivered outranks processed, whatever the arrival order."""
    assert write_timestamp(ev("delivered")) > write_timestamp(ev("sent"))
    assert write_timestamp(ev("sent", at=T0 + timedelta(seconds=1))) > write_timestamp(
        ev("delivered")
    )


@pytest.mark.parametrize(
    ("tried", "failed", "expected"),
    [
        ({}, "sg", "mg"),
        ({"mg": "failed: 500"}, "sg", None),
        ({}, "mg", "sg"),
        ({"sg": "dropped: spam"}, "mg", None),
        ({"sg": "sent"}, "mg", "sg"),
    ],
)
def test_next_provider_skips_those_that_failed(
    tried: dict[str, str], failed: str, expected: str | None
) -> None:
    """A re-send goes to the next provider that has not already failed this recipient."""
    assert next_provider(("sg", "mg"), tried, failed) == expected


def test_stats_are_zero_filled_per_day() -> None:
    """Every day of the range has a row, with zeros where nothing happened."""
    rows = zero_filled(date(2026, 1, 1), date(2026, 1, 3), {date(2026, 1, 2): {"success": 4}})
    assert [r["date"] for r in rows] == ["2026-01-01", "2026-01-02", "2026-01-03"]
    assert rows[1]["success"] == 4 and rows[0]["success"] == 0 and rows[2]["queued"] == 0


def test_a_day_closes_hours_after_midnight() -> None:
    """Rollups are only written for days that can no longer change much."""
    d = date(2026, 1, 1)
    assert not is_closed(d, datetime(2026, 1, 2, 1, tzinfo=UTC))
    assert is_closed(d, datetime(2026, 1, 2, 7, tzinfo=UTC))


def test_expected_marks_follow_the_logs() -> None:
    """Reconcile derives queued, success, failed and bounced marks from rows and events."""
    a, b = uuid.uuid4(), uuid.uuid4()
    day = T0.date()
    rows = [
        {"log_id": a, "state": "success", "last_update": T0},
        {"log_id": b, "state": "failed", "last_update": T0},
    ]
    events = {a: [{"kind": "delivered", "at": T0}], b: [{"kind": "bounced", "at": T0}]}

    marks = expected_marks(day, day, rows, events)

    assert marks["queued"] == {str(a), str(b)}
    assert marks["success"] == {str(a)}
    assert marks["failed"] == marks["bounced"] == {str(b)}


def test_provider_side_drop_loses_to_the_resends_delivery_in_the_same_second() -> None:
    """A re-sent recipient delivered within the drop's second shows delivered, not dropped."""
    dropped = ev("dropped", provider_side=True)
    delivered = ev("delivered", provider="mg")

    assert write_timestamp(delivered) > write_timestamp(dropped)
