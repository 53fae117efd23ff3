"""When to try a user's webhook endpoint again, and when to give up on it (pure).

A delivery that is not answered 2xx within the timeout is retried after each of
:data:`DELAYS` in turn (about a day in all, through delay queues), then recorded as failed.
An endpoint is disabled once it has failed continuously for ``disable_after`` and at least
``min_failures`` deliveries in a row (one slow night does not disable it; a dead endpoint
does not take retries forever); the user is told on the dashboard and by mail, and can enable
it again and replay what failed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

#: Seconds before each retry: 5 s, 30 s, 2 min, 10 min, 30 min, 1 h, 2 h, 4 h, 8 h, 8 h.
DELAYS: Final = (5, 30, 120, 600, 1800, 3600, 7200, 14400, 28800, 28800)


def next_delay(failed_attempts: int) -> int | None:
    """Seconds to wait after the ``failed_attempts``-th failed attempt (1-based); None when
    the delivery has used every retry."""
    if failed_attempts < 1 or failed_attempts > len(DELAYS):
        return None
    return DELAYS[failed_attempts - 1]


def answered(status: int | None) -> bool:
    """Whether an attempt succeeded: a 2xx (redirects are not followed: a moved endpoint
    is the user's to update)."""
    return status is not None and 200 <= status < 300


@dataclass(frozen=True, slots=True)
class Health:
    """An endpoint's run of failures."""

    failing_since: datetime | None = None
    failures: int = 0


def after(health: Health, ok: bool, now: datetime) -> Health:
    """The run after an attempt: a success ends it."""
    if ok:
        return Health()
    return Health(health.failing_since or now, health.failures + 1)


def should_disable(
    health: Health,
    now: datetime,
    *,
    disable_after: timedelta = timedelta(days=1),
    min_failures: int = 20,
) -> bool:
    return (
        health.failing_since is not None
        and now - health.failing_since >= disable_after
        and health.failures >= min_failures
    )
