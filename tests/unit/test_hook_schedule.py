"""What the webhook delivery worker does after each attempt (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from services.hooks.schedule import SETTLE, Next, after_attempt, low_water, may_try

DELAYS = (5, 30, 120)
NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


def test_a_delivered_event_is_done_and_the_next_goes_now() -> None:
    """A 2xx ends the event and resets the head's attempts."""
    assert after_attempt(True, 2, DELAYS) == Next(done=True, attempts=0, retry_in=None)


def test_the_first_failure_waits_the_first_delay() -> None:
    """The event stays at the head, counted once, retried after DELAYS[0]."""
    assert after_attempt(False, 0, DELAYS) == Next(done=False, attempts=1, retry_in=5)


def test_each_failure_waits_the_next_delay() -> None:
    """The n-th failure waits the n-th delay."""
    assert after_attempt(False, 2, DELAYS) == Next(done=False, attempts=3, retry_in=120)


def test_after_the_last_delay_the_event_is_given_up() -> None:
    """Out of retries: the event leaves the queue, and the endpoint still waits."""
    step = after_attempt(False, 3, DELAYS)

    assert step == Next(done=True, attempts=0, retry_in=120, gave_up=True)


def test_the_low_water_mark_stays_at_the_oldest_waiting_event() -> None:
    """A waiting event is read again on the next pass."""
    oldest = NOW - timedelta(hours=2)

    assert low_water(oldest, NOW) == oldest


def test_the_low_water_mark_lags_by_the_settle_time() -> None:
    """With nothing waiting, recent events are still read again (a late write lands)."""
    assert low_water(None, NOW) == NOW - SETTLE
    assert low_water(NOW - timedelta(seconds=1), NOW) == NOW - SETTLE


def test_a_failing_endpoint_waits_until_its_next_try() -> None:
    """Before ``next_try`` (less a second of slack) nothing is sent."""
    assert may_try(None, NOW)
    assert not may_try(NOW + timedelta(seconds=5), NOW)
    assert may_try(NOW + timedelta(milliseconds=500), NOW)
