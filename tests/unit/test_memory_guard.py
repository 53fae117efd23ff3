"""A process's memory limit, enforced by the process: over it, the process retires itself
once (a fresh one takes its place); under it, nothing happens. Checked from the stall
monitor's tick."""

from __future__ import annotations

import resource
from pathlib import Path

from prometheus_client import CollectorRegistry

from shared.memory_guard import MemoryGuard, rss_bytes
from shared.stall_monitor import GUARD_EVERY, StallMetrics, StallMonitor
from tests.unit.test_stall_monitor import Clock, Scheduler

MB = 1024 * 1024


class Memory:
    """Resident memory the test sets, and how many times the process was retired."""

    def __init__(self, mb: float) -> None:
        self.mb = mb
        self.retired = 0

    def read(self) -> float:
        return self.mb * MB

    def retire(self) -> None:
        self.retired += 1


def test_a_process_under_its_limit_is_left_alone() -> None:
    """At or under the limit, the guard does nothing."""
    memory = Memory(100)
    guard = MemoryGuard(100, read=memory.read, retire=memory.retire)

    assert guard.check() is False
    assert memory.retired == 0


def test_a_process_over_its_limit_retires_once() -> None:
    """Over the limit, the process is retired, and only once however often it is checked
    while it finishes what it holds."""
    memory = Memory(101)
    guard = MemoryGuard(100, read=memory.read, retire=memory.retire)

    assert guard.check() is True
    memory.mb = 50
    assert guard.check() is True
    assert memory.retired == 1


def test_without_a_figure_nothing_is_retired() -> None:
    """Where the memory cannot be read, the process is not retired on a guess."""
    retired: list[bool] = []
    guard = MemoryGuard(1, read=lambda: None, retire=lambda: retired.append(True))

    assert guard.check() is False
    assert retired == []


def test_the_resident_memory_is_read_from_statm(tmp_path: Path) -> None:
    """The second field of statm is the resident pages; a missing file gives no figure."""
    statm = tmp_path / "statm"
    statm.write_text("5000 300 20 1 0 400 0\n")

    assert rss_bytes(statm) == 300 * resource.getpagesize()
    assert rss_bytes(tmp_path / "absent") is None


def test_the_stall_monitor_checks_its_guard_about_once_a_second() -> None:
    """The guard is checked every GUARD_EVERY ticks of the monitor, not at each."""
    memory = Memory(500)
    guard = MemoryGuard(100, read=memory.read, retire=memory.retire)
    clock = Clock()
    monitor = StallMonitor(
        StallMetrics.create(CollectorRegistry(), peak_rss=lambda: 0.0),
        interval=0.02,
        clock=clock,
        guard=guard,
    )
    scheduler = Scheduler()
    monitor.start(scheduler)

    for _ in range(GUARD_EVERY - 1):
        clock.now += 0.02
        scheduler.run_next()
    assert memory.retired == 0

    clock.now += 0.02
    scheduler.run_next()
    assert memory.retired == 1
