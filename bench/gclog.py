"""Cassandra's JVM garbage-collection pauses, read from the GC log ``deploy/local`` enables.

A request that reaches Cassandra during a stop-the-world pause waits it out, so pauses
explain much of a tail latency that the CPU figures do not. :func:`pauses` returns the
pauses within a time window from ``<state>/cassandra/logs/gc.log*`` (unified JVM logging:
``[2026-11-20T23:28:32.779+0000][...] GC(3350) Pause Young (...) 796M->431M(1024M) 16.464ms``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

_LINE = re.compile(r"^\[([^\]]+)\].*\bPause (\w+)\b.*?([\d.]+)ms\s*$")


@dataclass(frozen=True, slots=True)
class Pause:
    at: float
    """Epoch seconds when the pause was logged (its end)."""
    kind: str
    """``Young``, ``Remark``, ``Cleanup``, ``Full`` ..."""
    ms: float


def parse_line(line: str) -> Pause | None:
    """The pause a GC log line reports, or None for any other line."""
    match = _LINE.match(line.strip())
    if match is None:
        return None
    try:
        at = datetime.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()
    except ValueError:
        return None
    return Pause(at=at, kind=match.group(2), ms=float(match.group(3)))


def summary(found: list[Pause]) -> dict[str, float | int]:
    """Count, total and longest pause (ms)."""
    return {
        "pauses": len(found),
        "total_ms": round(sum(p.ms for p in found), 1),
        "max_ms": round(max((p.ms for p in found), default=0.0), 1),
    }


def pauses(state_dir: Path, start: float, end: float) -> list[Pause]:
    """Every pause logged within ``[start, end]`` (empty when there is no GC log)."""
    found = []
    for path in sorted((state_dir / "cassandra" / "logs").glob("gc.log*")):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if "Pause" not in line:
                continue
            pause = parse_line(line)
            if pause is not None and start <= pause.at <= end:
                found.append(pause)
    return sorted(found, key=lambda p: p.at)
