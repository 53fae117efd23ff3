"""A worker process of ``shared.templates.template_pool``: its limits, and the jobs it runs until
its pipe closes.

Started as ``python -m shared.templates.template_worker FD MEMORY_BYTES CPU_SECONDS`` with ``FD``
one end of a socket pair. It sets its address-space limit (``RLIMIT_AS``: a template needing more is
a ``MemoryError`` here) once its modules are imported, says it is ready, then runs one job
after another: each gets ``CPU_SECONDS`` of CPU from when it starts (``RLIMIT_CPU``: past
them the kernel's SIGXCPU ends the process, which the pool tells as ``cpu_time``). A job is
a module-level function and its arguments, called with ``parts=`` the worker's own compiled
sources; its answer goes back as plain data, ``(kind, value or message, limit, fields)``:
kind ``ok``, ``limit``, ``render`` or ``failed`` (a bug of ours, not the template's).
After passing the memory limit it exits (its heap is whatever the breach left); the pool
starts another.
"""

from __future__ import annotations

import math
import os
import resource
import sys
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

# Imported before the memory limit is set, so that a job never pays for them.
from shared.templates import template_use  # noqa: F401 - the jobs' module, imported ahead
from shared.templates.template_limits import Limit
from shared.templates.template_render import CompiledParts, LimitError, RenderError


def main(argv: list[str]) -> None:
    fd, memory_bytes, cpu_seconds = (int(a) for a in argv)
    serve(Connection(fd), memory_bytes, cpu_seconds)


def serve(conn: Connection, memory_bytes: int, cpu_seconds: int) -> None:
    """Set the limits, say ready, and run jobs until the pipe closes."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a kill past the CPU limit dumps nothing
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    parts = CompiledParts()
    conn.send(("ready", os.getpid()))
    while True:
        try:
            job, args = conn.recv()
        except (EOFError, OSError):
            return
        except Exception as exc:  # noqa: BLE001 - a job that cannot be read (its module) is a bug of ours, told
            conn.send(
                ("failed", f"the job cannot be read: {type(exc).__name__}: {exc}", None, None)
            )
            continue
        _limit_cpu(cpu_seconds)
        answer = _answer(job, args, parts)
        try:
            conn.send(answer)
        except (EOFError, OSError):
            return
        except Exception as exc:  # noqa: BLE001 - an answer that cannot be sent (its type, memory) is told instead
            conn.send(("failed", f"the answer cannot be sent: {type(exc).__name__}", None, None))
        if answer[0] == "limit" and answer[2] == Limit.MEMORY:
            return


def _limit_cpu(seconds: int) -> None:
    """The next ``seconds`` of CPU (from the whole seconds used so far) are this job's."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    soft = math.ceil(used.ru_utime + used.ru_stime) + seconds
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _answer(
    job: Callable[..., Any], args: tuple[Any, ...], parts: CompiledParts
) -> tuple[Any, ...]:
    try:
        return ("ok", job(*args, parts=parts), None, None)
    except LimitError as exc:
        return ("limit", str(exc), exc.limit, exc.fields)
    except RenderError as exc:
        return ("render", str(exc), None, exc.fields)
    except MemoryError:
        return ("limit", "the template needs too much memory", Limit.MEMORY, None)
    except RecursionError:
        return ("limit", "the template recurses too deeply", Limit.NESTING, None)
    except Exception as exc:  # noqa: BLE001 - our own job failed: told to the caller as ours, the worker goes on
        return ("failed", f"{type(exc).__name__}: {exc}", None, None)


if __name__ == "__main__":
    main(sys.argv[1:])
