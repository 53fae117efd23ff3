"""Pure rate-limit and quota arithmetic: windows, their days, Retry-After, session expiry."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, timedelta

from services.api import session_store as sessions
from shared.accounts import apikeys, ratelimit
from shared.accounts.ratelimit import RatePolicy


def test_window_is_burst_over_rate() -> None:
    """100 requests at 50/s make a 2-second window."""
    assert RatePolicy(per_second=50, burst=100).window_ms == 2000


def test_window_never_shorter_than_the_minimum() -> None:
    """A tiny burst at a high rate is clamped to the minimum window."""
    assert RatePolicy(per_second=10_000, burst=1).window_ms == ratelimit.MIN_WINDOW_MS


def test_windows_are_epoch_aligned() -> None:
    """Times in the same window share an index; the next window starts at its boundary."""
    assert ratelimit.window_index(4_000, 2_000) == ratelimit.window_index(5_999, 2_000)
    assert ratelimit.window_index(6_000, 2_000) == ratelimit.window_index(4_000, 2_000) + 1


def test_window_day_is_the_utc_day_of_its_start() -> None:
    """A window's counter lives in the partition of the UTC day it starts on."""
    start = datetime(2025, 3, 1, 23, 59, 59, tzinfo=UTC)
    index = ratelimit.window_index(int(start.timestamp() * 1000), 1000)

    assert ratelimit.window_day(index, 1000) == date(2025, 3, 1)


def test_retry_after_rounds_up_to_the_window_end() -> None:
    """0.5 s before the window ends, Retry-After is 1; 1.5 s before, 2."""
    assert ratelimit.window_retry_after(9_500, 10_000) == 1
    assert ratelimit.window_retry_after(8_500, 10_000) == 2


def test_retry_after_is_at_least_one_second() -> None:
    """Retry-After is never 0, even at a window's last millisecond."""
    assert ratelimit.window_retry_after(999, 1000) == 1


def test_a_users_session_counter_is_one_per_user_and_never_a_keys() -> None:
    """Every session of a user counts in one bucket, which no API key id can name."""
    ann, bob = uuid.UUID(int=1), uuid.UUID(int=2)
    key_id = apikeys.parse(apikeys.generate().plaintext)

    assert ratelimit.user_bucket(ann) == ratelimit.user_bucket(uuid.UUID(str(ann)))
    assert ratelimit.user_bucket(ann) != ratelimit.user_bucket(bob)
    assert key_id is not None and ":" not in key_id[0] and ":" in ratelimit.user_bucket(ann)


def test_increment_then_check_admits_exactly_the_limit() -> None:
    """The counter value seen after the increment may equal the limit but not pass it."""
    assert not ratelimit.over_limit(5, 5)
    assert ratelimit.over_limit(6, 5)


def test_quota_resets_at_utc_midnight() -> None:
    """At 23:00 UTC the quota comes back in an hour."""
    assert ratelimit.seconds_until_midnight(datetime(2025, 3, 1, 23, 0, tzinfo=UTC)) == 3600


def test_session_expiry_slides_but_never_passes_the_max_age() -> None:
    """Use extends a session by the idle time, but not beyond its absolute lifetime."""
    created = datetime(2025, 1, 1, tzinfo=UTC)

    early = sessions.expiry(created, created + timedelta(days=1), idle_ttl=86_400, max_age=864_000)
    late = sessions.expiry(created, created + timedelta(days=9.5), idle_ttl=86_400, max_age=864_000)

    assert early == created + timedelta(days=2)
    assert late == created + timedelta(days=10)


def test_session_row_ttl_outlasts_the_session() -> None:
    """A row's TTL covers its remaining life rounded up, plus Cassandra's whole-second slack."""
    now = datetime(2025, 1, 1, tzinfo=UTC)

    assert sessions.ttl_seconds(now + timedelta(seconds=1.2), now) == 3
    assert sessions.ttl_seconds(now, now) == 2
