"""The event-loop stall monitor: its arithmetic over a clock and a scheduler the test owns,
its metrics as a scrape reads them, and its life on a real loop (no wall-clock figure)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from shared.infra.stall_monitor import (
    BUSY_SHARE,
    IDLE_INTERVAL,
    INTERVAL,
    StallMetrics,
    StallMonitor,
    cpu_wait_seconds,
    hwm_bytes,
    next_interval,
    peak_rss_bytes,
    run_delay_seconds,
    watching,
)
from tests.fakes.clocks import Ticks


class Handle:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Scheduler:
    """Keeps what was scheduled; the test runs it when it says the loop got to it."""

    def __init__(self) -> None:
        self.pending: list[tuple[float, Callable[[], None], Handle]] = []

    def __call__(self, delay: float, callback: Callable[[], None]) -> Handle:
        handle = Handle()
        self.pending.append((delay, callback, handle))
        return handle

    def run_next(self) -> None:
        _, callback, handle = self.pending.pop(0)
        if not handle.cancelled:
            callback()


def started(
    clock: Ticks, *, rss: float = 0.0, cpu_wait: Ticks | None = None
) -> tuple[StallMonitor, Scheduler, CollectorRegistry]:
    registry = CollectorRegistry()
    monitor = StallMonitor(
        StallMetrics.create(registry, peak_rss=lambda: rss),
        interval=0.02,
        clock=clock,
        cpu_wait=cpu_wait or (lambda: 0.0),
        adaptive=False,
    )
    scheduler = Scheduler()
    monitor.start(scheduler)
    return monitor, scheduler, registry


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_a_callback_run_on_time_records_no_stall() -> None:
    """A callback that runs when it was due records a lag of zero."""
    clock = Ticks()
    monitor, scheduler, registry = started(clock)

    clock.now += 0.02
    scheduler.run_next()

    assert monitor.longest == 0.0
    assert sample(registry, "safedelivr_event_loop_stall_seconds_count") == 1.0
    assert sample(registry, "safedelivr_event_loop_stall_max_seconds") == 0.0


def test_a_held_loop_records_how_late_the_callback_ran() -> None:
    """A loop held 1.5 s past a callback's due time records a stall of 1.5 s in the histogram
    and the max gauge."""
    clock = Ticks()
    monitor, scheduler, registry = started(clock)

    clock.now += 0.02 + 1.5
    scheduler.run_next()

    assert abs(monitor.longest - 1.5) < 1e-9
    assert sample(registry, "safedelivr_event_loop_stall_seconds_bucket", le="1.0") == 0.0
    assert sample(registry, "safedelivr_event_loop_stall_seconds_bucket", le="2.5") == 1.0
    assert abs((sample(registry, "safedelivr_event_loop_stall_max_seconds") or 0) - 1.5) < 1e-9


def test_the_longest_stall_says_how_much_of_it_the_thread_waited_for_a_cpu() -> None:
    """A 0.3 s stall during which the loop's thread waited 0.2 s in the run queue."""
    clock, waited = Ticks(), Ticks()
    _, scheduler, registry = started(clock, cpu_wait=waited)

    clock.now += 0.02 + 0.3
    waited.now += 0.2
    scheduler.run_next()

    found = sample(registry, "safedelivr_event_loop_stall_max_cpu_wait_seconds") or 0
    assert abs(found - 0.2) < 1e-9


def test_the_cpu_wait_is_that_of_the_longest_stall() -> None:
    """A shorter stall that waited longer for a CPU leaves the longest stall's wait."""
    clock, waited = Ticks(), Ticks()
    _, scheduler, registry = started(clock, cpu_wait=waited)

    clock.now += 0.02 + 0.3
    waited.now += 0.01
    scheduler.run_next()
    clock.now += 0.02 + 0.1
    waited.now += 0.1
    scheduler.run_next()

    found = sample(registry, "safedelivr_event_loop_stall_max_cpu_wait_seconds") or 0
    assert abs(found - 0.01) < 1e-9


def test_a_wait_for_a_cpu_longer_than_the_stall_counts_as_the_whole_stall() -> None:
    """Waits before the callback was due (its interval) are not the stall's: at most all of it."""
    clock, waited = Ticks(), Ticks()
    _, scheduler, registry = started(clock, cpu_wait=waited)

    clock.now += 0.02 + 0.05
    waited.now += 0.06
    scheduler.run_next()

    found = sample(registry, "safedelivr_event_loop_stall_max_cpu_wait_seconds") or 0
    assert abs(found - 0.05) < 1e-9


def test_schedstat_gives_the_run_queue_delay_in_seconds() -> None:
    """The second of schedstat's three numbers, in nanoseconds."""
    assert run_delay_seconds("812345678 250000000 1234\n") == 0.25


def test_a_thread_without_schedstat_waited_nothing(tmp_path: Path) -> None:
    """Where the kernel gives no schedstat the wait reads 0, not an error."""
    assert cpu_wait_seconds(tmp_path / "missing") == 0.0


