"""The garbage collector's and the C allocator's policy for a long-running service process.

Measured under ``make bench`` (API at half its maximum, ``gc.callbacks`` timing every
collection): with CPython's defaults the API ran about one full (generation 2) collection a
second, each walking every object the imports and the Cassandra driver had made, and each
stopping the event loop for 50-210 ms: the largest part of the open-loop p99 then.
:func:`gc.freeze` moves everything alive once the process is ready (modules, prepared
statements, connection pools) into a permanent generation that no collection walks again: a
full collection then walks only what requests made (about 10k objects, 6-9 ms). Raising the
thresholds as well cut the collections further but cost the webhook service 20 MB of peak
RSS (cyclic garbage lives longer) for no measurable latency gain, so they stay CPython's.

:func:`tune_malloc` sets glibc's allocator (``mallopt``) before anything else runs. By
default each worker thread (``asyncio.to_thread``, the Cassandra driver) gets a malloc arena
of its own, and the threshold above which an allocation is its own mapping rises with every
large block freed, up to 32 MB: the megabytes of a large request parsed in one thread and
freed in another then stayed resident in arenas nothing reused. Measured under ``make
hostile`` (three 10 MB batches, 50 MB imports): peak RSS 185 -> 151 MB in the API and
219-242 -> 192 MB in the consumers with two arenas and a fixed 256 KiB threshold.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from typing import Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: ``mallopt`` parameters (glibc's malloc.h) and the values :func:`tune_malloc` gives them.
M_MMAP_THRESHOLD: Final = -3
M_ARENA_MAX: Final = -8
#: Allocations of this many bytes or more are mappings of their own, unmapped when freed.
MMAP_THRESHOLD: Final = 256 * 1024
#: Malloc arenas shared by all the threads of a process.
ARENA_MAX: Final = 2


def tune_malloc() -> bool:
    """Set glibc's allocator policy (see the module docstring); False where the C library
    has no ``mallopt`` (not glibc), or refused a value."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    mallopt = getattr(ctypes.CDLL(name), "mallopt", None)
    if mallopt is None:
        return False
    threshold: bool = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    arenas: bool = mallopt(M_ARENA_MAX, ARENA_MAX) == 1
    return threshold and arenas


def settle() -> None:
    """Call once a service is ready: collect what start-up left, then freeze the rest."""
    gc.collect()
    gc.freeze()


def settle_when_started(app: ASGIApp) -> ASGIApp:
    """``app``, calling :func:`settle` once its lifespan start-up has completed (the service
    entry points wrap their app with this; tests, which start many apps in one process, do
    not)."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return

        async def send_settled(message: Message) -> None:
            await send(message)
            if message["type"] == "lifespan.startup.complete":
                settle()

        await app(scope, receive, send_settled)

    return wrapped
