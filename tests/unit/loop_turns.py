"""How much the event loop got on with other work while one awaitable was awaited: the tests
of work kept off the loop count turns, never time.

A test that counts turns carries the ``offloop`` marker, and ``make cov-decisions`` leaves it
out: under coverage's line tracer each of the thousands of GIL hand-offs while counting is
traced, and a form the Mailgun provider builds in 0.5 s took 110 s (past the suite's 120 s
timeout on a loaded machine, which left the session's event loop waiting for ever)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")

#: Turns another task gets while CPU work of tens of milliseconds or more runs in a worker
#: thread: while counting, the interpreter hands the GIL back every :data:`SWITCH` seconds,
#: and each hand-back is at least one turn (the loop's poll releases the GIL again). Work on
#: the loop itself leaves it a handful (one per await that suspends), however fast the machine.
MANY = 100

#: The GIL switch interval while turns are counted: 50 us, so 10 ms of off-loop work is
#: about 200 turns, where the interpreter's default 5 ms made it 2 and the count a measure
#: of the machine's speed.
SWITCH = 0.00005


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
    interval = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH)
    try:
        result = await work
    finally:
        sys.setswitchinterval(interval)
        done = True
        await task
    return result, turns - start
