"""Work that one process of many does at a time: a lease in Cassandra (the rows of
``shared.delivery.schedule_store``'s ``scheduler_state``, one per name), renewed a third of the way
through so that a holder that stalls past the rest loses it, and the loop that runs a pass
after pass, releasing the lease on the way out.

Between passes the loop waits on an :class:`Alarm`: until the pass's own next due time (the
lease's renewal at the latest, for its holder) or a nudge, whichever comes first. Nudges
travel as wake-ups on the settings fanout exchange (:func:`wake`, :func:`woken`): a process
that changes what a loop works on (the API scheduling a batch) wakes every process's loop
of that name, so an idle loop need not poll to be on time. A loop whose work is written by
every process (the outbox relay, the stats roll-up, the health refresh) waits on a
:class:`Linger` instead: busy for a while after each wake-up it hears, idle otherwise."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import orjson

from shared.core.errors import DependencyUnavailable
from shared.infra import waits

log = logging.getLogger(__name__)

#: The wake-up of the scheduled batches' scheduler (sent by the API, heard by consumers).
SCHEDULER_WAKE = "scheduler"
#: The wake-up of the campaign runner (sent and heard by the API processes).
CAMPAIGNS_WAKE = "campaigns"
#: The wake-up of the outbox relays (sent by every process that writes an outbox row).
OUTBOX_WAKE = "outbox"
#: The wake-up of the stats roll-up (sent by every process that marks a bucket changed).
STATS_WAKE = "stats"
#: The wake-up of the consumers' provider-health refresh (sent by every process that adds to
#: the shared health windows: consumers with their calls, webhooks with their reports).
HEALTH_WAKE = "health"


class LeaseRows(Protocol):
    async def take_lease(
        self, owner: uuid.UUID, seconds: int, *, renewing: bool = False
    ) -> bool: ...

    async def release_lease(self, owner: uuid.UUID) -> None: ...


@dataclass
class Lease:
    rows: LeaseRows
    seconds: int
    owner: uuid.UUID = field(default_factory=uuid.uuid4)
    _renew_at: float = 0.0
    clock: Callable[[], float] = time.monotonic
    """Monotonic seconds (tests move it)."""

    async def held(self) -> bool:
        """Whether this process holds the lease (taken or renewed when due)."""
        if self.clock() < self._renew_at:
            return True
        renewing = self._renew_at > 0  # held at the last ask: renew first, one transaction
        if not await self.rows.take_lease(self.owner, self.seconds, renewing=renewing):
            self._renew_at = 0.0
            return False
        self._renew_at = self.clock() + self.seconds / 3
        return True

    def renew_in(self) -> float:
        """Seconds until the lease is due for renewal (0: now, or not held)."""
        return max(0.0, self._renew_at - self.clock())

    def lost(self) -> None:
        """A conditional write under the lease failed: ask for it again next time."""
        self._renew_at = 0.0

    async def release(self) -> None:
        try:
            await asyncio.shield(self.rows.release_lease(self.owner))
        except DependencyUnavailable:
            log.warning("a lease was not released; it lapses by itself")


@dataclass
class Alarm:
    """What an idle loop waits on: a nudge, or the time it asked for."""

    _rung: asyncio.Event = field(default_factory=asyncio.Event)

    def nudge(self) -> None:
        """Work may be waiting: end the current (or the next) wait now."""
        self._rung.set()

    async def wait(self, seconds: float) -> bool:
        """Wait ``seconds`` or until nudged; whether it was a nudge (then consumed)."""
        # shared.infra.waits: a cancellation arriving as a nudge ends the wait must end the loop.
        nudged = await waits.set_within(self._rung, seconds)
        self._rung.clear()
        return nudged


def next_period(
    now: float, awake_until: float, *, busy: bool, busy_every: float, idle_every: float
) -> float:
    """Seconds until a lingering loop's next pass (pure): ``busy_every`` while it has work or
    a wake-up is recent (``now`` before ``awake_until``), else ``idle_every`` (never less
    than ``busy_every``)."""
    return busy_every if busy or now < awake_until else max(idle_every, busy_every)


@dataclass
class Linger:
    """How a loop whose work is announced by wake-ups waits between passes: every
    ``busy_every`` seconds while it has work or a wake-up it heard is recent, otherwise
    ``idle_every`` or until a wake-up. A wake-up ends only an idle wait: a busy one is not cut
    short, so busy passes stay ``busy_every`` apart however many wake-ups come."""

    busy_every: float
    idle_every: float
    clock: Callable[[], float] = time.monotonic
    """Monotonic seconds (tests move it)."""
    alarm: Alarm = field(default_factory=Alarm)
    awake_until: float = 0.0
    """Until when wake-ups heard keep the passes busy."""
    idle: bool = False
    """Whether the loop waits as idle (a wake-up then ends the wait at once)."""

    def stay_awake(self, seconds: float) -> None:
        """A wake-up: busy passes for ``seconds`` from now at least (a later deadline already
        set stands), and an idle wait ends now."""
        self.awake_until = max(self.awake_until, self.clock() + seconds)
        self.nudge_if_idle()

    def nudge_if_idle(self) -> None:
        """Work is waiting: end the wait now if it is idle (a busy one ends on time)."""
        if self.idle:
            self.alarm.nudge()

    def next_in(self, *, busy: bool) -> float:
        """Seconds until the next pass (see :func:`next_period`)."""
        return next_period(
            self.clock(),
            self.awake_until,
            busy=busy,
            busy_every=self.busy_every,
            idle_every=self.idle_every,
        )

    async def wait(self, *, busy: bool) -> bool:
        """Wait :meth:`next_in` seconds, idle (ended by a wake-up) when that is longer than
        ``busy_every``; whether a nudge ended it."""
        seconds = self.next_in(busy=busy)
        self.idle = seconds > self.busy_every
        try:
            return await self.alarm.wait(seconds)
        finally:
            self.idle = False


async def keep_running(
    step: Callable[[], Awaitable[object]],
    every: float,
    lease: Lease,
    what: str,
    *,
    alarm: Alarm | None = None,
    next_in: Callable[[], float] | None = None,
) -> None:
    """``step()`` again and again until cancelled (an outage or a failure stops a pass, not
    the loop), waiting ``next_in()`` seconds between passes (``every`` when a pass failed,
    or without ``next_in``), or until ``alarm`` is nudged; the lease is released on the
    way out."""
    alarm = alarm or Alarm()
    try:
        while True:
            wait = every
            try:
                await step()
                wait = next_in() if next_in is not None else every
            except DependencyUnavailable as exc:
                log.warning("%s pass stopped: %s", what, exc)
            except Exception:
                # A bug in one pass must not end the loop: work left to it (scheduled
                # batches, campaigns) would wait forever without a sign.
                log.exception("%s pass failed", what)
            await alarm.wait(wait)
    finally:
        await lease.release()


@dataclass
class LeasedLoop:
    """A loop that one process of many runs at a time: ``step`` pass after pass under
    ``lease`` (:func:`keep_running`), waiting ``next_in()`` seconds between passes (its
    owner's own timing) or until a wake-up named ``wake`` rings its alarm."""

    what: str
    """Names the loop in its logs."""
    wake: str
    """The wake-ups it hears (:func:`wake`)."""
    lease: Lease
    every: float
    """Seconds to the next pass after one that failed."""
    step: Callable[[], Awaitable[object]]
    next_in: Callable[[], float]
    alarm: Alarm = field(default_factory=Alarm)
    announcer: Announcer | None = None
    """Where its wake-up is sent once it stops, so another process's loop takes the lease at
    once instead of at its next ask."""

    async def run(self) -> None:
        """Pass after pass until cancelled; the lease is released on the way out, and the
        other processes' loops woken (with an ``announcer``)."""
        try:
            await keep_running(
                self.step,
                self.every,
                self.lease,
                self.what,
                alarm=self.alarm,
                next_in=self.next_in,
            )
        finally:
            if self.announcer is not None:
                await wake(self.announcer, self.wake)

    def heard(self, body: bytes) -> None:
        """An announcement: a wake-up of this loop's name rings its alarm."""
        if woken(body) == self.wake:
            self.alarm.nudge()


class Announcer(Protocol):
    async def announce(self, body: bytes) -> None: ...


async def wake(broker: Announcer, name: str) -> None:
    """Nudge the loop ``name`` of every process (a lost nudge costs that loop's own next due
    time, at worst: no caller may wait for it)."""
    try:
        await broker.announce(orjson.dumps({"wake": name}))
    except DependencyUnavailable as exc:
        log.warning("%s not woken: %s", name, exc)


@dataclass
class Notice:
    """Tells every process's loop ``name`` that this process writes what the loop works on:
    a wake-up at the first write and at most one per ``every`` seconds after it, so a
    listener that stays awake ``every`` seconds past each wake-up it hears misses no write
    (a process that writes nothing sends nothing)."""

    broker: Announcer
    name: str
    every: float
    _sent_at: float = float("-inf")
    _sending: set[asyncio.Task[None]] = field(default_factory=set)

    def touch(self) -> None:
        """A write is about to be made (synchronous: called where statements are built)."""
        now = time.monotonic()
        if now - self._sent_at < self.every:
            return
        self._sent_at = now
        task = asyncio.get_running_loop().create_task(wake(self.broker, self.name))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)


def woken(body: bytes) -> str | None:
    """The loop an announcement wakes, or None when it is not a wake-up (a settings change)."""
    try:
        decoded = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    name = decoded.get("wake") if isinstance(decoded, dict) else None
    return name if isinstance(name, str) else None
