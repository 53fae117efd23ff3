"""How much the event loop got on with other work while one awaitable was awaited: the tests
of work kept off the loop count turns, never time."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")

#: Turns another task gets while CPU work of tens of milliseconds or more runs in a worker
#: thread (the interpreter hands the GIL back every 5 ms, and each hand-back is many turns);
#: work on the loop itself leaves it a handful (one per await that suspends).
MANY = 100


async def turns_during(work: Awaitable[T]) -> tuple[T, int]:
    """``work``'s result and how many times another task ran while it was awaited."""
    turns = 0
    done = False

    async def other() -> None:
        nonlocal turns
        while not done:
            await asyncio.sleep(0)
            turns += 1

    task = asyncio.create_task(other())
    await asyncio.sleep(0)
    start = turns
    try:
        result = await work
    finally:
        done = True
        await task
    return result, turns - start
