"""What the delivery worker does after each attempt (pure): mark the event done, retry it
later, or give up on it; how far its low-water mark may move; and in which order it sends
what waits (by occurrence, once every emitter has had the order window to queue its own:
a consumer's attempt and the provider's delivery report reach the queue from two processes,
not always in the order they happened)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final, Protocol, TypeVar

import orjson

#: Events queued this recently are read again on the next pass even when delivered: a write
#: that started before a pass may land after it (an emit's logged batch), and must not be
#: passed over.
SETTLE: Final = timedelta(seconds=30)


@dataclass(frozen=True, slots=True)
class Next:
    """After an attempt at the endpoint's oldest waiting event."""

    done: bool
    """The event leaves the queue (delivered, or out of retries)."""
    attempts: int
    """Failed attempts of the event that is now at the head."""
    retry_in: int | None
    """Seconds before the endpoint is tried again; None: go on with the next event now."""
    gave_up: bool = False


class Queued(Protocol):
    @property
    def at(self) -> datetime: ...

    @property
    def body(self) -> bytes: ...


#: Within one second, the stage each event type stands for: providers stamp their events in
#: whole seconds, our attempts to the microsecond, so the second and then the stage order
#: them ("accepted" before "sent" before "delivered", however they were stamped).
STAGE: Final = {
    "recipient.attempt": 0,
    "recipient.failed_over": 1,
    "recipient.sent": 2,
    "recipient.deferred": 3,
    "recipient.delivered": 4,
    "recipient.opened": 5,
    "recipient.clicked": 6,
    "recipient.dropped": 7,
    "recipient.bounced": 8,
    "recipient.unsubscribed": 9,
    "recipient.complained": 10,
}

#: Events we stamp ourselves, to the microsecond: among them the stamp orders, not the stage
#: (SendGrid refused, failed over to Mailgun, Mailgun accepted, all in one second, is
#: attempt, failed_over, attempt; the stage alone would put both attempts first).
OURS: Final = frozenset({"recipient.attempt", "recipient.failed_over"})


#: When an event happened, as the worker sorts it: (second, group, exact stamp, stage).
Occurrence = tuple[str, int, str, int]


def occurred(item: Queued) -> Occurrence:
    """When the event happened, to the second (its payload's ``timestamp``, ISO 8601 in UTC,
    sortable as text; when it was queued if the payload has none), then its stage, our own
    events sharing the first and ordered by their exact stamp."""
    try:
        data = orjson.loads(item.body)
        stamp, kind = data.get("timestamp"), data.get("type")
    except (orjson.JSONDecodeError, AttributeError):
        stamp, kind = None, None
    text = stamp if isinstance(stamp, str) else item.at.isoformat()
    stage = STAGE.get(kind, len(STAGE)) if isinstance(kind, str) else len(STAGE)
    group = 0 if kind in OURS else stage
    return text[:19], group, text, stage


T = TypeVar("T", bound=Queued)


def in_order(items: Sequence[T], now: datetime, window: timedelta) -> tuple[list[T], list[T]]:
    """(what to send now, by occurrence then queue order; what waits: queued less than
    ``window`` ago, so an event that happened earlier may still be on its way)."""
    ready = [i for i in items if now - i.at >= window]
    held = [i for i in items if now - i.at < window]
    ready.sort(key=lambda i: (occurred(i), i.at))
    return ready, held


def after_attempt(ok: bool, failed_before: int, delays: Sequence[int]) -> Next:
    """``ok``: the attempt was answered 2xx. ``failed_before``: the event's failed attempts
    until now. A failure waits ``delays[n-1]`` after the n-th; after the last the event is
    given up (it stays in the log, for replay) and the next waits the last delay too."""
    if ok:
        return Next(done=True, attempts=0, retry_in=None)
    failed = failed_before + 1
    if failed <= len(delays):
        return Next(done=False, attempts=failed, retry_in=delays[failed - 1])
    return Next(done=True, attempts=0, retry_in=delays[-1], gave_up=True)


def low_water(oldest_waiting: datetime | None, now: datetime) -> datetime:
    """Where the next pass starts reading: the oldest event still waiting, and never later
    than :data:`SETTLE` ago."""
    settled = now - SETTLE
    return settled if oldest_waiting is None else min(oldest_waiting, settled)


def may_try(next_try: datetime | None, now: datetime) -> bool:
    """Whether a failing endpoint's wait is over (a second early counts: delay queues are
    not exact)."""
    return next_try is None or now >= next_try - timedelta(seconds=1)
