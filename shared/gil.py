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
"""

from __future__ import annotations

import sys
from typing import Final

#: Seconds a thread running Python keeps the GIL while another waits for it.
SWITCH_INTERVAL: Final = 0.0002


def shorten_switch_interval() -> None:
    """Set the process's switch interval to :data:`SWITCH_INTERVAL` (a service process's
    entry point calls it; tests and harnesses keep CPython's)."""
    sys.setswitchinterval(SWITCH_INTERVAL)
