"""When and in which lane a batch goes (pure): ``send_at`` scheduling and priority lanes.

* ``send_at`` is an RFC 3339 time with an offset, up to the configured horizon ahead; a time
  a little in the past (clock skew, a retried request) means now, one further back is an
  error, as is one past the horizon. Scheduled batches wait in time buckets of
  :data:`BUCKET` (:func:`bucket_of`), read by a leased scheduler once their bucket is due.
* ``priority`` is ``transactional`` or ``bulk``; unset, a batch of up to the threshold's
  recipients is transactional and a larger one bulk. Each lane has queues of its own per
  provider, so a draining newsletter never waits in front of a password reset.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Final, Literal, get_args

Priority = Literal["transactional", "bulk"]
PRIORITIES: Final[tuple[Priority, ...]] = get_args(Priority)
#: How far in the past a ``send_at`` may be and still mean "now".
PAST_GRACE: Final = timedelta(minutes=5)
#: The width of a schedule's time buckets.
BUCKET: Final = timedelta(minutes=1)


class ScheduleError(ValueError):
    """A ``send_at`` or ``priority`` that cannot be honoured; the message says why."""


def send_at(value: object, now: datetime, horizon: timedelta) -> datetime | None:
    """The UTC time a batch is to go at; None for "now" (absent, or barely past)."""
    if value is None:
        return None
    if not isinstance(value, str) or not 19 <= len(value) <= 40 or "T" not in value.upper():
        raise ScheduleError("must be an RFC 3339 time such as 2026-12-01T09:00:00Z")
    try:
        when = datetime.fromisoformat(value.upper().replace("Z", "+00:00"))
    except ValueError:
        raise ScheduleError("must be an RFC 3339 time such as 2026-12-01T09:00:00Z") from None
    if when.tzinfo is None:
        raise ScheduleError("needs a time zone offset (Z or +01:00)")
    when = when.astimezone(UTC)
    if when < now - PAST_GRACE:
        raise ScheduleError(f"is in the past ({when.isoformat()}); leave it out to send now")
    if when > now + horizon:
        raise ScheduleError(f"is more than {_days(horizon)} ahead")
    return None if when <= now else when


def lane(requested: object, recipients: int, threshold: int) -> Priority:
    """The lane of a batch: the one it asks for, else by its size."""
    if requested is None:
        return "transactional" if recipients <= threshold else "bulk"
    if requested not in PRIORITIES:
        raise ScheduleError("must be transactional or bulk")
    return requested


def bucket_of(when: datetime) -> datetime:
    """The start of the time bucket a batch scheduled for ``when`` waits in."""
    utc = when.astimezone(UTC)
    return utc - (utc - datetime.min.replace(tzinfo=UTC)) % BUCKET


def _days(span: timedelta) -> str:
    days = span.total_seconds() / 86_400
    return f"{days:g} days" if days != 1 else "1 day"
