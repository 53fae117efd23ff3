"""A service process's memory limit (``SAFEDELIVR_<SERVICE>_MEMORY_MAX_MB``), enforced by the
process itself.

The budgets (``shared.byte_budget``) are what keep a process under its limit whatever
arrives; this is the backstop when they do not. A :class:`MemoryGuard` reads the process's
resident memory (``/proc/self/statm``) about once a second, from the stall monitor's tick
(``shared.stall_monitor``), and the first time it is over the limit it logs an error and
retires the process: SIGTERM to itself, so it stops taking work, finishes what it holds
(a consumer's unacknowledged deliveries go back to their queue, never lost) and exits, and
uvicorn's supervisor (``--workers``) or systemd (``Restart=always``) starts a fresh one.
The unit's cgroup (``MemoryMax``) cannot say this per process, since a unit runs one worker
per core.
"""

from __future__ import annotations

import logging
import os
import resource
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

log = logging.getLogger(__name__)

_STATM: Final = Path("/proc/self/statm")
_PAGE: Final = resource.getpagesize()


def rss_bytes(statm: Path = _STATM) -> float | None:
    """The process's resident memory now, in bytes (None where ``/proc`` has no statm)."""
    try:
        fields = statm.read_text().split()
    except OSError:
        return None
    return float(int(fields[1]) * _PAGE)


def terminate_self() -> None:
    """Ask this process to shut down as a SIGTERM from outside would."""
    os.kill(os.getpid(), signal.SIGTERM)


@dataclass
class MemoryGuard:
    """Retires the process once its resident memory passes ``limit_mb`` (see the module
    docstring); ``read`` and ``retire`` are injectable so the rule is tested without a
    process to spend."""

    limit_mb: int
    read: Callable[[], float | None] = rss_bytes
    retire: Callable[[], None] = terminate_self
    retired: bool = False

    def check(self) -> bool:
        """Read the memory now; True once the process is retiring."""
        if self.retired:
            return True
        rss = self.read()
        if rss is not None and rss > self.limit_mb * 1024 * 1024:
            self.retired = True
            log.error(
                "resident memory %.0f MB is over this process's limit of %d MB: retiring it "
                "(it finishes what it holds and a fresh process takes its place)",
                rss / 1024 / 1024,
                self.limit_mb,
            )
            self.retire()
        return self.retired
