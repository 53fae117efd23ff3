"""Pure evaluation of the benchmark's goals: ratios to the raw limits, absolute work per
recipient and per event, latency and memory.

Every target becomes ``{"value", "target", "pass", "rule"}``; a figure the run did not produce
(a phase was skipped or failed) gives ``value: None`` and ``pass: None`` rather than a pass,
and a figure :mod:`bench.headline` refused gives ``pass: None`` and ``invalid``, the reason:
a goal met by an impossible figure is not met.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

#: Python services held to the per-process memory goal (the sandbox is a test double).
PYTHON_SERVICES: tuple[str, ...] = ("api", "consumers", "webhooks")


@dataclass(frozen=True, slots=True)
class Goal:
    """One goal: the figure it reads, the bound, and which side of the bound passes."""

    figure: str
    bound: float
    at_least: bool
    rule: str

    def judge(self, value: float | None, refused: str | None = None) -> dict[str, object]:
        if refused is not None:
            return {
                "value": value,
                "target": self.bound,
                "pass": None,
                "rule": self.rule,
                "invalid": refused,
            }
        passed = (
            None
            if value is None
            else (value >= self.bound if self.at_least else value <= self.bound)
        )
        return {"value": value, "target": self.bound, "pass": passed, "rule": self.rule}


#: The goals of the brief, keyed by the name used in the JSON.
GOALS: dict[str, Goal] = {
    "acceptance_vs_l_accept": Goal(
        "acceptance_ratio",
        0.6,
        True,
        "API max recipients/s (N=100) >= 0.6 x L_accept recipients/s",
    ),
    "e2e_vs_l_e2e": Goal(
        "e2e_ratio", 0.6, True, "end-to-end recipients/s (N=100) >= 0.6 x L_e2e recipients/s"
    ),
    "webhooks_batched_vs_raw": Goal(
        "webhooks_batched_ratio",
        0.5,
        True,
        "SendGrid-style batched webhook events/s >= 0.5 x raw webhook write loop",
    ),
    "webhooks_single_vs_raw": Goal(
        "webhooks_single_ratio",
        0.3,
        True,
        "Mailgun-style single-event webhook events/s >= 0.3 x raw webhook write loop",
    ),
    "p99_ms_at_50pct": Goal(
        "p99_ms_at_50pct", 20.0, False, "open-loop p99 acceptance latency <= 20 ms at 50% of max"
    ),
    "p99_ms_at_80pct": Goal(
        "p99_ms_at_80pct", 50.0, False, "open-loop p99 acceptance latency <= 50 ms at 80% of max"
    ),
    **{
        f"rss_mb_{name}": Goal(f"rss_mb_{name}", 100.0, False, f"{name} peak RSS (VmHWM) <= 100 MB")
        for name in PYTHON_SERVICES
    },
    # Absolute work, not ratios: a ratio to a baseline as heavy as the design proves nothing.
    "accept_cpu_us_per_rcpt": Goal(
        "accept_cpu_us_per_rcpt",
        30.0,
        False,
        "acceptance CPU-µs per recipient at the API's max (API + Cassandra + RabbitMQ) <= 30",
    ),
    "api_max_rcpt_per_s": Goal(
        "api_max_rcpt_per_s", 30_000.0, True, "API max recipients/s (N=100) >= 30,000"
    ),
    "e2e_cpu_us_per_rcpt": Goal(
        "e2e_cpu_us_per_rcpt",
        50.0,
        False,
        "end-to-end CPU-µs per recipient (consumers + Cassandra + RabbitMQ, N=100) <= 50",
    ),
    "webhook_cpu_us_per_event": Goal(
        "webhook_cpu_us_per_event",
        150.0,
        False,
        "webhook ingest CPU-µs per event (webhooks + Cassandra + RabbitMQ, batched) <= 150",
    ),
    "lanes_tx_p99_s": Goal(
        "lanes_tx_p99_s",
        2.0,
        False,
        "transactional p99 time to provider (s) while a large bulk batch drains <= 2",
    ),
    # Ceilings, not goals of speed: the limit is the raw baseline, and more calls than it
    # allows (beyond the window's edges) is a defect of the limiter.
    "rate_limit_busiest_vs_limit": Goal(
        "rate_limit_busiest_ratio",
        1.1,
        False,
        "SendGrid's busiest second in a flood <= 1.1 x its rate limit (three processes)",
    ),
    "rate_limit_steady_vs_limit": Goal(
        "rate_limit_steady_ratio",
        1.1,
        False,
        "SendGrid's steady calls/s in a flood <= 1.1 x its rate limit (three processes)",
    ),
    "pipeline_cpu_us_per_rcpt": Goal(
        "pipeline_cpu_us_per_rcpt",
        150.0,
        False,
        "machine CPU-µs per recipient, acceptance + dispatch + its two webhook events "
        "(sandbox excluded) <= 150",
    ),
    "stats_read_ms_10m": Goal(
        "stats_read_ms_10m", 50.0, False, "a day's stats of a 10M-recipient user read in <= 50 ms"
    ),
    "stats_read_cold_ms_10m": Goal(
        "stats_read_cold_ms_10m",
        50.0,
        False,
        "the first read of that day after its writes, rolled up, in <= 50 ms",
    ),
    "idle_cores": Goal(
        "idle_cores",
        0.03,
        False,
        "the stack with no mail (services + Cassandra + RabbitMQ, sandbox excluded) <= 0.03 cores",
    ),
}


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``, or None when either is missing or the denominator is 0."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def reference(first: float | None, last: float | None) -> float | None:
    """The limit a ratio refers to: the mean of the first and last measurements if both exist."""
    if first is None:
        return last
    if last is None:
        return first
    return (first + last) / 2


def evaluate(
    figures: Mapping[str, float | None], refused: Mapping[str, str] | None = None
) -> dict[str, dict[str, object]]:
    """Judge every goal against ``figures`` (missing figures are not judged, and ``refused``
    ones, figure to reason, are judged invalid)."""
    refused = refused or {}
    return {
        name: goal.judge(figures.get(goal.figure), refused.get(goal.figure))
        for name, goal in GOALS.items()
    }


def all_passed(results: Mapping[str, Mapping[str, object]]) -> bool | None:
    """True when every judged goal passed, False if one failed, None if none was judged."""
    verdicts = [r["pass"] for r in results.values() if r["pass"] is not None]
    if not verdicts:
        return None
    return all(verdicts)
