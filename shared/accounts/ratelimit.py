"""Per-key (and per dashboard user) request rate limits and per-user daily recipient quotas,
shared by all API processes.

Why fixed windows on Cassandra counters (and not a token bucket)
----------------------------------------------------------------
A true token bucket shared between processes needs read-modify-write under a lock, which in
Cassandra means a lightweight transaction (four Paxos round trips, contended by every request
of a busy key) on the acceptance hot path. Counters give the same guarantee for one counter
update plus one read:

* **Requests.** A key may make ``burst`` requests per window of ``burst / rate`` seconds
  (windows aligned to the epoch), so the average is ``rate`` per second and no more than
  ``burst`` arrive within one window (at most twice that across a window edge, the usual
  fixed-window slack). Every slot is *added first, then read back*: a window's counter
  holds the slots every process has taken of it, and a slot is granted only when the total
  read back stays within ``burst``. Counter increments are atomic, so when additions race,
  the one that lands ``k``-th reads at least the ``k`` first: at most ``burst`` requests per
  window are ever admitted, however many processes serve the key. Slots taken over the limit
  stay counted (harmless: past ``burst`` the window is full either way), and a process that
  has seen a key's window full refuses the key's further requests in that window without
  asking Cassandra (``Retry-After``: until the window ends).
* **Slots leased, not a round trip per request** (:class:`RateLimiter`). A process takes a
  key's slots of a window a *lease* at a time (:meth:`RateWindows.take`: add, read back, two
  round trips) and grants the key's next requests in that window from memory. A lease is
  the request plus as many slots as the process served of the key in this window or the one
  before (so it doubles while a key is busy), at most :data:`RATE_LEASE_MOST` and a quarter
  of what the window has left, only the request within four of the burst
  (:func:`rate_lease_size`); it keeps what the read-back allows (:func:`kept_of`, as a quota
  lease). A lease belongs to its window: a request is granted only slots of the window it
  arrived in, and slots a process leaves unspent are never given back but expire with their
  window (no decrement to lose).

  *Leased ahead of need.* A busy key (:data:`BUSY`) takes its next lease in the background,
  so that its requests do not queue behind two round trips (except within four of the
  burst, where a lease is the request alone): when its unspent slots fall to
  the low-water mark (:func:`low_water`: a quarter of the last lease, or what the key spends
  in twice a lease's recent duration, at most that lease), and, from a request near its window's end
  (:func:`lead_ms`: the last tenth, or twice a lease's duration), a lease of the *next*
  window, held apart and granted only to requests stamped in that window. One lease per
  window is in flight at a time (the request path's or the background's, under the window's
  lock): a request that finds no slot waits for it, and if it failed or kept too little,
  leases for itself (a failure there answers 503). The limiter holds its background leases
  and :meth:`RateLimiter.close` cancels them at shutdown. A busy key's requests are still
  granted no faster than one lease (``1 + RATE_LEASE_MOST`` slots) per lease's round trips
  per process: past that they queue for slots, as they did for every lease before.

  *Overshoot: none, across any number of processes*, by the quota leases' argument below
  (a lease in the background is counted and kept by the same rule): every slot granted was
  counted before it was granted, and a lease is kept only as far as the total it read back
  (every lease before it) stays within ``burst``. *Undershoot*: a process may refuse a key
  while others hold slots of its window unspent (or lost to a lease that read the counter
  past the limit at the same time as another), at most two leases per process per (key,
  window): the one being spent and one taken ahead of need (a renewal at the low-water
  mark, or the window's lease taken before it began, unspent if the key went quiet), a
  lease being at most ``1 + min(RATE_LEASE_MOST, (burst - 1) // 4)`` slots and one more
  than that process served of the key in this window or the one before; the next window
  (``burst / rate`` seconds later, 2 s by default) starts afresh. *A process that dies*
  leaves its unspent slots counted until their window ends, so a crash loop grants nothing
  extra. A lease whose counter update times out stays counted if it landed (refusing early
  in that window, never admitting more): on the request path it answers 503; in the
  background it is logged and the window's next request leases for itself.
* **Recipients.** ``recipients`` per (user, UTC day) is incremented by a batch's accepted
  recipients, then read; above the quota the batch is refused and its increment taken back
  (so refused batches cost nothing). Take-backs never let the total pass the quota: an
  admitted batch read a value that already included every admitted batch before it. The
  quota is per user, so minting more keys does not buy more mail.
* **Refunds.** A batch that is not sent after all (cancelled, or its store failed) gives its
  recipients back as a row of ``quota_refunds`` keyed by the batch: a counter decrement
  cannot be repeated safely, a row can, so whoever finds the batch cancelled may refund it
  again and it still counts once. The day's use is the counter less its refunds; the
  refunds are read only when the counter alone is over the quota (the common case costs
  nothing more), and can only lower the use an admitted batch saw.

* **Leases, not a round trip per batch** (:class:`QuotaLedger`). Each API process charges
  batches against a *lease*: recipients it has already added to the day's counter, by the
  rule above, and not yet spent. A batch its lease covers costs no round trip; one it does
  not takes a new lease (:meth:`RecipientQuota.lease`: add, read back, and if over take back
  only the excess, all of it when what is left would not cover the batch) of the batch
  plus a share of what the counter says is left (:func:`lease_size`), shrinking to exactly
  the batch near the limit, so there a process charges synchronously, batch by batch.

  *Overshoot: none, across any number of processes.* Every accepted recipient was counted
  in Cassandra before its batch was accepted, and a lease is kept only as far as the total
  it read back (every lease and batch counted before it, less refunds) stays within the
  quota, so the argument for batches above holds for leases: order the additions as they
  land; the last lease kept read a total that included every kept lease before it in full
  and itself less the excess it gave back, hence at most the quota. (The issue allowed one
  batch per process; reading back before spending makes it zero.) *Undershoot*: a process
  may refuse while others hold unspent leases, at most ``LEASE_MOST`` recipients each per
  (user, day); each gives them back after ``LEASE_IDLE`` seconds unused and on shutdown
  (:meth:`QuotaLedger.reconcile`, every ``RECONCILE_INTERVAL``).

  *A process that dies* loses its unspent leases: they stay counted, so the day errs
  towards refusing (by at most ``LEASE_MOST`` per (user, day) per death), never towards
  sending; a crash loop grants nothing extra. A give-back is a counter decrement and is
  never retried (applied twice it would under-count); one that fails is forgotten, the same
  over-count.

Counter tables cannot carry a TTL, so both are partitioned by UTC day: :func:`purge_before`
drops whole past-day partitions (the clean-up to schedule daily; a partition holds at
most one row per window). Counter updates are not idempotent, so they are never retried by the
driver: a timeout surfaces as 503 and may over-count, never under-count.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Protocol

from shared.core.batch_ids import accepted_at
from shared.core.errors import DependencyUnavailable
from shared.infra.background import Background
from shared.infra.db import Database

log = logging.getLogger(__name__)

#: Shortest window we use; a burst below rate/10 is rounded up to it.
MIN_WINDOW_MS = 100


@dataclass(frozen=True, slots=True)
class RatePolicy:
    """``burst`` requests per window of ``burst / per_second`` seconds."""

    per_second: float
    burst: int

    @property
    def window_ms(self) -> int:
        return max(MIN_WINDOW_MS, round(self.burst * 1000 / self.per_second))


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether a request may proceed; if not, the whole seconds to wait (``Retry-After``)."""

    allowed: bool
    retry_after: int = 0


