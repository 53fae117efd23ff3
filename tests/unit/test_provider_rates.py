"""The sliding-window estimate behind shared rate limits (``shared.provider_rates``), and
what the senders do with a provider at its limit: spill over to the next one without using
up an attempt, and wait in the broker when every provider is full."""

from __future__ import annotations

from datetime import datetime

import pytest

from shared.errors import TransientProviderError
from shared.provider_rates import estimate, wait_for_room
from tests.fakes.world import World

A, B = "a@example.org", "b@example.org"


@pytest.mark.parametrize(
    ("previous", "current", "into", "expected"),
    [(20, 0, 0.0, 20.0), (20, 0, 0.5, 10.0), (20, 5, 0.75, 10.0), (0, 7, 0.3, 7.0)],
)
def test_the_estimate_weighs_the_previous_second_by_what_is_left_of_it(
    previous: int, current: int, into: float, expected: float
) -> None:
    assert estimate(previous, current, into) == pytest.approx(expected)


def test_the_wait_is_until_the_window_has_room() -> None:
    assert wait_for_room(0, 20, 0.25, 20) == pytest.approx(0.75)  # this second alone is full
    assert wait_for_room(20, 10, 0.25, 20) == pytest.approx(0.25)  # half of before must pass
    assert wait_for_room(0, 0, 0.0, 20) == pytest.approx(0.05)


class FullProviders:
    """A limiter whose listed providers are at their limit."""

    def __init__(self, *full: str) -> None:
        self.full = set(full)
        self.asked: list[str] = []

    async def acquire(self, provider: str, now: datetime) -> float | None:
        self.asked.append(provider)
        return 0.5 if provider in self.full else None

    async def block(self, provider: str, now: datetime, seconds: float) -> None:
        self.full.add(provider)


async def test_a_provider_at_its_limit_spills_the_chunk_over_to_the_next_one() -> None:
    w = World()
    w.dispatcher.limiter = FullProviders("sg")  # type: ignore[assignment]

    batch = await w.accept(A, B)
    await w.settle()

    assert w.providers["sg"].sent == []
    assert sorted(w.providers["mg"].emails()) == [A, B]
    providers = dict((await w.rows(batch))[A]["providers"])  # type: ignore[call-overload]
    assert providers == {"sg": "failed: at its rate limit: spilled over", "mg": "sent"}


async def test_spilling_over_uses_up_no_attempt() -> None:
    """With two attempts allowed, a chunk skipped by a full SendGrid still gets two real
    calls (Mailgun failing, then Mailgun again after the backoff)."""
    w = World(max_attempts=2)
    w.dispatcher.limiter = FullProviders("sg")  # type: ignore[assignment]
    w.providers["mg"].answers.append(TransientProviderError("mg", "503", status=503))

    batch = await w.accept(A)
    await w.settle()

    assert len(w.providers["mg"].sent) == 2  # the second call succeeded: not given up
    assert (await w.states(batch))[A] != "failed"


async def test_with_every_provider_full_the_work_waits_in_a_delay_queue_not_in_memory() -> None:
    w = World()
    limiter = FullProviders("sg", "mg")
    w.dispatcher.limiter = limiter  # type: ignore[assignment]

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
    w = World()
    limiter = FullProviders()
    w.dispatcher.limiter = limiter  # type: ignore[assignment]
    w.providers["sg"].answers.append(
        TransientProviderError("sg", "429", status=429, retry_after=30)
    )

    await w.accept(A)
    await w.settle()

    assert "sg" in limiter.full
    assert w.providers["mg"].emails() == [A]
