"""Request rate limits granted in process from slots leased of each window's counter
(``shared.ratelimit.RateLimiter``): never more than the burst in a window across processes,
none for a process that dies, no slot of one window granted in the next, and the round
trips a request costs."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from shared import ratelimit
from shared.errors import DependencyUnavailable
from shared.ratelimit import RateLimiter, RatePolicy, rate_lease_size
from tests.fakes.acceptance_stores import FakeRateWindows
from tests.fakes.stores import FakeCassandra

#: 100 requests per 2-second window (the default policy).
POLICY = RatePolicy(per_second=50, burst=100)
WINDOW = POLICY.window_ms
#: A window well away from the epoch's first day.
START = 1_000_000 * WINDOW
KEY = "k3y"


def _trips(db: FakeCassandra) -> int:
    return db.calls.count("rate.add") + db.calls.count("rate.read")


def _taken(db: FakeCassandra, index: int, key: str = KEY) -> int:
    return db.rate_windows.get((key, ratelimit.window_day(index, WINDOW), index), 0)


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


async def test_processes_hammering_one_key_never_admit_more_than_the_burst() -> None:
    """Five processes with three clients each, hammering one key over six windows, admit at
    most the burst in every window, and fall short of it by at most one lease per
    process."""
    db, rng = FakeCassandra(), random.Random(34)
    store, policy = FakeRateWindows(db), RatePolicy(per_second=500, burst=1000)
    limiters = [RateLimiter(store, policy) for _ in range(5)]
    admitted: Counter[int] = Counter()

    async def client(limiter: RateLimiter, window: int) -> None:
        for _ in range(100):
            now_ms = (START // policy.window_ms + window) * policy.window_ms
            now_ms += rng.randrange(policy.window_ms)
            if (await limiter.hit(KEY, now_ms=now_ms)).allowed:
                admitted[window] += 1

    for window in range(6):
        await asyncio.gather(*(client(lim, window) for lim in limiters for _ in range(3)))

    assert max(admitted.values()) <= policy.burst
    assert min(admitted.values()) >= policy.burst - 5 * _lease_most(policy)


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
        assert (await holder.hit(KEY, now_ms=end - 1)).allowed
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