def window_index(now_ms: int, window_ms: int) -> int:
    """The epoch-aligned window that ``now_ms`` (milliseconds since the epoch) falls in."""
    return now_ms // window_ms


def window_day(index: int, window_ms: int) -> date:
    """The UTC day a window starts on: its counter's partition."""
    return datetime.fromtimestamp(index * window_ms / 1000, UTC).date()


def window_retry_after(now_ms: int, window_ms: int) -> int:
    """Whole seconds until the current window ends (at least 1, as ``Retry-After`` wants)."""
    end = (window_index(now_ms, window_ms) + 1) * window_ms
    return max(1, math.ceil((end - now_ms) / 1000))


def seconds_until_midnight(now: datetime) -> int:
    """Whole seconds until the next UTC day (when a daily quota starts afresh), at least 1."""
    now = now.astimezone(UTC)
    midnight = datetime.combine(now.date() + timedelta(days=1), datetime.min.time(), UTC)
    return max(1, math.ceil((midnight - now).total_seconds()))


def user_bucket(user_id: uuid.UUID) -> str:
    """The counter of a user's dashboard-session requests (``/send``, ``/api/*`` on a
    cookie): one per user, whichever session asks, beside their keys' own. Never a key id
    (12 base32 characters, no colon)."""
    return f"user:{user_id}"


