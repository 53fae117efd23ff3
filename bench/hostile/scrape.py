"""Reading a service's stall and memory figures from its ``/metrics``
(``shared.infra.stall_monitor``): :func:`figures` is pure, :func:`scrape` fetches.

A service whose event loop is held cannot answer until it is let go, so a scrape waits long
(its timeout is the run's): an answer that never comes is itself the figure (the loop was
held at least that long, or the process is gone).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

STALL_MAX = "safedelivr_event_loop_stall_max_seconds"
STALL_CPU_WAIT = "safedelivr_event_loop_stall_max_cpu_wait_seconds"
PEAK_RSS = "safedelivr_peak_rss_bytes"


@dataclass(frozen=True, slots=True)
class Scraped:
    """One service's figures, or why there are none."""

    stall_s: float | None
    rss_mb: float | None
    answered: bool
    problem: str | None = None
    waited_s: float = 0.0
    stall_cpu_wait_s: float | None = None
    """Of the longest stall, the time the loop's thread waited for a CPU."""


def figures(text: str) -> tuple[float | None, float | None]:
    """``(longest stall in seconds, peak RSS in MB)`` from a metrics page; None for a figure
    the page does not have (a process without the monitor)."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (STALL_MAX, PEAK_RSS) and not sample.labels:
                values[sample.name] = float(sample.value)
    rss = values.get(PEAK_RSS)
    return values.get(STALL_MAX), None if rss is None else round(rss / 1024 / 1024, 1)


def cpu_wait(text: str) -> float | None:
    """Of the longest stall on a metrics page, the seconds its thread waited for a CPU (None
    for a page without it)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == STALL_CPU_WAIT and not sample.labels:
                return float(sample.value)
    return None


async def scrape(client: httpx.AsyncClient, base_url: str, timeout: float) -> Scraped:
    started = time.monotonic()
    try:
        response = await client.get(f"{base_url}/metrics", timeout=timeout)
        response.raise_for_status()
    except httpx.TimeoutException:
        waited = time.monotonic() - started
        return Scraped(None, None, False, f"no answer within {waited:.0f}s", waited)
    except httpx.HTTPError as exc:
        waited = time.monotonic() - started
        return Scraped(None, None, False, f"{type(exc).__name__}: {exc}", waited)
    stall, rss = figures(response.text)
    waited = time.monotonic() - started
    return Scraped(stall, rss, True, waited_s=waited, stall_cpu_wait_s=cpu_wait(response.text))
