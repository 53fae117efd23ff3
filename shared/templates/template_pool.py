"""Users' templates compiled and rendered in worker processes under hard limits, so that no
template can stall an event loop or exhaust a service's memory.

The sandbox (``shared.templates.template_render``, ``shared.templates.template_limits``) checks
between Python steps; a single step running in C (compiling a 500 KB source, multiplying integers,
building up megabytes statement after statement) holds the GIL until it ends. So templates run in a
:class:`TemplatePool`: a few processes of their own (``SAFEDELIVR_TEMPLATES_WORKERS``,
``shared.templates.template_worker``), each with an address-space limit (``RLIMIT_AS``) and a
CPU-time limit per job (``RLIMIT_CPU``: the kernel ends a worker still computing past it), and a
wall-clock deadline the pool holds each job to (it kills the worker). A worker that breaches
a limit, crashes or is abandoned by its caller is replaced; its caller gets a
:class:`shared.templates.template_render.LimitError` naming the limit (``time``, ``cpu_time``,
``memory``, or one the sandbox refused), or a
:class:`~shared.templates.template_render.RendererCrashed` for any other death while it ran the job.

A job (:meth:`TemplatePool.run`) is one call of a module-level function with ``parts=`` the
worker's own compiled sources: a version checked, a batch's copies rendered, a version's
variables. There is one per request or campaign slice, so its cost in IPC (the sources and
data pickled through a socket) is per batch, never per recipient.

Errors::

    RendererUnavailable      the pool cannot take a job now (503, try again): not the
     +-- RendererBusy        template's doing; every worker stayed busy too long

Workers are fresh interpreters (``python -m shared.templates.template_worker``), not forks of a
process running threads and connections, and get the environment without the
``SAFEDELIVR_*`` variables. They exit when their socket closes: an API process that dies
leaves none behind (one in the middle of a job ends at its CPU limit). The :class:`Renderer`
protocol is what callers use; tests run jobs in-process through its twin.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar

from shared.infra.config import ENV_PREFIX, TemplateSettings
from shared.templates.template_limits import Limit
from shared.templates.template_render import LimitError, RendererCrashed, RenderError

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds a new worker may take to import its modules and say it is ready.
_STARTUP: Final = 60.0
#: Seconds to wait for a killed worker to be reaped.
_REAP: Final = 5.0
#: Where ``shared`` is, for the workers to import the same code.
_ROOT: Final = str(Path(__file__).resolve().parents[2])


class RendererUnavailable(Exception):
    """The pool cannot take a job now: it is closed, or no worker could be started."""


class RendererBusy(RendererUnavailable):
    """Every worker stayed busy for as long as a job may wait for one."""


class Renderer(Protocol):
    """Runs template jobs: ``job(*args, parts=...)`` and its result, or the RenderError it
    raised (a LimitError for a limit passed, RendererCrashed), or RendererUnavailable."""

    async def run(self, job: Callable[..., T], *args: Any) -> T: ...


# --------------------------------------------------------------------------- the API side


@dataclass(eq=False)
class _Worker:
    process: subprocess.Popen[bytes]
    conn: Connection
    killed: str | None = None
    """Why the pool killed it (its death is then not the job's crash)."""

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self, why: str) -> None:
        self.killed = self.killed or why
        with contextlib.suppress(OSError):
            self.process.kill()


@dataclass(frozen=True, slots=True)
class _Outcome:
    """A job's end as its thread saw it, and the worker to put back (None: a slot to fill)."""

    worker: _Worker | None
    value: Any = None
    error: BaseException | None = None
    vacant: bool = False
    """The slot had no worker and the job started none: it goes back empty, not refilled
    (a pool that is not warm starts a worker only for a job that can use it)."""


@dataclass(eq=False)
class _Job:
    """What a job's caller and its thread share: the worker that has the job once the thread
    has sent it (the slot's, or one it started for an empty slot), and whether the caller
    gave up, so that either side that learns last kills that worker."""

    worker: _Worker | None = None
    abandoned: bool = False

    def hand_to(self, worker: _Worker) -> None:
        """In the thread: ``worker`` has the job (killed at once if its caller is gone)."""
        self.worker = worker
        if self.abandoned:
            worker.kill("abandoned")

    def gone(self) -> bool:
        """Whether the caller gave up (a call, not the field: another thread sets it)."""
        return self.abandoned

    def abandon(self) -> None:
        """On the loop: nobody waits for the answer; free the worker now, not at the deadline."""
        self.abandoned = True
        if self.worker is not None:
            self.worker.kill("abandoned")


