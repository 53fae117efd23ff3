"""The sliced window behind shared rate limits (``services.consumers.provider_rates``), and
what the senders do with a provider at its limit: spill over to the next one without using
up an attempt, and wait in the broker when every provider is full."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.consumers.provider_rates import (
    ProviderLimiter,
    in_window,
    slice_start,
    wait_for_room,
)
from shared.core.errors import TransientProviderError
from tests.fakes.world import World, refused

A, B = "a@example.org", "b@example.org"


NOW = datetime(2026, 11, 26, 12, 0, 5, 250_000, tzinfo=UTC)


def _ago(seconds: float) -> datetime:
    return slice_start(NOW - timedelta(seconds=seconds))


def test_the_window_counts_every_slice_overlapping_the_last_second_the_oldest_whole() -> None:
    slices = {_ago(1.2): 50, _ago(1.0): 3, _ago(0.5): 4, _ago(0.0): 5}

    assert in_window(slices, NOW) == 12  # the slice from 1.0 s ago still overlaps it


@given(st.lists(st.floats(0, 3), max_size=60))
def test_no_true_second_holds_more_calls_than_the_window_counted(ago: list[float]) -> None:
    """Whatever the calls' times, the calls in the second ending now are all counted."""
    slices: dict[datetime, int] = {}
    for seconds in ago:
        start = _ago(seconds)
        slices[start] = slices.get(start, 0) + 1

    assert in_window(slices, NOW) >= sum(1 for seconds in ago if seconds < 1.0)


def test_the_wait_is_until_enough_of_the_oldest_slices_have_left_the_window() -> None:
    slices = {_ago(0.9): 10, _ago(0.5): 5, _ago(0.0): 5}

    assert wait_for_room(slices, NOW, 20) == pytest.approx(0.15, abs=1e-6)  # 0.9 s ago leaves
    assert wait_for_room(slices, NOW, 10) == pytest.approx(0.55, abs=1e-6)  # and 0.5 s ago
    assert wait_for_room({}, NOW, 20) == pytest.approx(0.05)


class FullProviders(ProviderLimiter):
    """A limiter whose listed providers are at their limit."""

    def __init__(self, *full: str) -> None:
        super().__init__(None, "")
        self.full = set(full)
        self.asked: list[str] = []

    async def acquire(self, provider: str, now: datetime, limit: float) -> float | None:
        self.asked.append(provider)
        return 0.5 if provider in self.full else None

    async def block(self, provider: str, now: datetime, seconds: float) -> None:
        self.full.add(provider)


async def test_a_provider_at_its_limit_spills_the_chunk_over_to_the_next_one() -> None:
    w = World(limiter=FullProviders("sg"))

    batch = await w.accept(A, B)
    await w.settle()

    assert w.providers["sg"].sent == []
    assert sorted(w.providers["mg"].emails()) == [A, B]
    providers = dict((await w.rows(batch))[A]["providers"])  # type: ignore[call-overload]
    assert providers == {"sg": "failed: at its rate limit: spilled over", "mg": "sent"}


async def test_spilling_over_uses_up_no_attempt() -> None:
    """With two attempts allowed, a chunk skipped by a full SendGrid still gets two real
    calls (Mailgun failing, then Mailgun again after the backoff)."""
    w = World(max_attempts=2, limiter=FullProviders("sg"))
    w.providers["mg"].answers.append(refused("mg"))

    batch = await w.accept(A)
    await w.settle()

    assert len(w.providers["mg"].sent) == 2  # the second call succeeded: not given up
    assert (await w.states(batch))[A] != "failed"


async def test_with_every_provider_full_the_work_waits_in_a_delay_queue_not_in_memory() -> None:
    limiter = FullProviders("sg", "mg")
    w = World(limiter=limiter)

    await w.accept(A)
    for _ in range(50):
        if not await w.step():
            break
    delayed = [m for m in w.broker.published if m.delay]

    assert delayed, "the chunk should wait in a delay queue"
    assert w.providers["sg"].sent == [] and w.providers["mg"].sent == []
    limiter.full.clear()
    await w.settle()
    assert w.providers["sg"].emails() + w.providers["mg"].emails() == [A]


async def test_a_429_with_retry_after_makes_the_limiter_hold_the_provider_off() -> None:
    limiter = FullProviders()
    w = World(limiter=limiter)
    w.providers["sg"].answers.append(
        TransientProviderError("sg", "429", status=429, retry_after=30)
    )

    await w.accept(A)
    await w.settle()

    assert "sg" in limiter.full
    assert w.providers["mg"].emails() == [A]
