"""Pure statistics of a run: percentiles, latency summaries, rates and run stability."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

#: Percentiles reported for every latency distribution.
REPORTED_PERCENTILES: tuple[tuple[str, float], ...] = (
    ("p50", 50.0),
    ("p90", 90.0),
    ("p99", 99.0),
    ("p999", 99.9),
)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ascending values, interpolating linearly.

    Same definition as numpy's default (``linear``): rank ``q/100 * (n - 1)``.
    """
    if not sorted_values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be within 0-100, not {q}")
    rank = q / 100.0 * (len(sorted_values) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(sorted_values) - 1)
    fraction = rank - low
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * fraction


def latency_summary(values: Iterable[float]) -> dict[str, float | int | None]:
    """Count, mean, min, max and the reported percentiles of ``values`` (same unit out)."""
    ordered = sorted(values)
    summary: dict[str, float | int | None] = {"count": len(ordered)}
    if not ordered:
        summary.update({"mean": None, "min": None, "max": None})
        summary.update({name: None for name, _ in REPORTED_PERCENTILES})
        return summary
    summary["mean"] = sum(ordered) / len(ordered)
    summary["min"] = ordered[0]
    summary["max"] = ordered[-1]
    for name, q in REPORTED_PERCENTILES:
        summary[name] = percentile(ordered, q)
    return summary


def per_second(count: float, seconds: float) -> float:
    """``count`` per second over ``seconds`` (0 when no time passed)."""
    return count / seconds if seconds > 0 else 0.0


def relative_difference(a: float, b: float) -> float:
    """``|a - b|`` as a fraction of the larger of the two (0 when both are 0)."""
    largest = max(abs(a), abs(b))
    return abs(a - b) / largest if largest else 0.0


def stability(first: float, last: float, *, tolerance: float = 0.10) -> dict[str, float | bool]:
    """Compare a limit measured at the start and at the end of a run.

    The run is unstable (its ratios cannot be trusted) when the two differ by more than
    ``tolerance`` of the larger: something else used the CPU, or the services degraded.
    """
    difference = relative_difference(first, last)
    return {
        "first": first,
        "last": last,
        "difference": difference,
        "tolerance": tolerance,
        "stable": difference <= tolerance,
    }


def window_count(times: Iterable[float], start: float, end: float) -> int:
    """How many event ``times`` fall within ``[start, end)``."""
    return sum(1 for t in times if start <= t < end)


def busiest_second(times: Iterable[float]) -> int:
    """The most events in any one-second window, sliding over the events (a window opens at
    each event, so no fixed grid splits a burst in two)."""
    ordered = sorted(times)
    best = start = 0
    for end, at in enumerate(ordered):
        while at - ordered[start] >= 1.0:
            start += 1
        best = max(best, end - start + 1)
    return best


def spread_window(sorted_times: Sequence[float], low: float, high: float) -> tuple[float, float]:
    """The times at which the ``low`` and ``high`` fractions of events had happened.

    Used for the steady-state rate of a drain: the rate between 10% and 90% done leaves out
    the ramp-up and the tail.
    """
    if not sorted_times:
        raise ValueError("no events")
    last = len(sorted_times) - 1
    return sorted_times[round(low * last)], sorted_times[round(high * last)]
