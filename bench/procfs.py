"""Reading ``/proc``: per-process CPU time and memory, machine CPU, and finding processes.

The parsers are pure (they take the file's text), so they are unit-tested on fixtures; the
readers return None when a process has gone away.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

#: Clock ticks per second of ``utime``/``stime`` (USER_HZ, 100 on Linux).
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")


@dataclass(frozen=True, slots=True)
class CpuTimes:
    """User and system CPU of one process (all its threads), in clock ticks."""

    utime: int
    stime: int

    def seconds(self, ticks_per_second: int = CLOCK_TICKS) -> float:
        return (self.utime + self.stime) / ticks_per_second


@dataclass(frozen=True, slots=True)
class Memory:
    """Resident memory now (``VmRSS``) and its peak so far (``VmHWM``), in kB."""

    rss_kb: int
    hwm_kb: int


def parse_stat(text: str) -> CpuTimes:
    """CPU times from ``/proc/<pid>/stat``.

    The command name (field 2) is in parentheses and may itself contain spaces and
    parentheses, so fields are counted from the *last* closing parenthesis: ``utime`` and
    ``stime`` are fields 14 and 15 overall, i.e. the 12th and 13th after the name.
    """
    rest = text[text.rindex(")") + 2 :].split()
    return CpuTimes(utime=int(rest[11]), stime=int(rest[12]))


def parse_status(text: str) -> Memory:
    """``VmRSS`` and ``VmHWM`` from ``/proc/<pid>/status`` (0 when absent: kernel threads)."""
    values = {"VmRSS": 0, "VmHWM": 0}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in values:
            values[key] = int(rest.split()[0])
    return Memory(rss_kb=values["VmRSS"], hwm_kb=values["VmHWM"])


def parse_system_stat(text: str) -> tuple[int, int]:
    """``(busy, total)`` clock ticks of all CPUs from the ``cpu`` line of ``/proc/stat``.

    Busy is everything except ``idle`` and ``iowait``; guest time is already counted in user.
    """
    for line in text.splitlines():
        if line.startswith("cpu "):
            fields = [int(v) for v in line.split()[1:]]
            # user nice system idle iowait irq softirq steal [guest guest_nice]
            total = sum(fields[:8])
            idle = fields[3] + fields[4]
            return total - idle, total
    raise ValueError("no aggregate cpu line in /proc/stat")


def read_cpu(pid: int) -> CpuTimes | None:
    try:
        return parse_stat((PROC / str(pid) / "stat").read_text())
    except (OSError, ValueError, IndexError):
        return None


def read_memory(pid: int) -> Memory | None:
    try:
        return parse_status((PROC / str(pid) / "status").read_text())
    except (OSError, ValueError, IndexError):
        return None


def read_system() -> tuple[int, int]:
    return parse_system_stat((PROC / "stat").read_text())


def cpu_count() -> int:
    return os.cpu_count() or 1


def find_pids(*, comm: str | None = None, cmdline_contains: str | None = None) -> list[int]:
    """Pids whose ``comm`` equals ``comm`` and/or whose command line contains a string."""
    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if comm is not None and (entry / "comm").read_text().strip() != comm:
                continue
            if cmdline_contains is not None:
                cmdline = (
                    (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                )
                if cmdline_contains not in cmdline:
                    continue
        except OSError:
            continue
        found.append(int(entry.name))
    return sorted(found)


def rabbitmq_pid() -> int | None:
    """The RabbitMQ node (the Erlang VM, ``beam.smp``) with the most CPU time used."""
    pids = find_pids(comm="beam.smp")
    return max(pids, key=lambda p: (read_cpu(p) or CpuTimes(0, 0)).seconds(), default=None)


def cassandra_pid(state_dir: Path) -> int | None:
    """Cassandra's JVM: the pid file ``deploy/local`` writes, else a ``CassandraDaemon`` JVM."""
    pid_file = state_dir / "cassandra" / "cassandra.pid"
    try:
        pid = int("".join(ch for ch in pid_file.read_text() if ch.isdigit()))
    except (OSError, ValueError):
        pid = 0
    if pid and read_cpu(pid) is not None:
        return pid
    pids = find_pids(cmdline_contains="org.apache.cassandra.service.CassandraDaemon")
    return pids[0] if pids else None
