"""Scheduling and priority lanes (``shared.core.lanes``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from shared.core.lanes import ScheduleError, bucket_of, lane, send_at

NOW = datetime(2026, 11, 26, 9, 0, 30, tzinfo=UTC)
HORIZON = timedelta(days=30)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("2026-11-26T10:00:00Z", datetime(2026, 11, 26, 10, tzinfo=UTC)),
        ("2026-11-26T11:00:00+01:00", datetime(2026, 11, 26, 10, tzinfo=UTC)),
        ("2026-11-26t10:00:00.5z", datetime(2026, 11, 26, 10, 0, 0, 500000, tzinfo=UTC)),
        ("2026-11-26T08:58:00Z", None),  # a little in the past: now
    ],
)
def test_send_at_is_a_utc_time_or_now(value: str | None, expected: datetime | None) -> None:
    assert send_at(value, NOW, HORIZON) == expected


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("2026-11-26T10:00:00", "time zone"),
        ("2026-11-26", "RFC 3339"),
        ("tomorrow at nine o'clock please", "RFC 3339"),
        (1764147600, "RFC 3339"),
        ("2026-11-26T08:00:00Z", "in the past"),
        ("2027-01-26T08:00:00Z", "more than 30 days ahead"),
        ("2026-13-26T10:00:00Z", "RFC 3339"),
    ],
)
def test_a_send_at_that_cannot_be_honoured_says_why(value: object, problem: str) -> None:
    with pytest.raises(ScheduleError, match=problem):
        send_at(value, NOW, HORIZON)


@pytest.mark.parametrize(
    ("requested", "recipients", "expected"),
    [
        (None, 1, "transactional"),
        (None, 100, "transactional"),
        (None, 101, "bulk"),
        ("transactional", 50_000, "transactional"),
        ("bulk", 1, "bulk"),
    ],
)
def test_the_lane_is_asked_for_or_follows_the_size(
    requested: str | None, recipients: int, expected: str
) -> None:
    assert lane(requested, recipients, threshold=100) == expected


def test_an_unknown_lane_is_refused() -> None:
    with pytest.raises(ScheduleError, match="transactional or bulk"):
        lane("urgent", 1, threshold=100)


def test_a_schedule_waits_in_its_minute() -> None:
    assert bucket_of(datetime(2026, 11, 26, 10, 0, 59, 999, tzinfo=UTC)) == datetime(
        2026, 11, 26, 10, tzinfo=UTC
    )
