"""How long a service's event loop is held, and the process's peak memory, as metrics.

A callback is scheduled every :data:`INTERVAL` while the loop works (its thread spends
:data:`BUSY_SHARE` of the time on the CPU), backing off to :data:`IDLE_INTERVAL` while it is
idle (:func:`next_interval`); when it runs, the time past the moment it was due is the
loop's lag: whatever held the loop (a parser running on it, a worker thread
holding the GIL, a long garbage collection) held it at least that long. A stall that began
just after a callback ran reads up to one interval short, so the figure is a lower bound,
one interval from the truth at most (the first stall after an idle spell: up to
IDLE_INTERVAL short, or unseen if it ends before the callback is due; from then on the loop
counts as working and the interval is INTERVAL again). Exported on the service's own
registry (its ``/metrics``):

* ``safedelivr_event_loop_stall_seconds``: a histogram of every callback's lag;
* ``safedelivr_event_loop_stall_max_seconds``: the longest lag since the monitor started;
* ``safedelivr_event_loop_stall_max_cpu_wait_seconds``: how much of that longest lag the
  loop's thread spent runnable but waiting for a CPU (the kernel's run-queue delay,
  ``/proc/thread-self/schedstat``; 0 where there is none): a stall that is mostly this was
  the machine's cores all busy, one that is not was the process itself (its loop, the GIL,
  a collection);
* ``safedelivr_peak_rss_bytes``: the process's peak resident memory, read when scraped:
  ``VmHWM`` of ``/proc/self/status`` on Linux, else ``getrusage``'s ``ru_maxrss``. Linux
  keeps ``ru_maxrss`` across ``exec``: a service started by a process of 300 MB reads 300 MB
  from its first instant, where ``VmHWM`` belongs to the process alone (measured).

Each service starts a monitor in its lifespan once it is serving, and stops it there
(:func:`watching`); the sandbox, a test double, has none. The cost is one callback and one
histogram observation every 20 ms. The clock and the scheduler are injectable, so the
arithmetic is tested without a loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

from prometheus_client import CollectorRegistry, Gauge, Histogram

#: Seconds between two callbacks while the loop works: finer than the 100 ms a stall is
#: judged by, and cheap.
INTERVAL: Final = 0.02
#: The longest interval, reached while the loop is idle (doubling from INTERVAL).
IDLE_INTERVAL: Final = 1.0
#: The share of an interval the loop's thread must spend on the CPU (outside the monitor's
#: own callbacks) for the loop to count as working. Every wake-up costs: at INTERVAL the
#: callbacks alone kept an idle process at 0.016 cores on the shared bench machine (the
#: timer's wake-up about half of it), more than the whole idle stack may use (issue 34).
BUSY_SHARE: Final = 0.05


def next_interval(interval: float, cpu: float, elapsed: float) -> float:
    """The interval after a callback (pure): :data:`INTERVAL` once the loop's thread spent
    :data:`BUSY_SHARE` of the time since the last callback on the CPU (``cpu`` seconds of
    ``elapsed``), else double the current one, up to :data:`IDLE_INTERVAL`."""
    if elapsed <= 0 or cpu >= BUSY_SHARE * elapsed:
        return INTERVAL
    return min(IDLE_INTERVAL, interval * 2)


#: Histogram buckets (seconds): from a few milliseconds to the length of a heartbeat.
BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: ``ru_maxrss`` is in kilobytes on Linux, in bytes on macOS.
_RSS_UNIT: Final = 1 if sys.platform == "darwin" else 1024
_STATUS: Final = Path("/proc/self/status")
_SCHEDSTAT: Final = Path("/proc/thread-self/schedstat")


def peak_rss_bytes(status: Path = _STATUS) -> float:
    """The most resident memory this process has held so far, in bytes."""
    try:
        text = status.read_text()
    except OSError:
        text = ""
    found = hwm_bytes(text)
    if found is not None:
        return found
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * _RSS_UNIT)


def hwm_bytes(status: str) -> float | None:
    """``VmHWM`` of a ``/proc/<pid>/status`` text, in bytes (None when it has none)."""
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return float(int(line.split()[1]) * 1024)
    return None


def cpu_wait_seconds(schedstat: Path = _SCHEDSTAT) -> float:
    """Seconds the calling thread has spent runnable, waiting for a CPU (0 where the kernel
    does not say)."""
    try:
        return run_delay_seconds(schedstat.read_text())
    except (OSError, ValueError, IndexError):
        return 0.0


def run_delay_seconds(schedstat: str) -> float:
    """The run-queue delay of a ``schedstat`` text (on-CPU ns, run-queue ns, timeslices)."""
    return int(schedstat.split()[1]) / 1e9


@dataclass(frozen=True)
class StallMetrics:
    stalls: Histogram
    longest: Gauge
    peak_rss: Gauge
    longest_cpu_wait: Gauge

    @classmethod
    def create(
        cls, registry: CollectorRegistry, peak_rss: Callable[[], float] = peak_rss_bytes
    ) -> StallMetrics:
        gauge = Gauge(
            "safedelivr_peak_rss_bytes",
            "Peak resident memory of this process (VmHWM, else getrusage ru_maxrss)",
            registry=registry,
        )
        gauge.set_function(peak_rss)
        return cls(
            Histogram(
                "safedelivr_event_loop_stall_seconds",
                "How late the event loop ran a callback due every 20 ms while it works (1 s idle)",
                buckets=BUCKETS,
                registry=registry,
            ),
            Gauge(
                "safedelivr_event_loop_stall_max_seconds",
                "The longest event-loop stall since the service started serving",
                registry=registry,
            ),
            gauge,
            Gauge(
                "safedelivr_event_loop_stall_max_cpu_wait_seconds",
                "Of the longest stall, the time the loop's thread waited for a CPU",
                registry=registry,
            ),
        )


class Cancellable(Protocol):
    def cancel(self) -> None: ...


#: Runs a callback after a delay in seconds (the loop's ``call_later``).
Schedule = Callable[[float, Callable[[], None]], Cancellable]


class StallMonitor:
    """Measures the loop's lag at every callback; see the module docstring."""

    def __init__(
        self,
        metrics: StallMetrics,
        *,
        interval: float = INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        cpu_wait: Callable[[], float] = cpu_wait_seconds,
        cpu: Callable[[], float] = time.thread_time,
        adaptive: bool = True,
    ) -> None:
        self.metrics = metrics
        self.interval = interval
        #: Whether the interval backs off while the loop is idle (:func:`next_interval`).
        self.adaptive = adaptive
        self._cpu = cpu
        self._cpu_mark = 0.0
        self._ran_at = 0.0
        self.longest = 0.0
        self._clock = clock
        self._cpu_wait = cpu_wait
        self._waited = 0.0
        self._schedule: Schedule | None = None
        self._handle: Cancellable | None = None
        self._due = 0.0

    def start(self, schedule: Schedule | None = None) -> None:
        """Begin measuring (on the running loop unless ``schedule`` is given)."""
        if schedule is None:
            loop = asyncio.get_running_loop()

            def on_loop(delay: float, callback: Callable[[], None]) -> Cancellable:
                return loop.call_later(delay, callback)

            schedule = on_loop
        self._schedule = schedule
        self._waited = self._cpu_wait()
        self._arm()

    @property
    def running(self) -> bool:
        return self._handle is not None

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = self._schedule = None

    def _arm(self) -> None:
        assert self._schedule is not None  # noqa: S101 - only called while started
        self._ran_at = self._clock()
        self._due = self._ran_at + self.interval
        self._handle = self._schedule(self.interval, self._tick)
        # After the callback's own work: what the thread spends from here is the loop's.
        self._cpu_mark = self._cpu()

    def _tick(self) -> None:
        if self._schedule is None:
            return  # stopped after this callback was already on its way
        now = self._clock()
        lag = max(0.0, now - self._due)
        if self.adaptive:
            worked = self._cpu() - self._cpu_mark
            self.interval = next_interval(self.interval, worked, now - self._ran_at)
        # Read on the loop's thread, whose callback this is: its wait since the last tick
        # (while it slept in the poll it was not runnable, so this is the stall's).
        waited, self._waited = self._waited, self._cpu_wait()
        self.metrics.stalls.observe(lag)
        if lag > self.longest:
            self.longest = lag
            self.metrics.longest.set(lag)
            self.metrics.longest_cpu_wait.set(min(lag, max(0.0, self._waited - waited)))
        self._arm()


@contextlib.contextmanager
def watching(metrics: StallMetrics) -> Iterator[StallMonitor]:
    """A monitor on the running loop for the duration of the block (a lifespan's serving)."""
    monitor = StallMonitor(metrics)
    monitor.start()
    try:
        yield monitor
    finally:
        monitor.stop()
