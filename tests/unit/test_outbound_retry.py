"""Retries of users' webhook deliveries and disabling dead endpoints
(``shared.outbound.outbound_retry``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from shared.outbound.outbound_retry import (
    DELAYS,
    Health,
    after,
    answered,
    next_delay,
    should_disable,
)

T0 = datetime(2026, 11, 26, tzinfo=UTC)


def test_retries_last_about_a_day_then_stop() -> None:
    waits = [next_delay(n) for n in range(1, len(DELAYS) + 2)]

    assert waits[:3] == [5, 30, 120] and waits[-1] is None
    assert timedelta(hours=22) < timedelta(seconds=sum(DELAYS)) < timedelta(hours=26)
    assert next_delay(0) is None


def test_only_a_2xx_is_an_answer() -> None:
    assert [answered(s) for s in (200, 204, 299, 301, 404, 500, None)] == [
        True, True, True, False, False, False, False,
    ]  # fmt: skip


def test_a_success_ends_a_run_of_failures() -> None:
    failing = after(after(Health(), False, T0), False, T0 + timedelta(minutes=5))

    assert failing == Health(T0, 2)
    assert after(failing, True, T0 + timedelta(hours=1)) == Health()


def test_an_endpoint_is_disabled_only_after_long_and_many_failures() -> None:
    run = Health(T0, 20)

    assert should_disable(run, T0 + timedelta(days=1))
    assert not should_disable(run, T0 + timedelta(hours=23))
    assert not should_disable(Health(T0, 19), T0 + timedelta(days=2))
    assert not should_disable(Health(), T0 + timedelta(days=2))
