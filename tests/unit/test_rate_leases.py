"""Request rate limits granted in process from slots leased of each window's counter
(``shared.accounts.ratelimit.RateLimiter``): never more than the burst in a window across processes,
none for a process that dies, no slot of one window granted in the next, and the round
trips a request costs."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from shared.accounts import ratelimit
from shared.accounts.ratelimit import RateLimiter, RatePolicy, rate_lease_size
from shared.core.errors import DependencyUnavailable
from tests.fakes.accounts import FakeRateWindows
from tests.fakes.cassandra import FakeCassandra
from tests.fakes.wire import LOOPBACK, Kind, Trip

#: 100 requests per 2-second window (the default policy).
POLICY = RatePolicy(per_second=50, burst=100)
WINDOW = POLICY.window_ms
#: A window well away from the epoch's first day.
START = 1_000_000 * WINDOW
KEY = "k3y"


def _trips(db: FakeCassandra) -> int:
    return db.calls.count("rate.add") + db.calls.count("rate.read")


def _taken(db: FakeCassandra, index: int, key: str = KEY, window_ms: int = WINDOW) -> int:
    return db.rate_windows.get((key, ratelimit.window_day(index, window_ms), index), 0)


def _lease_most(policy: RatePolicy) -> int:
    """The most slots one lease holds (the module docstring's bound per process)."""
    return 1 + min(ratelimit.RATE_LEASE_MOST, (policy.burst - 1) // 4)


def test_a_keys_first_request_in_a_while_takes_one_slot() -> None:
    """With nothing served of the key lately, a lease is the request alone."""
    assert rate_lease_size(0, 0, 100) == 1


def test_a_busy_keys_lease_doubles_up_to_a_quarter_of_what_is_left() -> None:
    """A lease is one more than the key's recent requests, at most a quarter of what the
    window has left beyond the request."""
    assert (rate_lease_size(7, 0, 100), rate_lease_size(500, 0, 100)) == (8, 25)


def test_a_lease_holds_at_most_its_most() -> None:
    """Under a large burst a lease holds at most ``most`` slots beyond the request."""
    assert rate_lease_size(5_000, 0, 100_000, most=100) == 101


def test_near_the_burst_a_lease_is_the_request_alone() -> None:
    """Within four slots of the burst a process takes one slot at a time."""
    assert rate_lease_size(50, 97, 100) == 1


class Jitter:
    """A wire whose round trips take a random number of turns of the event loop, so that
    leases in the background land at random points among the requests."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    async def trip(self, op: str, kind: Kind) -> Trip:
        for _ in range(self.rng.randrange(4)):
            await asyncio.sleep(0)
        return await LOOPBACK.trip(op, kind)


@pytest.mark.parametrize("seed", range(3))
async def test_processes_hammering_one_key_never_admit_more_than_the_burst(seed: int) -> None:
    """Three processes with four clients each, hammering one key across eight windows with
    their requests, clocks and round trips interleaved at random, admit at most the burst
    in every window, each slot counted in its own window, and fall short of the burst (or
    of what was asked) by at most two leases per process."""
    rng = random.Random(seed)
    db = FakeCassandra(wire=Jitter(rng))
    store, policy = FakeRateWindows(db), RatePolicy(per_second=500, burst=1000)
    window_ms, first = policy.window_ms, START // policy.window_ms
    limiters = [RateLimiter(store, policy) for _ in range(3)]
    # Each process's own clock, a few ms apart from the others'.
    clocks = [START + rng.randrange(50) for _ in limiters]
    offered: Counter[int] = Counter()
    admitted: Counter[int] = Counter()

    async def client(p: int) -> None:
        while clocks[p] < START + 6 * window_ms:
            # About 600 requests per window per process: 1,800 asked of a burst of 1,000.
            clocks[p] += rng.randrange(7)
            window = clocks[p] // window_ms - first
            offered[window] += 1
            verdict = await limiters[p].hit(KEY, now_ms=clocks[p])
            admitted[window] += verdict.allowed
            for _ in range(rng.randrange(3)):
                await asyncio.sleep(0)

    await asyncio.gather(*(client(p) for p in range(len(limiters)) for _ in range(4)))
    for limiter in limiters:
        await limiter.close()

    counted = {w: _taken(db, first + w, window_ms=window_ms) for w in offered}
    short = 3 * 2 * _lease_most(policy)
    assert max(admitted.values()) <= policy.burst
    assert all(counted[w] >= admitted[w] for w in offered)
    assert all(admitted[w] >= min(offered[w], policy.burst - short) for w in offered)


async def test_a_process_that_keeps_dying_gets_no_more_than_the_burst() -> None:
    """A crash loop (each process takes leases, serves a few requests and dies with the
    rest unspent) admits at most the burst per window: unspent slots stay counted."""
    db = FakeCassandra()
    store = FakeRateWindows(db)
    admitted = 0
    for _ in range(40):
        limiter = RateLimiter(store, POLICY)
        for _ in range(5):
            admitted += (await limiter.hit(KEY, now_ms=START)).allowed

    index = START // WINDOW
    assert admitted <= POLICY.burst < 40 * 5
    assert _taken(db, index) >= admitted


async def test_a_keys_requests_are_granted_from_its_lease_without_round_trips() -> None:
    """Forty requests of a key in a window cost six leases (twelve round trips) when the
    key was quiet before, and two leases once it was as busy in the window before; a round
    trip per slot would have cost eighty."""
    db = FakeCassandra()
    limiter = RateLimiter(FakeRateWindows(db), POLICY)
    costs = []
    for window in range(2):
        before = _trips(db)
        for i in range(40):
            now_ms = START + window * WINDOW + i * 40
            assert (await limiter.hit(KEY, now_ms=now_ms)).allowed
        costs.append(_trips(db) - before)

    assert costs == [12, 4]


async def test_a_window_boundary_grants_no_slot_of_the_old_windows_lease() -> None:
    """A process holding unspent slots when its window ends is refused in the next window
    once another process filled it: the old window's slots are not granted there."""
    db = FakeCassandra()
    store, policy = FakeRateWindows(db), RatePolicy(per_second=5, burst=10)
    holder, other = RateLimiter(store, policy), RateLimiter(store, policy)
    first = START // policy.window_ms
    end = (first + 1) * policy.window_ms
    for _ in range(4):
        # Mid-window: near its end the holder would lease the next window ahead.
        assert (await holder.hit(KEY, now_ms=end - policy.window_ms // 2)).allowed
    unspent = holder.unspent(KEY)

    filled = [(await other.hit(KEY, now_ms=end + i)).allowed for i in range(policy.burst)]
    late = await holder.hit(KEY, now_ms=end + policy.burst)

    assert unspent > 0 and all(filled)
    assert (late.allowed, late.retry_after) == (
        False,
        ratelimit.window_retry_after(end + policy.burst, policy.window_ms),
    )
    assert db.rate_windows[(KEY, ratelimit.window_day(first, policy.window_ms), first)] == (
        4 + unspent
    )


async def test_a_refused_key_waits_until_its_window_ends_without_asking_again() -> None:
    """Past the burst a request is refused with the seconds left in its window, and the
    key's further requests in that window are refused without a round trip."""
    db = FakeCassandra()
    limiter = RateLimiter(FakeRateWindows(db), RatePolicy(per_second=1, burst=2))
    for _ in range(2):
        assert (await limiter.hit(KEY, now_ms=START)).allowed
    refused = await limiter.hit(KEY, now_ms=START + 500)
    trips = _trips(db)
    again = await limiter.hit(KEY, now_ms=START + 900)

    assert (refused.allowed, refused.retry_after) == (False, 2)
    assert (again.allowed, again.retry_after, _trips(db)) == (False, 2, trips)


@pytest.mark.parametrize("applied", [False, True])
async def test_a_lease_whose_update_times_out_admits_nothing(applied: bool) -> None:
    """A lease's counter update that times out answers 503 (the error), admits nothing, and
    stays counted in its window if it landed (refusing early there, never admitting more)."""
    db = FakeCassandra()
    limiter = RateLimiter(FakeRateWindows(db), RatePolicy(per_second=5, burst=10))
    db.fail("rate.add", DependencyUnavailable("cassandra", "timeout"), applied=applied)

    with pytest.raises(DependencyUnavailable):
        await limiter.hit(KEY, now_ms=START)
    admitted = sum([(await limiter.hit(KEY, now_ms=START)).allowed for _ in range(20)])

    assert admitted == 10 - applied


async def test_a_lease_whose_read_back_fails_stays_counted() -> None:
    """A lease added to its window whose read-back fails admits nothing and leaves its slot
    counted: the window admits one fewer."""
    db = FakeCassandra()
    limiter = RateLimiter(FakeRateWindows(db), RatePolicy(per_second=5, burst=10))
    db.fail("rate.read", DependencyUnavailable("cassandra", "timeout"))

    with pytest.raises(DependencyUnavailable):
        await limiter.hit(KEY, now_ms=START)
    admitted = sum([(await limiter.hit(KEY, now_ms=START)).allowed for _ in range(20)])

    assert admitted == 9


async def test_a_request_stamped_before_the_held_window_is_still_counted() -> None:
    """A request whose clock reads an earlier window than the one its process holds (the
    clock stepped back) is counted in its own window and leaves the held one alone."""
    db = FakeCassandra()
    limiter = RateLimiter(FakeRateWindows(db), POLICY)
    assert (await limiter.hit(KEY, now_ms=START + WINDOW)).allowed

    assert (await limiter.hit(KEY, now_ms=START)).allowed
    assert (_taken(db, START // WINDOW), _taken(db, START // WINDOW + 1)) == (1, 1)
    assert (await limiter.hit(KEY, now_ms=START + WINDOW)).allowed


async def test_a_process_forgets_keys_of_past_windows_when_it_holds_many() -> None:
    """Past its memo's size a process keeps only the keys of the current and the previous
    window."""
    limiter = RateLimiter(FakeRateWindows(FakeCassandra()), POLICY, keys=100)
    for i in range(100):
        await limiter.hit(f"old{i}", now_ms=START)
    before = limiter.held

    await limiter.hit(KEY, now_ms=START + 5 * WINDOW)

    assert (before, limiter.held) == (100, 1)


async def _settle() -> None:
    """Let the leases started in the background land (each a few turns of the loop)."""
    for _ in range(50):
        await asyncio.sleep(0)


async def _busy(limiter: RateLimiter, window: int, *, until: float = 1.0) -> None:
    """A request of the key every 40 ms through ``window`` (up to the share ``until`` of
    it), the background's leases landing between them."""
    for i in range(round(until * WINDOW / 40)):
        assert (await limiter.hit(KEY, now_ms=START + window * WINDOW + i * 40)).allowed
        await _settle()


async def test_a_busy_key_is_granted_without_a_round_trip_across_its_windows() -> None:
    """Once a key is busy, none of its requests waits on the store: its next lease is
    taken in the background at a quarter of the last, and its next window's near the end
    of this one, so it crosses the window's edge on slots already leased."""
    db = FakeCassandra()
    limiter = RateLimiter(FakeRateWindows(db), POLICY)
    await _busy(limiter, 0)
    waited = []
    for i in range(50):
        trips = _trips(db)
        assert (await limiter.hit(KEY, now_ms=START + WINDOW + i * 40)).allowed
        waited.append(_trips(db) - trips)
        await _settle()
    await limiter.close()

    assert waited == [0] * 50
    assert _taken(db, START // WINDOW + 1) >= 50


async def test_slots_leased_ahead_are_granted_only_in_their_window() -> None:
    """A process near its window's end leases its next window ahead, yet once another
    process filled the current window it grants there no more than it holds of that window:
    the next window's slots wait for the next window's requests."""
    db = FakeCassandra()
    store, policy = FakeRateWindows(db), RatePolicy(per_second=20, burst=40)
    holder, other = RateLimiter(store, policy), RateLimiter(store, policy)
    first = START // policy.window_ms
    end = (first + 1) * policy.window_ms
    for i in range(4):
        assert (await holder.hit(KEY, now_ms=end - 10 + i)).allowed
    await _settle()
    ahead, spare = _taken(db, first + 1, window_ms=policy.window_ms), holder.unspent(KEY)

    while (await other.hit(KEY, now_ms=end - 5)).allowed:
        pass
    late = [(await holder.hit(KEY, now_ms=end - 4)).allowed for _ in range(10)]
    trips = _trips(db)
    next_first = await holder.hit(KEY, now_ms=end)
    await holder.close()

    assert ahead > 0
    assert sum(late) == spare
    assert (next_first.allowed, _trips(db)) == (True, trips)


@pytest.mark.parametrize("applied", [False, True])
async def test_a_failed_lease_ahead_leaves_the_next_window_to_its_requests(applied: bool) -> None:
    """A next window's lease taken ahead whose counter update fails (landed or not) leaves
    that window's first request to lease for itself, and be granted."""
    db = FakeCassandra()
    limiter = RateLimiter(FakeRateWindows(db), POLICY)
    end = START + WINDOW
    for i in range(2):
        # The second makes the key busy near its window's end: it starts the lease ahead.
        assert (await limiter.hit(KEY, now_ms=end - 20 + i)).allowed
    db.fail("rate.add", DependencyUnavailable("cassandra", "timeout"), applied=applied)
    await _settle()

    granted = await limiter.hit(KEY, now_ms=end)
    await limiter.close()

    # Both leases asked for the request and as many as the key's two in the window before.
    assert (granted.allowed, _taken(db, START // WINDOW + 1)) == (True, 3 + applied * 3)


async def test_a_failed_renewal_leaves_the_request_that_finds_no_slot_to_lease() -> None:
    """A busy key's renewal in the background that fails leaves the request that finds its
    window's slots spent to lease for itself, and be granted."""
    db = FakeCassandra()
    limiter = RateLimiter(FakeRateWindows(db), POLICY)
    for _ in range(3):
        # Leases of one and two slots; the third request spends the last and starts a renewal.
        assert (await limiter.hit(KEY, now_ms=START)).allowed
    db.fail("rate.add", DependencyUnavailable("cassandra", "timeout"))
    await _settle()

    granted = await limiter.hit(KEY, now_ms=START)
    await limiter.close()

    assert (granted.allowed, _taken(db, START // WINDOW)) == (True, 3 + rate_lease_size(3, 3, 100))


async def test_a_request_whose_own_lease_fails_after_a_failed_renewal_answers_503() -> None:
    """When the renewal in the background failed and so does the request's own lease, the
    request fails with the store (503), as a request whose lease fails always has."""
    db = FakeCassandra()
    limiter = RateLimiter(FakeRateWindows(db), POLICY)
    for _ in range(3):
        assert (await limiter.hit(KEY, now_ms=START)).allowed
    for _ in range(2):
        db.fail("rate.add", DependencyUnavailable("cassandra", "timeout"))
    await _settle()

    with pytest.raises(DependencyUnavailable):
        await limiter.hit(KEY, now_ms=START)
    await limiter.close()


async def test_a_clock_stepping_back_leaves_the_slots_leased_ahead_to_their_window() -> None:
    """A request stamped in the window before (the clock stepped back) once a busy key
    entered its slots leased ahead is counted in its own window, by a lease of its own (the
    only round trips here); the key's held slots serve it before and after."""
    db = FakeCassandra()
    limiter = RateLimiter(FakeRateWindows(db), POLICY)
    await _busy(limiter, 0)
    before, ahead = _taken(db, START // WINDOW), _taken(db, START // WINDOW + 1)
    trips = _trips(db)

    entered = await limiter.hit(KEY, now_ms=START + WINDOW)
    back = await limiter.hit(KEY, now_ms=START + WINDOW - 1)
    forward = await limiter.hit(KEY, now_ms=START + WINDOW + 1)
    await limiter.close()

    assert entered.allowed and back.allowed and forward.allowed
    assert (_taken(db, START // WINDOW), _taken(db, START // WINDOW + 1)) == (before + 1, ahead)
    assert _trips(db) - trips == 2


async def test_a_clock_jumping_past_the_window_leased_ahead_leases_its_own() -> None:
    """A key whose next request lands two windows on (the clock jumped) is not granted the
    slots leased ahead for the window it skipped: it leases of its own window."""
    db = FakeCassandra()
    limiter = RateLimiter(FakeRateWindows(db), POLICY)
    await _busy(limiter, 0)
    skipped = _taken(db, START // WINDOW + 1)

    granted = await limiter.hit(KEY, now_ms=START + 2 * WINDOW)
    await limiter.close()

    assert skipped > 0
    assert (granted.allowed, _taken(db, START // WINDOW + 1)) == (True, skipped)
    assert _taken(db, START // WINDOW + 2) >= 1


class Held:
    """A wire whose round trips wait until :attr:`go` is set."""

    def __init__(self) -> None:
        self.go = asyncio.Event()

    async def trip(self, op: str, kind: Kind) -> Trip:
        await self.go.wait()
        return await LOOPBACK.trip(op, kind)


async def test_closing_a_limiter_ends_its_leases_in_flight() -> None:
    """A limiter closed (on shutdown) cancels its leases in the background: one whose round
    trip was still on its way never counts in the store."""
    wire = Held()
    db = FakeCassandra(wire=wire)
    limiter = RateLimiter(FakeRateWindows(db), POLICY)
    end = START + WINDOW
    wire.go.set()
    for i in range(2):
        assert (await limiter.hit(KEY, now_ms=end - 20 + i)).allowed
    wire.go.clear()
    await _settle()

    await limiter.close()
    wire.go.set()
    await _settle()

    assert _taken(db, START // WINDOW + 1) == 0


async def test_processes_sharing_exactly_the_burst_at_once_are_granted_all_of_it() -> None:
    """Two processes sent exactly the burst at once admit all of it: within four of the
    burst no slot is leased ahead of need, where another process's request would be refused
    for it."""
    db = FakeCassandra()
    store, policy = FakeRateWindows(db), RatePolicy(per_second=0.1, burst=5)
    limiters = [RateLimiter(store, policy) for _ in range(2)]
    now_ms = START // policy.window_ms * policy.window_ms

    verdicts = await asyncio.gather(*(limiters[i % 2].hit(KEY, now_ms=now_ms) for i in range(5)))
    for limiter in limiters:
        await limiter.close()

    assert [v.allowed for v in verdicts] == [True] * 5
