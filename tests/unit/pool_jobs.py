"""Jobs the template pool's tests run in its workers (module-level, so a worker can import
them by name): each takes ``parts=`` as every job does, and misbehaves in one way."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


def pid(*, parts: Any) -> int:
    """The worker's process id."""
    return os.getpid()


def settings_seen(*, parts: Any) -> list[str]:
    """The ``SAFEDELIVR_*`` variables the worker can read."""
    return sorted(k for k in os.environ if k.startswith("SAFEDELIVR_"))


def sleep(seconds: float, started: str | None = None, *, parts: Any) -> None:
    """Waits without using CPU (only the deadline ends it), once it made the file
    ``started`` (for a test to know the worker has the job)."""
    if started is not None:
        Path(started).touch()
    time.sleep(seconds)


def spin(*, parts: Any) -> None:
    """Computes until the kernel ends it (no deadline in the way)."""
    n = 3
    while True:
        n = (n * n) % (2**521 - 1)


def allocate(megabytes: int, *, parts: Any) -> int:
    """Holds ``megabytes`` of memory at once."""
    return len(bytearray(megabytes * 1024 * 1024))


def abort(*, parts: Any) -> None:
    """Dies of SIGABRT, as an interpreter whose allocation failed at a bad moment would."""
    os.abort()
