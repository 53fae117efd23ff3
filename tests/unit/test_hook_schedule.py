"""What the webhook delivery worker does after each attempt (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import orjson

from services.hooks.schedule import (
    SETTLE,
    Next,
    after_attempt,
    in_order,
    low_water,
    may_try,
    occurred,
)

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


@dataclass(frozen=True)
class _Item:
    at: datetime
    body: bytes


def _item(queued: float, happened: float | None, kind: str = "recipient.sent") -> _Item:
    base = datetime(2026, 11, 26, 8, tzinfo=UTC)
    stamp = (base + timedelta(seconds=happened)).isoformat() if happened is not None else None
    body = orjson.dumps({"timestamp": stamp, "type": kind})
    return _Item(base + timedelta(seconds=queued), body)


def test_what_waits_goes_in_order_of_occurrence_once_the_window_passed() -> None:
    """A consumer's attempt queued after the provider's report of what followed it is still
    sent first; what was queued within the window waits for a later pass."""
    delivered = _item(0.0, happened=2.5, kind="recipient.delivered")
    attempt = _item(0.3, happened=1.0, kind="recipient.attempt")
    fresh = _item(9.5, happened=9.0)
    now = datetime(2026, 11, 26, 8, tzinfo=UTC) + timedelta(seconds=10)

    ready, held = in_order([delivered, attempt, fresh], now, timedelta(seconds=2))

    assert ready == [attempt, delivered]
    assert held == [fresh]


def test_an_event_without_a_time_of_its_own_is_placed_by_when_it_was_queued() -> None:
    odd = _Item(datetime(2026, 11, 26, 8, tzinfo=UTC), b"not json")

    assert occurred(odd)[0] == odd.at.isoformat()[:19]


def test_within_a_second_the_stage_orders_events_stamped_to_the_second_and_finer() -> None:
    """SendGrid's "sent" at 12:00:05 and our attempt at 12:00:05.3: the attempt first."""
    now = datetime(2026, 11, 26, 8, tzinfo=UTC) + timedelta(seconds=10)
    sent = _item(0.0, happened=5.0, kind="recipient.sent")
    delivered = _item(0.1, happened=5.0, kind="recipient.delivered")
    attempt = _item(0.2, happened=5.3, kind="recipient.attempt")

    ready, _ = in_order([delivered, sent, attempt], now, timedelta(seconds=2))

    assert ready == [attempt, sent, delivered]


def test_a_failover_within_one_second_is_told_in_the_order_it_happened() -> None:
    """SendGrid refused at 12:00:05.2 and Mailgun accepted at 12:00:05.7: the refusal, the
    hand-over, then Mailgun's attempt (the stage alone put both attempts first)."""
    now = datetime(2026, 11, 26, 8, tzinfo=UTC) + timedelta(seconds=10)
    refused = _item(0.0, happened=5.2, kind="recipient.attempt")
    over = _item(0.0, happened=5.2, kind="recipient.failed_over")
    accepted = _item(0.0, happened=5.7, kind="recipient.attempt")
    sent = _item(0.0, happened=5.0, kind="recipient.sent")

    ready, _ = in_order([accepted, sent, over, refused], now, timedelta(seconds=2))

    assert ready == [refused, over, accepted, sent]