def test_the_max_gauge_keeps_the_longest_stall_since_start() -> None:
    """A shorter stall after a longer one leaves the max at the longer one."""
    clock = Ticks()
    _, scheduler, registry = started(clock)

    clock.now += 0.02 + 0.3
    scheduler.run_next()
    clock.now += 0.02 + 0.1
    scheduler.run_next()

    assert abs((sample(registry, "safedelivr_event_loop_stall_max_seconds") or 0) - 0.3) < 1e-9
    assert sample(registry, "safedelivr_event_loop_stall_seconds_count") == 2.0


def test_each_callback_is_due_one_interval_after_the_previous_one_ran() -> None:
    """The next due time counts from when the previous callback ran, so one stall is
    recorded once and not again by the callbacks after it."""
    clock = Ticks()
    monitor, scheduler, _ = started(clock)

    clock.now += 0.02 + 2.0
    scheduler.run_next()
    clock.now += 0.02
    scheduler.run_next()

    assert [delay for delay, _, _ in scheduler.pending] == [0.02]
    assert abs(monitor.longest - 2.0) < 1e-9


def test_a_callback_run_early_counts_as_no_stall() -> None:
    """A timer that fires a little before its due time records zero, never a negative lag."""
    clock = Ticks()
    monitor, scheduler, registry = started(clock)

    clock.now += 0.019
    scheduler.run_next()

    assert monitor.longest == 0.0
    assert sample(registry, "safedelivr_event_loop_stall_seconds_sum") == 0.0


def test_stop_cancels_the_pending_callback_and_schedules_no_more() -> None:
    """After stop, the pending callback is cancelled and nothing further is scheduled."""
    clock = Ticks()
    monitor, scheduler, registry = started(clock)

    monitor.stop()
    scheduler.run_next()

    assert not monitor.running
    assert scheduler.pending == []
    assert sample(registry, "safedelivr_event_loop_stall_seconds_count") == 0.0


def test_peak_rss_is_read_when_scraped() -> None:
    """The peak RSS gauge reports what its source says at scrape time."""
    _, _, registry = started(Ticks(), rss=123456789.0)

    assert "safedelivr_peak_rss_bytes 1.23456789e+08" in generate_latest(registry).decode()


def test_watching_measures_on_the_running_loop_until_the_block_ends() -> None:
    """Inside ``watching`` the monitor's callbacks run on the loop; after it, none is left."""
    registry = CollectorRegistry()
    metrics = StallMetrics.create(registry)

    async def serve() -> StallMonitor:
        with watching(metrics) as monitor:
            # Each sleep ends no earlier than the monitor's callback due before it.
            for _ in range(3):
                await asyncio.sleep(monitor.interval)
        return monitor

    monitor = asyncio.run(serve())

    assert (sample(registry, "safedelivr_event_loop_stall_seconds_count") or 0) >= 2
    assert not monitor.running


def test_peak_rss_is_the_processs_own_high_water_mark() -> None:
    """The peak RSS is VmHWM of the status text, in bytes."""
    status = "Name:\tpython\nVmPeak:\t 900000 kB\nVmHWM:\t   51200 kB\nVmRSS:\t 40000 kB\n"

    assert hwm_bytes(status) == 51200 * 1024


def test_without_a_status_file_the_peak_rss_comes_from_getrusage() -> None:
    """Where /proc is absent, ru_maxrss stands in: some positive figure, never an error."""
    assert peak_rss_bytes(Path("/nonexistent/status")) > 0


def test_the_interval_backs_off_while_the_loop_is_idle_and_returns_when_it_works() -> None:
    """Below BUSY_SHARE of CPU the interval doubles up to IDLE_INTERVAL; at it, it is INTERVAL
    again at once (pure)."""
    assert next_interval(INTERVAL, 0.0, INTERVAL) == 2 * INTERVAL
    assert next_interval(0.64, 0.0, 0.64) == IDLE_INTERVAL
    assert next_interval(IDLE_INTERVAL, BUSY_SHARE * 1.0, 1.0) == INTERVAL
    assert next_interval(IDLE_INTERVAL, 0.0, 0.0) == INTERVAL


def test_an_idle_minute_costs_about_one_callback_a_second() -> None:
    """An idle loop (its thread off the CPU between callbacks) is woken 65 times in a simulated
    minute, not 3,000; work on the loop brings the 20 ms interval back at the next callback,
    which still reads a stall it ran into."""
    clock, cpu = Ticks(), Ticks()
    registry = CollectorRegistry()
    monitor = StallMonitor(
        StallMetrics.create(registry, peak_rss=lambda: 0.0),
        clock=clock,
        cpu_wait=lambda: 0.0,
        cpu=cpu,
    )
    scheduler = Scheduler()
    monitor.start(scheduler)
    ticks, start = 0, clock.now
    while clock.now - start < 60.0:
        delay = scheduler.pending[0][0]
        clock.now += delay
        scheduler.run_next()
        ticks += 1
    idle_interval = monitor.interval

    clock.now += IDLE_INTERVAL + 0.3  # work held the loop 0.3 s past the callback's time
    cpu.now += 0.3
    scheduler.run_next()

    assert (ticks, idle_interval) == (65, IDLE_INTERVAL)
    assert abs(monitor.longest - 0.3) < 1e-9
    assert monitor.interval == INTERVAL
    assert [delay for delay, _, _ in scheduler.pending] == [INTERVAL]