def over_limit(count_after_increment: int, limit: int) -> bool:
    """Increment-then-check: a request is refused when the counter it saw exceeds the limit."""
    return count_after_increment > limit


#: Most recipients a lease holds beyond the batch that asked for it.
LEASE_MOST = 1000
#: Seconds a lease may sit unspent before its process gives the rest back.
LEASE_IDLE = 5.0
#: Seconds between a process's give-backs of idle (and past days') leases.
RECONCILE_INTERVAL = 1.0


@dataclass(frozen=True, slots=True)
class Grant:
    """A lease taken: the recipients kept (0: the batch is refused, nothing kept) and the
    day's use it read back (every process's leases and batches, less refunds)."""

    kept: int
    used: int


def lease_size(batch: int, seen_used: int, limit: int, most: int = LEASE_MOST) -> int:
    """The lease to ask for a batch of ``batch`` recipients when the day's use was last seen
    at ``seen_used``: the batch plus a quarter of what would be left after it, at most
    ``most`` more; only the batch within four batches of the limit (there a process charges
    synchronously, batch by batch)."""
    left = max(0, limit - seen_used - batch)
    if left < 4 * batch:
        return batch
    return batch + min(most, left // 4)


def kept_of(want: int, batch: int, used_after: int, limit: int) -> int:
    """What a lease of ``want`` keeps when the use read back after adding it is
    ``used_after``: all of it within the limit, less the excess above it, none when what is
    left would not cover the batch."""
    excess = used_after - limit
    if excess <= 0:
        return want
    return want - excess if want - excess >= batch else 0


def grant_of(want: int, batch: int, used_after: int, limit: int) -> Grant:
    """The grant of a lease of ``want`` whose read-back (refunds taken off) is
    ``used_after``: what :func:`kept_of` keeps, and the day's use once the rest
    (``want - kept``) is given back."""
    kept = kept_of(want, batch, used_after, limit)
    return Grant(kept, used_after - (want - kept))


#: Most slots a rate-limit lease holds beyond the request that took it.
RATE_LEASE_MOST = 100
#: Keys (and dashboard users) a process holds window state for before it forgets past ones.
KEYS_HELD = 10_000


def rate_lease_size(demand: int, seen: int, burst: int, most: int = RATE_LEASE_MOST) -> int:
    """The slots to take for one request of a key whose window was last seen at ``seen``
    slots taken, when this process served ``demand`` of the key's requests in this window
    or the one before (the more of the two): the request plus as many more as that, within
    the quota's rule (:func:`lease_size`: at most a quarter of what is left and ``most``,
    only the request within four of the burst). A key's first request in a while takes one
    slot, and a busy key's lease doubles until it covers the process's share."""
    return min(lease_size(1, seen, burst, most), 1 + demand)


class RateStore(Protocol):
    """Where a window's slots are counted (:class:`RateWindows`, or its twin)."""

    async def take(self, key_id: str, day: date, index: int, slots: int) -> int: ...


class RateWindows:
    """``rate_windows``: the slots every process has taken of each (key, window)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def take(self, key_id: str, day: date, index: int, slots: int) -> int:
        """Add ``slots`` to the window's counter and return its total after (every process's
        slots that landed before the read; at least ``slots``). Never retried: a counter
        update applied twice over-counts (refusing early, never admitting more)."""
        params = (key_id, day, index)
        await self._db.execute(
            "UPDATE rate_windows SET hits = hits + ? "
            "WHERE key_id = ? AND day = ? AND window_index = ?",
            (slots, *params),
        )
        row = await self._db.one(
            "SELECT hits FROM rate_windows WHERE key_id = ? AND day = ? AND window_index = ?",
            params,
            idempotent=True,
        )
        hits = int(row["hits"]) if row and row["hits"] is not None else 0
        return max(hits, slots)


@dataclass(slots=True)
class _Window:
    """A key's window as this process holds it."""

    index: int
    last: int = 0
    """Requests this process served of the key in the window before (the lease hint)."""
    served: int = 0
    left: int = 0
    """Slots leased and not yet granted: of this window only."""
    seen: int = 0
    """The window's total slots taken, as last read back."""
    lease: int = 0
    """The slots the window's last lease kept (its low-water mark: :func:`low_water`)."""
    over: bool = False
    """A lease kept nothing: the window is full, its further requests are refused."""
    ahead: _Window | None = None
    """The next window, leased ahead near this one's end (its slots are granted only to
    requests stamped in it)."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held by the window's one lease in flight, on the request path or in the background."""


