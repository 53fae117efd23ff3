"""How often the interpreter hands the GIL from a running thread to one that waits for it,
in a service process.

A service's event loop shares its process with worker threads doing CPU work kept off the
loop (validating a 10 MB batch is 1.4 s of Python, a CSV import's scan, a large chunk's
models). Every socket call the loop makes lets the GIL go, and taking it back waits for a
thread running Python to reach the switch interval (CPython's default, 5 ms): a loop turn
of a few dozen socket calls then waits a few dozen intervals (the convoy effect, CPython
issue 7946). Measured under ``make hostile`` with every hostile input at once on two busy
cores, the API's longest loop stall: 0.363 s at 5 ms, 0.125 s at 0.5 ms, 0.077 s at 0.2 ms
(one run each), though no group of those inputs held the loop for 0.1 s alone. A shorter
interval bounds each wait; the cost is more switches between CPU-bound threads, which take
turns either way.

A wait is an interval per thread ahead of the loop, and every thread running Python is
ahead of it in turn: three 10 MB batches and five CSV scans in the default executor's six
threads made each of the loop's socket calls wait for up to six. So that work runs on a
:class:`CpuLane`, one thread per service: it holds the GIL, so a second thread would only
take turns with the first and finish nothing sooner, and the loop now waits behind one
thread at most. Work that lets the GIL go (hashing, file and network calls) stays on the
default executor, where it runs in parallel. Measured the same way at 0.2 ms: the API's
longest stall 0.077-0.140 s over three runs with the default executor's threads, 0.091 and
0.070 s over two with the lane (every service under 0.1 s in both).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Final, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

#: Seconds a thread running Python keeps the GIL while another waits for it.
SWITCH_INTERVAL: Final = 0.0002


def shorten_switch_interval() -> None:
    """Set the process's switch interval to :data:`SWITCH_INTERVAL` (a service process's
    entry point calls it; tests and harnesses keep CPython's)."""
    sys.setswitchinterval(SWITCH_INTERVAL)


class CpuLane:
    """The one thread a service runs its long pure-Python work on, in the order it is given
    (see the module docstring). Its thread starts with the first call; :meth:`aclose` waits
    for what was given to finish."""

    def __init__(self, name: str = "cpu") -> None:
        self._threads = ThreadPoolExecutor(1, thread_name_prefix=name)

    async def run(self, work: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``work(*args, **kwargs)`` on the lane's thread, with the caller's context (its
        log fields) as :func:`asyncio.to_thread` does. Cancelled before it starts, the call
        never runs."""
        call = functools.partial(contextvars.copy_context().run, work, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._threads, call)

    async def aclose(self) -> None:
        await asyncio.to_thread(self._threads.shutdown, True)
