"""One case of the parser table, measured in a child process of its own.

``python -m bench.hostile.measure '{"case": "link rewrite", "scales": [1, 10]}'`` builds the
case's input at each scale (untimed), says ``timing`` (the parent's timeout starts there),
parses it and says ``result``: the CPU seconds of the parse (the best of at least three runs,
up to five while they are short, so a 1x time of a millisecond is not one noisy sample), how
it ended (``ok``, or the exception a refusal raised) and the process's peak RSS so far. Lines are
:mod:`bench.child`'s protocol. The parent kills the child when a parse outlives its timeout;
the child's address space is capped (``address_space_mb``) so a memory bomb fails here with
a MemoryError instead of taking the machine's memory.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from typing import Any

from bench import child
from bench.hostile import cases

#: Runs of one parse are repeated until they add up to this many CPU seconds (or MAX_RUNS),
#: and at least MIN_RUNS times: a ratio of a best-of-5 to a best-of-2 read a 10x parse
#: disturbed once (a neighbour's burst, a cold cache) as superlinear.
MIN_TOTAL = 0.25
MIN_RUNS = 3
MAX_RUNS = 5


def timed(parse: Callable[[Any], object], value: Any) -> tuple[float, str]:
    """The best CPU time of :data:`MIN_RUNS` to :data:`MAX_RUNS` runs of ``parse(value)`` and
    how the runs ended."""
    best = float("inf")
    total = 0.0
    outcome = "ok"
    for runs in range(1, MAX_RUNS + 1):
        start = time.process_time()
        try:
            parse(value)
        except Exception as exc:  # noqa: BLE001 - a refusal is timed like an answer
            outcome = f"refused ({type(exc).__name__})"
        spent = time.process_time() - start
        best = min(best, spent)
        total += spent
        if total >= MIN_TOTAL and runs >= MIN_RUNS:
            break
    return best, outcome


def peak_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def main() -> None:
    spec = child.spec_from_argv()
    limit = int(spec.get("address_space_mb", 0)) * 1024 * 1024
    if limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    case = cases.by_name(str(spec["case"]))
    for scale in spec["scales"]:
        value = case.build(int(scale))
        size = case.size(value, int(scale))
        child.emit("timing", scale=scale, bytes=size)
        seconds, outcome = timed(case.parse, value)
        child.emit(
            "result", scale=scale, bytes=size, seconds=seconds, outcome=outcome, peak_mb=peak_mb()
        )
        del value


if __name__ == "__main__":
    main()