_ALLOWED = Verdict(True)


def _grant(held: _Window) -> bool:
    """Grant one of the window's leased slots, if it holds one."""
    if not held.left:
        return False
    held.left -= 1
    held.served += 1
    return True


#: Requests of a key in a window (or the one before) from which a process leases the key's
#: slots ahead of need: a key seen once in a while is not worth a lease it may never spend.
BUSY = 2


def low_water(lease: int, demand: int, window_ms: int, lease_ms: float) -> int:
    """The unspent slots at which a window takes its next lease, so that requests keep
    finding slots while it is on its way: a quarter of the last lease (``lease``), or what
    the key's requests (``demand`` per window) spend in twice a lease's recent duration
    when that is more, at most the lease (so a process never holds more than two)."""
    return min(lease, max(lease // 4, int(2 * lease_ms * demand / window_ms)))


def renewal_due(left: int, low: int, demand: int) -> bool:
    """Whether a window holding ``left`` slots unspent takes its next lease now, in the
    background: when the key is busy (``demand``: requests served of it in this window or
    the one before) and its slots are down to the low-water mark ``low``."""
    return demand >= BUSY and left <= low


def lead_ms(window_ms: int, lease_ms: float) -> int:
    """How long before its window ends a busy key's next window is leased: the window's
    last tenth, or twice a lease's recent duration when that is longer (so that the lease
    lands before the window starts), at most half the window."""
    return min(window_ms // 2, max(window_ms // 10, math.ceil(2 * lease_ms)))


def ahead_due(now_ms: int, window_ms: int, lead: int, served: int) -> bool:
    """Whether a request at ``now_ms``, the ``served``-th of its key in its window, starts
    the lease of the key's next window: within ``lead`` ms of the window's end, for a busy
    key."""
    end = (window_index(now_ms, window_ms) + 1) * window_ms
    return served >= BUSY and end - now_ms <= lead


#: Weight of the latest lease's duration in a limiter's estimate of the next one's.
_LEASE_TIME_WEIGHT = 0.2


class RateLimiter:
    """One process's request rate limits per key (and per user, :func:`user_bucket`):
    requests granted from slots leased of each window's counter in ``store`` (the bounds:
    module docstring); one per process, shared by its requests. A busy key's next lease is
    taken in the background (a renewal at its low-water mark, the next window's near the end
    of this one) so that its requests do not wait on the store; :meth:`close` ends
    those in flight."""

    def __init__(
        self,
        store: RateStore,
        policy: RatePolicy,
        *,
        most: int = RATE_LEASE_MOST,
        keys: int = KEYS_HELD,
    ) -> None:
        self.store = store
        self.policy = policy
        self._most = most
        self._keys = keys
        self._windows: dict[str, _Window] = {}
        # Leases taken ahead of need; a failed one is logged, and its window's next request
        # leases for itself (and answers 503 if that fails).
        self._ahead = Background()
        self._lease_ms = 0.0
        self._closed = False

    @property
    def held(self) -> int:
        """Keys this process holds window state for."""
        return len(self._windows)

    def unspent(self, key_id: str) -> int:
        """Slots this process holds leased and not yet granted in the key's latest window."""
        held = self._windows.get(key_id)
        return held.left if held else 0

    async def hit(self, key_id: str, *, now_ms: int | None = None) -> Verdict:
        """Count one request of ``key_id``; refused with a Retry-After once over the limit."""
        now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        window_ms = self.policy.window_ms
        index = window_index(now_ms, window_ms)
        held = self._windows.get(key_id)
        if held is None or held.index != index:
            held = self._window(key_id, index, held)
        granted = _grant(held)
        if not granted and not held.over:
            # The window's lease in flight (a background one included) lands first; if it
            # failed or kept too little, the request leases for itself.
            async with held.lock:
                if not held.left and not held.over:
                    await self._lease(key_id, held)
                granted = _grant(held)
        if not granted:
            return Verdict(False, window_retry_after(now_ms, window_ms))
        self._ahead_of_need(key_id, held, now_ms)
        return _ALLOWED

    async def close(self) -> None:
        """End the leases in flight in the background (on shutdown): one cancelled after its
        counter update landed leaves its slots counted, unspent."""
        self._closed = True
        await self._ahead.cancel()

    def _window(self, key_id: str, index: int, held: _Window | None) -> _Window:
        """The state of the key's window ``index``: the one leased ahead, or a new one, when
        the key moved on to it (the old window's leftover slots are dropped with it), a
        throwaway for a request stamped before the window this process already holds (the
        clock stepped back)."""
        if held is not None and held.index > index:
            return _Window(index)
        last = held.served if held is not None and held.index == index - 1 else 0
        if held is not None and held.ahead is not None and held.ahead.index == index:
            fresh = held.ahead
            fresh.last = last
        else:
            fresh = _Window(index, last)
        if len(self._windows) >= self._keys:
            self._prune(index)
        self._windows[key_id] = fresh
        return fresh

    def _ahead_of_need(self, key_id: str, held: _Window, now_ms: int) -> None:
        """Start the leases a busy key will need soon, in the background: its window's next
        at the low-water mark, its next window's near this one's end."""
        if self._closed or self._windows.get(key_id) is not held:
            return
        if not held.over and not held.lock.locked() and self._renewal_due(held):
            self._ahead.spawn(self._renew(key_id, held))
        window_ms = self.policy.window_ms
        lead = lead_ms(window_ms, self._lease_ms)
        if held.ahead is None and ahead_due(now_ms, window_ms, lead, held.served):
            held.ahead = _Window(held.index + 1, held.served)
            self._ahead.spawn(self._renew(key_id, held.ahead))

    def _renewal_due(self, held: _Window) -> bool:
        demand = max(held.served, held.last)
        if rate_lease_size(demand, held.seen, self.policy.burst, self._most) <= 1:
            # Within four of the burst a process takes one slot at a time, for a request
            # that needs it: a slot taken ahead there would be refused to another process.
            return False
        low = low_water(held.lease, demand, self.policy.window_ms, self._lease_ms)
        return renewal_due(held.left, low, demand)

    async def _renew(self, key_id: str, held: _Window) -> None:
        async with held.lock:
            # A request may have leased meanwhile (the task started after it).
            if not held.over and self._renewal_due(held):
                await self._lease(key_id, held)

    async def _lease(self, key_id: str, held: _Window) -> None:
        want = rate_lease_size(
            max(held.served, held.last), held.seen, self.policy.burst, self._most
        )
        day = window_day(held.index, self.policy.window_ms)
        started = time.monotonic()
        taken = await self.store.take(key_id, day, held.index, want)
        took_ms = (time.monotonic() - started) * 1000
        self._lease_ms += _LEASE_TIME_WEIGHT * (took_ms - self._lease_ms)
        held.seen = taken
        kept = kept_of(want, 1, taken, self.policy.burst)
        held.left += kept
        held.lease = kept
        held.over = kept == 0

    def _prune(self, index: int) -> None:
        # Only the current and the previous window serve a request or a hint.
        self._windows = {k: w for k, w in self._windows.items() if w.index >= index - 1}
        if len(self._windows) >= self._keys:
            self._windows.clear()


class RecipientQuota:
    """Recipients accepted per user per UTC day in ``recipient_quota``."""

    def __init__(self, db: Database, daily_limit: int) -> None:
        self._db = db
        self.daily_limit = daily_limit

    async def consume(
        self, user_id: uuid.UUID, recipients: int, *, now: datetime | None = None
    ) -> tuple[Verdict, date]:
        """Reserve ``recipients`` of the quota of ``now``'s UTC day (a batch's: its acceptance
        time, so a refund goes back to the day charged); refused (and nothing reserved) if
        over. Returns the verdict and the day charged.
        """
        now = datetime.now(UTC) if now is None else now
        day = now.astimezone(UTC).date()
        wait = seconds_until_midnight(now)
        if recipients > self.daily_limit:
            return Verdict(False, wait), day
        await self._add(user_id, day, recipients)
        row = await self._db.one(
            "SELECT recipients FROM recipient_quota WHERE user_id = ? AND day = ?",
            (user_id, day),
            idempotent=True,
        )
        used = int(row["recipients"]) if row and row["recipients"] is not None else 0
        if not over_limit(used, self.daily_limit):
            return Verdict(True), day
        if not over_limit(used - await self._refunded(user_id, day), self.daily_limit):
            return Verdict(True), day
        await self._add(user_id, day, -recipients)
        return Verdict(False, wait), day

    async def lease(self, user_id: uuid.UUID, day: date, batch: int, want: int) -> Grant:
        """Add ``want`` (at least ``batch``) recipients to the day's counter and keep what
        :func:`kept_of` allows, giving the rest back in one more write."""
        await self._add(user_id, day, want)
        row = await self._db.one(
            "SELECT recipients FROM recipient_quota WHERE user_id = ? AND day = ?",
            (user_id, day),
            idempotent=True,
        )
        used = int(row["recipients"]) if row and row["recipients"] is not None else 0
        if over_limit(used, self.daily_limit):
            used -= await self._refunded(user_id, day)
        grant = grant_of(want, batch, used, self.daily_limit)
        if grant.kept < want:
            await self._add(user_id, day, grant.kept - want)
        return grant

    async def give_back(self, user_id: uuid.UUID, day: date, recipients: int) -> None:
        """Take an unspent lease off the day's counter. Never retried: a decrement applied
        twice would under-count."""
        await self._add(user_id, day, -recipients)

    async def refund(self, user_id: uuid.UUID, batch_id: uuid.UUID, recipients: int) -> None:
        """Give back the recipients of a batch that will not be sent, to the quota of the day
        it was accepted (its id's). Idempotent: a repeat rewrites the batch's one row."""
        await self._db.execute(
            "INSERT INTO quota_refunds (user_id, day, batch_id, recipients) VALUES (?, ?, ?, ?)",
            (user_id, accepted_at(batch_id).date(), batch_id, recipients),
            idempotent=True,
        )

    async def used(self, user_id: uuid.UUID, day: date) -> int:
        """Recipients charged to the day, less those given back."""
        row = await self._db.one(
            "SELECT recipients FROM recipient_quota WHERE user_id = ? AND day = ?", (user_id, day)
        )
        charged = int(row["recipients"]) if row and row["recipients"] is not None else 0
        return charged - await self._refunded(user_id, day)

    async def _refunded(self, user_id: uuid.UUID, day: date) -> int:
        row = await self._db.one(
            "SELECT SUM(recipients) AS refunded FROM quota_refunds WHERE user_id = ? AND day = ?",
            (user_id, day),
            idempotent=True,
        )
        return int(row["refunded"] or 0) if row else 0

    async def _add(self, user_id: uuid.UUID, day: date, delta: int) -> None:
        await self._db.execute(
            "UPDATE recipient_quota SET recipients = recipients + ? WHERE user_id = ? AND day = ?",
            (delta, user_id, day),
        )


class QuotaStore(Protocol):
    """Where leases are taken and given back (:class:`RecipientQuota`, or its twin)."""

    daily_limit: int

    async def lease(self, user_id: uuid.UUID, day: date, batch: int, want: int) -> Grant: ...

    async def give_back(self, user_id: uuid.UUID, day: date, recipients: int) -> None: ...

    async def refund(self, user_id: uuid.UUID, batch_id: uuid.UUID, recipients: int) -> None: ...

    async def used(self, user_id: uuid.UUID, day: date) -> int: ...


@dataclass(slots=True)
class _Lease:
    left: int
    seen_used: int
    touched: float
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class QuotaLedger:
    """One API process's daily recipient quota: batches charged against its leases in
    memory, a lease taken from ``store`` when one does not cover a batch, unspent leases
    given back when idle, past their day, or on :meth:`close` (the bounds: module
    docstring). Same calls as :class:`RecipientQuota` for the API."""

    def __init__(
        self,
        store: QuotaStore,
        *,
        most: int = LEASE_MOST,
        idle: float = LEASE_IDLE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self._most = most
        self._idle = idle
        self._clock = clock
        self._leases: dict[tuple[uuid.UUID, date], _Lease] = {}

    @property
    def daily_limit(self) -> int:
        return self.store.daily_limit

    def unspent(self, user_id: uuid.UUID, day: date) -> int:
        """Recipients this process holds counted but not yet spent on the day."""
        held = self._leases.get((user_id, day))
        return held.left if held else 0

    async def consume(
        self, user_id: uuid.UUID, recipients: int, *, now: datetime | None = None
    ) -> tuple[Verdict, date]:
        """Charge ``recipients`` to ``now``'s UTC day (as :meth:`RecipientQuota.consume`):
        from this process's lease when it covers them, else from a new lease."""
        now = datetime.now(UTC) if now is None else now
        day = now.astimezone(UTC).date()
        refused = Verdict(False, seconds_until_midnight(now))
        if recipients > self.daily_limit:
            return refused, day
        held = self._leases.setdefault((user_id, day), _Lease(0, 0, self._clock()))
        async with held.lock:
            held.touched = self._clock()
            if held.left < recipients:
                want = lease_size(recipients, held.seen_used, self.daily_limit, self._most)
                grant = await self.store.lease(user_id, day, recipients, want)
                held.seen_used = grant.used
                if grant.kept == 0:
                    return refused, day
                held.left += grant.kept
            held.left -= recipients
        return Verdict(True), day

    async def refund(self, user_id: uuid.UUID, batch_id: uuid.UUID, recipients: int) -> None:
        """A refund row, as :meth:`RecipientQuota.refund` (idempotent, any process)."""
        await self.store.refund(user_id, batch_id, recipients)

    async def used(self, user_id: uuid.UUID, day: date) -> int:
        """The day's use less what this process holds unspent (others' unspent leases
        included)."""
        return await self.store.used(user_id, day) - self.unspent(user_id, day)

    async def reconcile(self, *, today: date | None = None, every: bool = False) -> int:
        """Give back the unspent leases idle for ``LEASE_IDLE`` or of days before ``today``
        (``every``: all of them); return how many recipients went back. A lease is dropped
        before its give-back is sent: if that fails it stays counted (an over-count)."""
        today = datetime.now(UTC).date() if today is None else today
        now = self._clock()
        returned = 0
        for (user_id, day), held in list(self._leases.items()):
            if held.lock.locked():
                continue
            if not (every or day < today or now - held.touched >= self._idle):
                continue
            del self._leases[(user_id, day)]
            if held.left <= 0 or day < today:
                # A past day's leftover cannot be spent, and its counter is no longer read.
                continue
            try:
                await self.store.give_back(user_id, day, held.left)
                returned += held.left
            except DependencyUnavailable as exc:
                log.warning("quota lease of %d not given back: %s", held.left, exc)
        return returned

    async def close(self) -> None:
        """Give every unspent lease back (on shutdown)."""
        await self.reconcile(every=True)

    async def reconcile_forever(self, interval: float = RECONCILE_INTERVAL) -> None:
        while True:
            await asyncio.sleep(interval)
            await self.reconcile()


#: (partition listing, partition delete, owner column) of each day-partitioned counter table.
_DAILY_TABLES = (
    (
        "SELECT DISTINCT key_id, day FROM rate_windows",
        "DELETE FROM rate_windows WHERE key_id = ? AND day = ?",
        "key_id",
    ),
    (
        "SELECT DISTINCT user_id, day FROM recipient_quota",
        "DELETE FROM recipient_quota WHERE user_id = ? AND day = ?",
        "user_id",
    ),
)


async def purge_before(db: Database, cutoff: date) -> int:
    """Delete rate and quota partitions of days before ``cutoff``; return how many went."""
    removed = 0
    for listing, delete, owner in _DAILY_TABLES:
        for p in await db.all_pages(listing):
            if p["day"] is not None and _as_date(p["day"]) < cutoff:
                await db.execute(delete, (p[owner], p["day"]), idempotent=True)
                removed += 1
    return removed


def _as_date(value: object) -> date:
    """The driver returns ``date`` columns as ``cassandra.util.Date``."""
    if isinstance(value, date):
        return value
    return date.fromisoformat(str(value))


#: Seconds between purges of old rate/quota partitions by each API process.
PURGE_INTERVAL = 6 * 3600


async def purge_forever(db: Database, *, keep_days: int = 2) -> None:
    """Counter rows cannot expire by TTL, so each API process deletes old days periodically."""
    while True:
        try:
            cutoff = datetime.now(UTC).date() - timedelta(days=keep_days)
            removed = await purge_before(db, cutoff)
            if removed:
                log.info("purged %d rate/quota partition(s) before %s", removed, cutoff)
        except DependencyUnavailable as exc:
            log.warning("rate-limit purge: %s", exc)
        await asyncio.sleep(PURGE_INTERVAL * random.uniform(0.8, 1.2))
