"""Simulated processes, and the gate every I/O step of theirs passes through.

A :class:`Process` is a name (``api``, ``consumers-a``, ``webhooks`` ...) whose life is a
series of incarnations. Everything an incarnation does runs in tasks that carry it (a context
variable, inherited by every task it starts), so the gate knows who takes each step and a
kill can end them all: the incarnation is marked dead, its tasks are cancelled, and any I/O a
dying task still attempts (a ``finally``, an ``except BaseException``) raises
:class:`Killed`. What it held only in memory is gone; what it had not acked is delivered
again (the broker listens for deaths); its leases lapse on their own. A new incarnation
starts after the process's restart delay, built afresh by the process's ``start`` function.

The :class:`Gate` numbers steps in the order they are taken and applies the schedule's fault
at each (``simulation.faults``). It is also the wire of the store twins
(``tests.fakes.wire.Wire``): a round trip fails before it applies, lands with its answer
lost, or is the process's last. Work done outside any process (a scenario's setup, the
checks at the end) takes no step and suffers no fault.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from shared.core.errors import DependencyUnavailable
from simulation.faults import DISCONNECT, KILL, Fault, Schedule, StepKind
from tests.fakes.wire import Kind, Trip

T = TypeVar("T")

#: The incarnation the running task belongs to (None: the simulator itself).
CURRENT: contextvars.ContextVar[Incarnation | None] = contextvars.ContextVar(
    "simulated_process", default=None
)


class Killed(BaseException):
    """The simulated process died here (a BaseException: nothing in the services handles
    it, as nothing handles ``kill -9``)."""


@dataclass(eq=False)
class Incarnation:
    process: Process
    number: int
    alive: bool = True
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)

    def check(self) -> None:
        if not self.alive:
            raise Killed(f"{self.process.name}#{self.number} is dead")

    def __repr__(self) -> str:
        return f"{self.process.name}#{self.number}"


Start = Callable[["Incarnation"], Awaitable[None]]
DeathListener = Callable[["Incarnation"], None]


class Process:
    """One simulated service process."""

    def __init__(
        self,
        name: str,
        start: Start | None = None,
        *,
        restart_after: float = 2.0,
        skew: float = 0.0,
        on_death: list[DeathListener] | None = None,
    ) -> None:
        self.name = name
        self.start = start
        self.restart_after = restart_after
        self.skew = skew
        self.on_death = on_death if on_death is not None else []
        self.current = Incarnation(self, 0)
        self.deaths = 0
        self.restarting = False

    def spawn(
        self, coro: Coroutine[Any, Any, Any], incarnation: Incarnation | None = None
    ) -> asyncio.Task[Any]:
        """Run ``coro`` as a task of this process (of its current incarnation)."""
        inc = incarnation or self.current
        ctx = contextvars.copy_context()
        ctx.run(CURRENT.set, inc)
        task = asyncio.get_running_loop().create_task(coro, context=ctx)
        inc.tasks.add(task)
        task.add_done_callback(inc.tasks.discard)
        task.add_done_callback(_seen)
        if not inc.alive:
            task.cancel()
        return task

    async def boot(self) -> None:
        """Start the current incarnation's services."""
        if self.start is not None:
            await self.start(self.current)

    def kill(self) -> None:
        """End the current incarnation now; a new one starts after the restart delay."""
        inc = self.current
        if not inc.alive:
            return
        inc.alive = False
        self.deaths += 1
        me = asyncio.current_task()
        for task in list(inc.tasks):
            if task is not me:
                task.cancel()
        for listener in self.on_death:
            listener(inc)
        self.restarting = True
        asyncio.get_running_loop().call_later(self.restart_after, self._restart)

    def _restart(self) -> None:
        self.current = Incarnation(self, self.current.number + 1)
        self.restarting = False
        self.spawn(self.boot())


def _seen(task: asyncio.Task[Any]) -> None:
    """Mark a task's end as seen: one ended by its process's death ends with ``Killed``,
    which nobody awaits (the process is gone) and asyncio need not report."""
    if not task.cancelled():
        task.exception()


def task_factory(
    loop: asyncio.AbstractEventLoop, coro: Any, context: Any = None
) -> asyncio.Task[Any]:
    """Tasks started inside a process belong to its incarnation (so a kill ends them)."""
    task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, context=context)
    inc = context.get(CURRENT) if context is not None else CURRENT.get()
    if inc is not None:
        inc.tasks.add(task)
        task.add_done_callback(inc.tasks.discard)
        if not inc.alive:
            task.cancel()
    return task


