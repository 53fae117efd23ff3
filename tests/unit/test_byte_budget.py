"""The byte budget: work takes its size before it holds it, waits its turn, and holds
nothing once its wait is over."""

from __future__ import annotations

import asyncio

import pytest

from shared.infra.byte_budget import BudgetExhausted, ByteBudget, Lease


async def test_a_take_that_fits_is_granted_and_one_that_does_not_waits_for_room() -> None:
    """A taker waits while the budget is full and is granted once enough is given back."""
    budget = ByteBudget(10)
    first = await budget.take(8, wait=5)
    second = asyncio.create_task(budget.take(5, wait=5))
    await asyncio.sleep(0)
    assert not second.done()

    budget.give(first)

    assert await second == 5
    assert budget.free == 5


async def test_takers_are_served_in_arrival_order() -> None:
    """A small taker behind a large one waits behind it (the large one is not starved)."""
    budget = ByteBudget(10)
    held = await budget.take(6, wait=5)
    large = asyncio.create_task(budget.take(8, wait=5))
    await asyncio.sleep(0)
    small = asyncio.create_task(budget.take(2, wait=5))
    await asyncio.sleep(0)
    assert not small.done()

    budget.give(held)
    assert await large == 8
    assert await small == 2


async def test_a_taker_whose_wait_ends_holds_nothing_and_lets_those_behind_it_in() -> None:
    """BudgetExhausted names the budget; what the expired taker waited for stays free."""
    budget = ByteBudget(10)
    await budget.take(6, wait=5)
    with pytest.raises(BudgetExhausted) as refused:
        await budget.take(8, wait=0)

    assert refused.value.total == 10
    assert budget.free == 4
    assert await budget.take(4, wait=0) == 4


async def test_a_cancelled_taker_holds_nothing() -> None:
    """A taker cancelled while waiting (its client gone) leaves the budget as it was."""
    budget = ByteBudget(10)
    held = await budget.take(10, wait=5)
    waiting = asyncio.create_task(budget.take(5, wait=5))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting

    budget.give(held)
    assert budget.free == 10


async def test_work_larger_than_the_budget_takes_all_of_it_and_runs_alone() -> None:
    """A taker over the whole budget is granted the whole budget, never refused forever."""
    budget = ByteBudget(10)
    async with budget.holding(50, wait=5) as taken:
        assert taken == 10
        assert budget.free == 0
    assert budget.free == 10


async def test_a_lease_grows_to_its_size_takes_nothing_when_small_and_gives_all_back() -> None:
    """A lease covers the size it is told in steps, ignores small sizes, and releases once."""
    budget = ByteBudget(100)
    lease = Lease(budget, wait=5, small=10)
    await lease.cover(10)
    assert budget.free == 100

    await lease.cover(30)
    await lease.cover(60)
    assert budget.free == 40

    lease.release()
    lease.release()
    assert budget.free == 100
