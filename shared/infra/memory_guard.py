"""A service process's memory limit (``SAFEDELIVR_<SERVICE>_MEMORY_MAX_MB``), enforced by the
process itself.

The budgets (``shared.infra.byte_budget``) are what keep a process under its limit whatever
arrives; this is the backstop when they do not. A :class:`MemoryGuard` reads the process's
resident memory (``/proc/self/statm``) about once a second once the service is serving
(:func:`guarded`), and the first time it is over the limit it logs an error and retires the
process: SIGTERM to itself, so it stops taking work, finishes what it holds (a consumer's
unacknowledged deliveries go back to their queue, never lost) and exits, and uvicorn's
supervisor (``--workers``) or systemd (``Restart=always``) starts a fresh one. The unit's
cgroup (``MemoryMax``) cannot say this per process, since a unit runs one worker per core.

Only a service process arms it: the command line wraps the app it serves with
:func:`guarded`. The app factories do not, since a process that builds many apps (the test
suite, a harness) is not theirs to retire.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)

_STATM: Final = Path("/proc/self/statm")
_PAGE: Final = resource.getpagesize()
#: Seconds between two readings of the process's memory.
EVERY: Final = 1.0


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


def guarded(app: ASGIApp, guard: MemoryGuard, *, every: float = EVERY) -> ASGIApp:
    """``app``, its process's memory checked by ``guard`` every ``every`` seconds from the
    moment its lifespan start-up has completed until its lifespan ends."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return
        watch: asyncio.Task[None] | None = None

        async def send_started(message: Message) -> None:
            nonlocal watch
            await send(message)
            if message["type"] == "lifespan.startup.complete":
                watch = asyncio.get_running_loop().create_task(_watch(guard, every))

        try:
            await app(scope, receive, send_started)
        finally:
            if watch is not None:
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch

    return wrapped


async def _watch(guard: MemoryGuard, every: float) -> None:
    while True:
        if guard.check():
            return
        await asyncio.sleep(every)