class TemplatePool:
    """``settings.workers`` worker processes and the jobs they run (see the module).

    Build it, ``await start()`` it in a service's lifespan and ``await close()`` it there."""

    def __init__(self, settings: TemplateSettings) -> None:
        self.settings = settings
        # A thread per job in flight and per worker being replaced, at most.
        self._threads = ThreadPoolExecutor(2 * settings.workers, "template-pool")
        self._idle: asyncio.Queue[_Worker | None] = asyncio.Queue()
        self._workers: set[_Worker] = set()
        self._refills: set[asyncio.Future[None]] = set()
        self._busy = 0
        self._closed = False

    @property
    def busy(self) -> int:
        """Jobs running now."""
        return self._busy

    def pids(self) -> list[int]:
        """The live workers' process ids (tests see a worker replaced by them)."""
        return sorted(w.process.pid for w in list(self._workers) if w.alive())

    async def start(self) -> None:
        """Start every worker (each imports its modules first: about a second); when the
        settings say not ``warm``, leave each slot empty, for its first job to start one."""
        if not self.settings.warm:
            for _ in range(self.settings.workers):
                self._idle.put_nowait(None)
            return
        loop = asyncio.get_running_loop()
        starting = [
            loop.run_in_executor(self._threads, self._start_worker)
            for _ in range(self.settings.workers)
        ]
        try:
            started = await asyncio.gather(*starting)
        except BaseException:
            await asyncio.wait(starting)
            await self.close()
            raise
        for worker in started:
            self._idle.put_nowait(worker)

    async def close(self) -> None:
        """Kill every worker; jobs still running end with RendererUnavailable."""
        self._closed = True
        for worker in list(self._workers):
            worker.kill("closing")
        self._idle.put_nowait(None)  # wakes a job waiting for a worker (each passes it on)
        if self._refills:
            await asyncio.wait(set(self._refills))
        await asyncio.to_thread(self._threads.shutdown, True)
        await asyncio.to_thread(self._reap_all)

    async def run(self, job: Callable[..., T], *args: Any) -> T:
        """``job(*args, parts=...)`` run in a worker within the limits (see the module)."""
        slot = await self._take()
        self._busy += 1
        handed = _Job()
        running = asyncio.get_running_loop().run_in_executor(
            self._threads, self._exchange, slot, handed, job, args
        )
        running.add_done_callback(self._put_back)
        try:
            outcome = await asyncio.shield(running)
        except asyncio.CancelledError:
            # The thread sees its worker die (one it is still starting, as soon as it is up),
            # and the slot is refilled when the thread ends.
            handed.abandon()
            raise
        if outcome.error is not None:
            raise outcome.error
        value: T = outcome.value
        return value

    async def _take(self) -> _Worker | None:
        if self._closed:
            raise _closing()
        try:
            # ``get`` takes the slot only as it returns, so cancelled (or timed out, which
            # cancels) it leaves the slot queued and wakes the next job: none is lost. It runs
            # in this task, not in ``wait_for``'s own, which on Python 3.11 answers a slot
            # that arrives with a cancellation and drops the cancellation.
            async with asyncio.timeout(self.settings.wait):
                slot = await self._idle.get()
        except TimeoutError:
            raise RendererBusy(
                f"every template renderer stayed busy for {self.settings.wait:g} s"
            ) from None
        if self._is_closed():
            self._idle.put_nowait(slot)  # the next job waiting is woken, and refused too
            raise _closing()
        return slot

    def _is_closed(self) -> bool:
        return self._closed

    def _put_back(self, running: asyncio.Future[_Outcome]) -> None:
        self._busy -= 1
        # _exchange never raises; were it to, its slot is refilled rather than lost.
        outcome = None if running.exception() is not None else running.result()
        worker = outcome.worker if outcome is not None else None
        if (worker is not None and worker.alive()) or (outcome is not None and outcome.vacant):
            self._idle.put_nowait(worker)
            return
        if self._closed:
            self._idle.put_nowait(None)
            return
        # A worker replaced after its job: started apart, so the job's caller has its
        # answer at once and the slot comes back when the new worker is ready.
        refill = asyncio.ensure_future(self._refill())
        self._refills.add(refill)
        refill.add_done_callback(self._refills.discard)

    async def _refill(self) -> None:
        worker = await asyncio.get_running_loop().run_in_executor(self._threads, self._replacement)
        self._idle.put_nowait(worker)

    # ----------------------------------------------------------------- in a pool thread

    def _exchange(
        self, slot: _Worker | None, handed: _Job, job: Callable[..., Any], args: tuple[Any, ...]
    ) -> _Outcome:
        """One job from sending to its answer (or the worker's death); never raises."""
        try:
            payload = ForkingPickler.dumps((job, args))
        except Exception as exc:  # noqa: BLE001 - a job we cannot send is a bug of ours, told to its caller
            unsent = RuntimeError(f"the template job cannot be sent: {exc}")
            return _Outcome(slot, error=unsent, vacant=slot is None)
        if handed.gone():
            # Its caller left before the job reached a worker: the slot goes back as it was.
            gone = RendererUnavailable("the job was abandoned")
            return _Outcome(slot, error=gone, vacant=slot is None)
        try:
            worker = self._deliver(slot, payload, handed)
        except (OSError, EOFError, RendererUnavailable) as exc:
            if handed.gone():  # its caller is gone: nothing went wrong
                return _Outcome(None, error=RendererUnavailable("the job was abandoned"))
            log.error("no template renderer could take the job: %s", exc)
            return _Outcome(None, error=RendererUnavailable("no template renderer could start"))
        if not worker.conn.poll(self.settings.deadline):
            worker.kill("deadline")
            self._reap(worker)
            log.warning("a template passed the deadline: its renderer is replaced")
            error = LimitError(
                Limit.TIME,
                f"compiling and rendering took longer than {self.settings.deadline:g} s",
            )
            return _Outcome(None, error=error)
        try:
            reply = worker.conn.recv()
        except (EOFError, OSError):
            return _Outcome(None, error=self._death(worker))
        except Exception as exc:  # noqa: BLE001 - an answer we cannot read (its type) is a bug of ours; the worker is fine
            return _Outcome(worker, error=RuntimeError(f"a template job's answer: {exc}"))
        return self._outcome(worker, reply)

    def _deliver(self, slot: _Worker | None, payload: memoryview, handed: _Job) -> _Worker:
        """The worker the payload was sent to: the slot's, or a new one when it has none or
        its worker died idle (not this job's doing)."""
        if slot is not None and slot.alive():
            try:
                handed.hand_to(slot)
                slot.conn.send_bytes(payload)
                return slot
            except OSError:
                pass
        if slot is not None:
            slot.kill("died idle")
            self._reap(slot)
        if self._closed:
            raise _closing()
        if handed.abandoned:
            raise RendererUnavailable("the job was abandoned")
        worker = self._start_worker()
        handed.hand_to(worker)
        try:
            worker.conn.send_bytes(payload)
        except OSError:
            # Killed as it started (its caller left), or dead at once: reaped here, since no
            # answer will be waited for.
            worker.kill("not sent")
            self._reap(worker)
            raise
        return worker

    def _outcome(self, worker: _Worker, reply: tuple[Any, ...]) -> _Outcome:
        kind, value, limit, fields = reply
        if kind == "ok":
            return _Outcome(worker, value=value)
        if kind == "render":
            return _Outcome(worker, error=RenderError(value, fields=fields))
        if kind == "failed":
            return _Outcome(worker, error=RuntimeError(f"a template job failed: {value}"))
        error = LimitError(Limit(limit), value, fields=fields)
        if limit != Limit.MEMORY:
            return _Outcome(worker, error=error)
        log.warning("a template passed the memory limit: its renderer is replaced")
        self._reap(worker)  # it exits by itself
        return _Outcome(None, error=error)

    def _death(self, worker: _Worker) -> BaseException:
        """What a worker that died during a job tells its caller."""
        self._reap(worker)
        if worker.killed is not None:
            return RendererUnavailable(f"the template renderer was stopped ({worker.killed})")
        code = worker.process.returncode
        if code == -signal.SIGXCPU:
            log.warning("a template passed the CPU limit: its renderer is replaced")
            return LimitError(
                Limit.CPU_TIME,
                f"the template used more than {self.settings.cpu_seconds} s of CPU",
            )
        what = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else None
        what = what or f"exit status {code}"
        log.warning("a template renderer died while rendering (%s): replaced", what)
        return RendererCrashed(f"the process rendering the template died ({what})")

    def _replacement(self) -> _Worker | None:
        """A new worker for a slot (None when the pool is closing or none can start: the
        next job that takes the slot tries again)."""
        if self._closed:
            return None
        try:
            return self._start_worker()
        except (OSError, EOFError, RendererUnavailable) as exc:
            if not self._closed:  # else the pool killed it as it started
                log.error("a template renderer could not be started: %s", exc)
            return None

    def _start_worker(self) -> _Worker:
        ours, theirs = socket.socketpair()
        memory = self.settings.memory_mb * 1024 * 1024
        command = [sys.executable, "-m", "shared.templates.template_worker"]
        args = [str(theirs.fileno()), str(memory), str(self.settings.cpu_seconds)]
        try:
            process = subprocess.Popen(  # noqa: S603 - our own interpreter and module
                [*command, *args],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                env=_worker_environment(),
            )
        finally:
            theirs.close()  # ours sees EOF once the worker is gone
        worker = _Worker(process, Connection(ours.detach()))
        self._workers.add(worker)
        try:
            ready = worker.conn.poll(_STARTUP) and worker.conn.recv()[0] == "ready"
        except (EOFError, OSError):
            ready = False
        if not ready:
            worker.kill("not ready")
            self._reap(worker)
            raise RendererUnavailable(f"a template renderer did not start ({process.returncode})")
        return worker

    def _reap(self, worker: _Worker) -> None:
        try:
            worker.process.wait(_REAP)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL is not refused
            log.error("template renderer %s did not end", worker.process.pid)
            return
        worker.conn.close()
        self._workers.discard(worker)

    def _reap_all(self) -> None:
        for worker in list(self._workers):
            worker.kill("closing")  # one a refill started while the pool closed, too
            self._reap(worker)


def _closing() -> RendererUnavailable:
    return RendererUnavailable("the template renderer is shutting down")


def _worker_environment() -> dict[str, str]:
    """This process's environment for a worker, without our settings (secrets among them),
    and with our code first on its path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH")) if p)
    return env
