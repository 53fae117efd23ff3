"""Sampling the CPU and memory of every process of the run, and slicing it by time window.

A background task reads ``/proc`` for each tracked process (and the whole machine) every
``interval`` seconds, stamped with ``time.time()`` so that windows reported by child
processes line up. :meth:`ProcessSampler.window` then gives, per process, the CPU used within
any ``[start, end]`` (linearly interpolated between samples) and the memory seen there.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench import procfs

#: Label of the machine-wide CPU series.
SYSTEM = "_system"


@dataclass(slots=True)
class _Series:
    """Samples of one label: times, pids, cumulative CPU seconds and memory (kB)."""

    times: list[float] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)
    hwm: list[int] = field(default_factory=list)


def value_at(times: Sequence[float], values: Sequence[float], t: float) -> float:
    """A cumulative series at time ``t``, interpolated linearly, clamped to its ends."""
    if not times:
        raise ValueError("empty series")
    i = bisect.bisect_left(times, t)
    if i == 0:
        return values[0]
    if i >= len(times):
        return values[-1]
    t0, t1 = times[i - 1], times[i]
    if t1 == t0:
        return values[i]
    return values[i - 1] + (values[i] - values[i - 1]) * (t - t0) / (t1 - t0)


class ProcessSampler:
    """Tracks labelled processes; see the module docstring."""

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self._pids: dict[str, int] = {}
        self._series: dict[str, _Series] = {}
        self._task: asyncio.Task[None] | None = None

    def track(self, label: str, pid: int) -> None:
        """Sample ``pid`` under ``label`` from now on (replacing an earlier process)."""
        self._pids[label] = pid
        self._sample_one(label, pid, time.time())

    def untrack(self, label: str) -> None:
        pid = self._pids.pop(label, None)
        if pid is not None:
            self._sample_one(label, pid, time.time())

    def tracked(self) -> dict[str, int]:
        return dict(self._pids)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def sample(self) -> None:
        """Take one sample of every tracked process and of the machine now."""
        now = time.time()
        busy, _ = procfs.read_system()
        series = self._series.setdefault(SYSTEM, _Series())
        series.times.append(now)
        series.pids.append(0)
        series.cpu.append(busy / procfs.CLOCK_TICKS)
        series.rss.append(0)
        series.hwm.append(0)
        for label, pid in list(self._pids.items()):
            self._sample_one(label, pid, now)

    def _sample_one(self, label: str, pid: int, now: float) -> None:
        cpu = procfs.read_cpu(pid)
        mem = procfs.read_memory(pid)
        if cpu is None or mem is None:
            return
        series = self._series.setdefault(label, _Series())
        series.times.append(now)
        series.pids.append(pid)
        series.cpu.append(cpu.seconds())
        series.rss.append(mem.rss_kb)
        series.hwm.append(mem.hwm_kb)

    async def _loop(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.interval)

    def window(self, start: float, end: float) -> dict[str, dict[str, float | int]]:
        """Per label: CPU seconds within ``[start, end]``, % of one core, and memory in MB.

        Only the process instance alive at the end of the window counts (a label reused by a
        later process, such as a new load generator, is not mixed in).
        """
        self.sample()
        elapsed = max(end - start, 1e-9)
        out: dict[str, dict[str, float | int]] = {}
        for label, s in self._series.items():
            idx = [i for i, t in enumerate(s.times) if t <= end + self.interval * 2]
            if not idx:
                continue
            pid = s.pids[idx[-1]]
            mine = [i for i in idx if s.pids[i] == pid]
            times = [s.times[i] for i in mine]
            cpu = [s.cpu[i] for i in mine]
            if times[-1] < start:
                continue  # the process ended before this window
            used = max(0.0, value_at(times, cpu, end) - value_at(times, cpu, start))
            inside = [i for i in mine if start <= s.times[i] <= end] or [mine[-1]]
            entry: dict[str, float | int] = {
                "cpu_s": round(used, 3),
                "cpu_pct_of_core": round(100 * used / elapsed, 1),
            }
            if label != SYSTEM:
                entry["pid"] = pid
                entry["rss_mb_max"] = round(max(s.rss[i] for i in inside) / 1024, 1)
                entry["hwm_mb"] = round(max(s.hwm[i] for i in inside) / 1024, 1)
            else:
                entry["cpu_pct_of_machine"] = round(100 * used / elapsed / procfs.cpu_count(), 1)
            out[label] = entry
        return out

    def labels(self) -> list[str]:
        return [label for label in self._series if label != SYSTEM]

    def peak_hwm_mb(self, label: str) -> float | None:
        """The highest ``VmHWM`` seen for ``label`` over the whole run, in MB."""
        s = self._series.get(label)
        if s is None or not s.hwm:
            return None
        return round(max(s.hwm) / 1024, 1)
