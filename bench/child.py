"""Child processes of the benchmark and the line protocol they speak.

Load generators, raw loops and feeders run as separate processes (``python -m bench.<x>``) so
their CPU is accounted separately and they never share an event loop with what they measure.
A child writes one JSON object per line on stdout: ``{"kind": "progress", "text": ...}``
while it runs, ``{"kind": "ready", ...}`` when it waits for ``go`` on stdin,
``{"kind": "measured"}`` when its work is done and it waits for ``go`` again before closing
its connections (raw loops and webhook load: the parent reads Cassandra's counters first),
and finally ``{"kind": "result", ...}``. Its stderr goes to a log file.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any

import orjson

from bench.sampler import ProcessSampler

#: Seconds a child may take to stop after SIGTERM before it is killed.
STOP_TIMEOUT = 15.0
#: Seconds a child lingers after its work so that CPU samples bracket its window.
LINGER = 0.6

Printer = Callable[[str], None]


# -- child side ------------------------------------------------------------------------------


def emit(kind: str, **data: Any) -> None:
    """Send one message to the parent."""
    sys.stdout.write(orjson.dumps({"kind": kind, "t": time.time(), **data}).decode() + "\n")
    sys.stdout.flush()


def progress(text: str) -> None:
    emit("progress", text=text)


async def wait_for_go() -> None:
    """Block until the parent writes a line (``go``) on our stdin."""
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.readline)


async def hold() -> None:
    """Say ``measured`` once the work is done and wait for ``go`` before closing anything:
    the parent reads the Cassandra counters meanwhile, and a connection closed before that
    would take its request count with it (:mod:`bench.cqlops`)."""
    emit("measured")
    await wait_for_go()


def spec_from_argv() -> dict[str, Any]:
    """The child's parameters: one JSON object as its only argument."""
    if len(sys.argv) != 2:
        raise SystemExit(f"usage: python -m {sys.argv[0]} '<json spec>'")
    spec: dict[str, Any] = orjson.loads(sys.argv[1])
    return spec


def run(main: Callable[[dict[str, Any]], Coroutine[Any, Any, dict[str, Any]]]) -> None:
    """Run ``main(spec)`` on uvloop (as the services do) and emit its result."""
    import uvloop

    spec = spec_from_argv()
    result = uvloop.run(main(spec))
    # Stay alive a moment so the parent's sampler sees this process after its window ended.
    time.sleep(LINGER)
    emit("result", **result)


# -- parent side -----------------------------------------------------------------------------


class ChildError(RuntimeError):
    """A child exited without a result; the message ends with its log's tail."""


class Child:
    """One running child: spawn it, relay its progress, read its ready and result messages."""

    def __init__(
        self,
        label: str,
        module: str,
        spec: Mapping[str, Any],
        *,
        env: Mapping[str, str],
        log_dir: Path,
        sampler: ProcessSampler,
        printer: Printer,
    ) -> None:
        self.label = label
        self.module = module
        self.spec = dict(spec)
        self.env = dict(env)
        self.log_path = log_dir / f"{label}.log"
        self.sampler = sampler
        self.printer = printer
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                self.module,
                orjson.dumps(self.spec).decode(),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                env={**os.environ, **self.env},
                limit=64 * 1024 * 1024,
            )
        self.sampler.track(self.label, self.proc.pid)

    async def next_message(self, kind: str, timeout: float) -> dict[str, Any]:
        """Relay progress lines until a ``kind`` message arrives; raise if the child dies."""
        assert self.proc is not None and self.proc.stdout is not None  # noqa: S101
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ChildError(f"{self.label}: no {kind!r} within {timeout:.0f}s{self._tail()}")
            try:
                line = await asyncio.wait_for(self.proc.stdout.readline(), remaining)
            except TimeoutError:
                continue
            if not line:
                await self.proc.wait()
                raise ChildError(
                    f"{self.label} exited ({self.proc.returncode}) before {kind!r}{self._tail()}"
                )
            try:
                message: dict[str, Any] = orjson.loads(line)
            except orjson.JSONDecodeError:
                self.printer(f"{self.label}: {line.decode(errors='replace').rstrip()}")
                continue
            if message.get("kind") == "progress":
                self.printer(str(message.get("text", "")))
            elif message.get("kind") == kind:
                return message

    async def go(self) -> None:
        assert self.proc is not None and self.proc.stdin is not None  # noqa: S101
        self.proc.stdin.write(b"go\n")
        await self.proc.stdin.drain()

    async def measured(self, timeout: float) -> None:
        """Wait until the child has done its work (it :func:`hold` s); :meth:`go` lets it
        close and report."""
        await self.next_message("measured", timeout)

    async def finish(self, timeout: float) -> dict[str, Any]:
        """Wait for the result, then for the process to exit."""
        try:
            result = await self.next_message("result", timeout)
        finally:
            await self.stop()
        return result

    async def stop(self) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), STOP_TIMEOUT)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        self.sampler.untrack(self.label)
        self.proc = None

    def _tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return "\n  " + "\n  ".join(text) if text else ""
