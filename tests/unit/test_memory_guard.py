"""A process's memory limit, enforced by the process: over it, the process retires itself
once (a fresh one takes its place); under it, nothing happens. Armed only around an app a
service process serves."""

from __future__ import annotations

import asyncio
import resource
from collections.abc import Awaitable, Callable
from pathlib import Path

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.infra.memory_guard import MemoryGuard, guarded, rss_bytes

MB = 1024 * 1024


class Memory:
    """Resident memory the test sets, and how many times the process was retired."""

    def __init__(self, mb: float) -> None:
        self.mb = mb
        self.retired = 0

    def read(self) -> float:
        return self.mb * MB

    def retire(self) -> None:
        self.retired += 1


def test_a_process_under_its_limit_is_left_alone() -> None:
    """At or under the limit, the guard does nothing."""
    memory = Memory(100)
    guard = MemoryGuard(100, read=memory.read, retire=memory.retire)

    assert guard.check() is False
    assert memory.retired == 0


def test_a_process_over_its_limit_retires_once() -> None:
    """Over the limit, the process is retired, and only once however often it is checked
    while it finishes what it holds."""
    memory = Memory(101)
    guard = MemoryGuard(100, read=memory.read, retire=memory.retire)

    assert guard.check() is True
    memory.mb = 50
    assert guard.check() is True
    assert memory.retired == 1


def test_without_a_figure_nothing_is_retired() -> None:
    """Where the memory cannot be read, the process is not retired on a guess."""
    retired: list[bool] = []
    guard = MemoryGuard(1, read=lambda: None, retire=lambda: retired.append(True))

    assert guard.check() is False
    assert retired == []


def test_the_resident_memory_is_read_from_statm(tmp_path: Path) -> None:
    """The second field of statm is the resident pages; a missing file gives no figure."""
    statm = tmp_path / "statm"
    statm.write_text("5000 300 20 1 0 400 0\n")

    assert rss_bytes(statm) == 300 * resource.getpagesize()
    assert rss_bytes(tmp_path / "absent") is None


async def _lifespan(app: ASGIApp, while_serving: Callable[[], Awaitable[None]]) -> list[str]:
    """Run ``app``'s lifespan: start-up, ``while_serving()``, shut-down; the messages sent."""
    inbox: asyncio.Queue[Message] = asyncio.Queue()
    sent: list[str] = []
    started = asyncio.Event()

    async def receive() -> Message:
        return await inbox.get()

    async def send(message: Message) -> None:
        sent.append(message["type"])
        if message["type"] == "lifespan.startup.complete":
            started.set()

    await inbox.put({"type": "lifespan.startup"})
    running = asyncio.ensure_future(app({"type": "lifespan"}, receive, send))
    await started.wait()
    await while_serving()
    await inbox.put({"type": "lifespan.shutdown"})
    await running
    return sent


async def _app(scope: Scope, receive: Receive, send: Send) -> None:
    """A lifespan that starts and stops when told."""
    assert (await receive())["type"] == "lifespan.startup"
    await send({"type": "lifespan.startup.complete"})
    assert (await receive())["type"] == "lifespan.shutdown"
    await send({"type": "lifespan.shutdown.complete"})


async def test_a_served_app_retires_its_process_once_over_the_limit() -> None:
    """Wrapped by guarded, a serving app's process is retired once its memory passes the
    limit, and its lifespan still shuts down."""
    memory = Memory(50)
    retiring = asyncio.Event()

    def retire() -> None:
        memory.retire()
        retiring.set()

    guard = MemoryGuard(100, read=memory.read, retire=retire)

    async def grow() -> None:
        memory.mb = 150
        await retiring.wait()

    sent = await _lifespan(guarded(_app, guard, every=0.001), grow)

    assert memory.retired == 1
    assert sent[-1] == "lifespan.shutdown.complete"


async def test_an_app_not_wrapped_never_retires_its_process() -> None:
    """The factories' apps are not guarded: a process holding many (the suite) is never
    retired by one of them."""
    memory = Memory(500)
    MemoryGuard(100, read=memory.read, retire=memory.retire)

    async def serve() -> None:
        for _ in range(10):
            await asyncio.sleep(0.001)

    await _lifespan(_app, serve)

    assert memory.retired == 0