def current() -> Incarnation | None:
    return CURRENT.get()


def outside() -> contextvars.Context:
    """A context outside every process (for what the world itself does: a provider's
    webhook posts, a client's requests), so no kill ends it."""
    ctx = contextvars.copy_context()
    ctx.run(CURRENT.set, None)
    return ctx


def skew_now() -> float:
    """The running process's clock skew (seconds), for the simulated wall clock."""
    inc = CURRENT.get()
    return inc.process.skew if inc is not None else 0.0


@dataclass(frozen=True, slots=True)
class StepRecord:
    index: int
    process: str
    point: str
    kind: StepKind
    fault: str | None
    at: float = 0.0
    """Seconds into the run."""


class _Landing:
    def __init__(self, gate: Gate, inc: Incarnation, fault: str | None, point: str) -> None:
        self.gate, self.inc, self.fault, self.point = gate, inc, fault, point

    def landed(self) -> None:
        if self.fault == "lands":
            raise DependencyUnavailable("cassandra", f"(simulated) {self.point}: timed out")
        self.gate.die_if(self.fault, self.inc)


class Gate:
    """Numbers every step and applies the schedule's faults."""

    def __init__(self, schedule: Schedule, *, record: bool = True) -> None:
        self.schedule = schedule
        self.steps: list[StepRecord] = []
        self.record = record
        self.count = 0
        self._jitter = random.Random(schedule.seed ^ 0x5EED) if schedule.jitter else None
        self._planned = {f.step: f for f in schedule.faults if not f.where}
        self._selected = [f for f in schedule.faults if f.where]
        self._seen: dict[Fault, int] = {}
        self.outages: tuple[tuple[float, float], ...] = ()
        """Windows (loop time, seconds) in which every store round trip fails."""
        self.on_disconnect: Callable[[Incarnation], None] = lambda inc: None

    def enter(self, point: str, kind: StepKind) -> str | None:
        """Take a step of the running process; the fault planned for it (None: none)."""
        inc = CURRENT.get()
        if inc is None:
            return None
        inc.check()
        index = self.count
        self.count += 1
        planned = self._planned.get(index)
        for selector in self._selected:
            if selector.where in f"{inc.process.name}/{point}":
                seen = self._seen[selector] = self._seen.get(selector, 0) + 1
                if seen == selector.step:
                    planned = selector
        fault = planned.resolve(kind) if planned is not None else None
        if self.record or fault is not None:
            at = asyncio.get_running_loop().time()
            self.steps.append(StepRecord(index, inc.process.name, point, kind, fault, at))
        return fault

    async def pause(self) -> None:
        """The time a step takes: none, or (with jitter) a few random milliseconds, so
        concurrent work interleaves in other orders."""
        if self._jitter is not None and self._jitter.random() < 0.3:
            await asyncio.sleep(self._jitter.choice((0.001, 0.005, 0.02)))
        else:
            await asyncio.sleep(0)
        inc = CURRENT.get()
        if inc is not None:
            inc.check()

    def die_if(self, fault: str | None, inc: Incarnation | None = None) -> None:
        """A ``kill`` fault: the step took effect; its process dies now. A ``disconnect``:
        its broker connection drops (its unacked deliveries go to others) and it goes on."""
        inc = inc or CURRENT.get()
        if inc is None:
            return
        if fault == DISCONNECT:
            self.on_disconnect(inc)
        elif fault == KILL:
            inc.process.kill()
            raise Killed(f"{inc} killed by the schedule")

    def _down(self) -> bool:
        return bool(self.outages) and _down_at(self.outages, asyncio.get_running_loop().time())

    async def trip(self, op: str, kind: Kind) -> Trip:
        """A store round trip (``tests.fakes.wire.Wire``)."""
        point = f"store:{op}"
        fault = self.enter(point, kind)
        await self.pause()
        inc = CURRENT.get()
        if fault == "fail" or (inc is not None and self._down()):
            raise DependencyUnavailable("cassandra", f"(simulated) {op}: timed out")
        if inc is None:
            return _NOTHING
        return _Landing(self, inc, fault, point)


def _down_at(outages: tuple[tuple[float, float], ...], now: float) -> bool:
    return any(start <= now < start + length for start, length in outages)


class _Nothing:
    def landed(self) -> None:
        return None


_NOTHING = _Nothing()
