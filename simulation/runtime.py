"""The simulated runtime: an asyncio event loop on a virtual clock, wall time that follows it,
and randomness drawn from a seed.

The loop never waits: when every task is blocked, it moves the clock to the next timer at
once, so an hour of retries and delays costs what their callbacks cost. Nothing in a run
depends on the machine: ``datetime.now()`` and ``time.time()`` read the virtual clock
(through time-machine), and so do ``time.monotonic()`` and ``time.perf_counter()`` (looked up
when called: a function bound before the run, such as a ``clock=time.monotonic`` default,
still reads real time, and makes a run depend on how fast the machine is);
``os.urandom`` (and with it ``uuid4``, ``secrets`` and
``SystemRandom``) and the ``random`` module draw from the run's seed, and work sent to a
thread (``asyncio.to_thread``) runs inline. Two runs with the same seed and the same faults
therefore take the same steps in the same order, which is what lets a fault be aimed at
"step 41" of a run and a failing run be replayed.

The loop refuses to block for ever: if every task waits and no timer is set, the run is
deadlocked, and :class:`Deadlock` is raised out of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import selectors
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import time_machine

T = TypeVar("T")

#: When every simulated run starts (a fixed instant, so runs are comparable).
EPOCH = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


class Deadlock(Exception):
    """Every task waits for something that no timer or task will ever bring."""


class VirtualClock:
    """Seconds since the run started, moved only by the loop; wall time follows it."""

    def __init__(self, start: datetime = EPOCH) -> None:
        self.start = start
        self.elapsed = 0.0
        self._traveller: Any = None

    def now(self) -> datetime:
        return self.start + timedelta(seconds=self.elapsed)

    def advance(self, seconds: float) -> None:
        self.elapsed += seconds
        if self._traveller is not None:
            self._traveller.move_to(self.now())

    @contextlib.contextmanager
    def as_wall_time(self, skew: Callable[[], float] = lambda: 0.0) -> Iterator[None]:
        """While inside, ``datetime.now()``, ``time.time()`` and friends read this clock,
        ``skew()`` seconds off (read at each call: the calling process's own skew)."""
        travel = time_machine.travel(self.now(), tick=False)
        traveller = travel.start()
        traveller.__class__ = _Skewed
        traveller.skew = skew  # type: ignore[attr-defined]
        self._traveller = traveller
        try:
            yield
        finally:
            self._traveller = None
            travel.stop()

    @contextlib.contextmanager
    def as_monotonic(self) -> Iterator[None]:
        """While inside, ``time.monotonic()`` and ``time.perf_counter()`` read this clock
        (what the services time with: caches, leases, durations)."""
        saved = time.monotonic, time.perf_counter
        time.monotonic = time.perf_counter = lambda: 1_000.0 + self.elapsed
        try:
            yield
        finally:
            time.monotonic, time.perf_counter = saved


class _Skewed(time_machine.Traveller):
    """A frozen traveller whose time is off by the caller's skew."""

    skew: Callable[[], float]

    def time_ns(self) -> int:
        base: int = self._destination_timestamp_ns
        return base + round(self.skew() * 1e9)


class _Selector(selectors.BaseSelector):
    """A selector with nothing to select: waiting moves the virtual clock instead."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self._keys: dict[int, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._keys[fd] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return self._keys.pop(fd)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise Deadlock("every task is waiting and no timer is set")
        if timeout > 0:
            self.clock.advance(timeout)
        return []

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._keys

    def close(self) -> None:
        self._keys.clear()


TaskFactory = Callable[[asyncio.AbstractEventLoop, Any], "asyncio.Task[Any]"]


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop whose time is the virtual clock's and whose executor is the caller."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__(selector=_Selector(clock))
        self.clock = clock

    def time(self) -> float:
        return self.clock.elapsed

    def run_in_executor(  # type: ignore[override]  # any executor: the work runs here
        self, executor: Any, func: Callable[..., T], *args: Any
    ) -> asyncio.Future[T]:
        # Threads would run in real time, out of the simulation's order: run the work here.
        future: asyncio.Future[T] = self.create_future()
        try:
            future.set_result(func(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task as is
            future.set_exception(exc)
        return future


class Entropy:
    """Every source of randomness the services use, drawn from one seed while installed."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self._saved: list[tuple[Any, str, Any]] = []

    def urandom(self, n: int) -> bytes:
        return self.rng.randbytes(n)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        state = random.getstate()
        random.seed(self.rng.getrandbits(64))
        self._patch(os, "urandom", self.urandom)
        self._patch(random, "_urandom", self.urandom)
        try:
            yield
        finally:
            for target, name, value in reversed(self._saved):
                setattr(target, name, value)
            self._saved.clear()
            random.setstate(state)

    def _patch(self, target: Any, name: str, value: Any) -> None:
        self._saved.append((target, name, getattr(target, name)))
        setattr(target, name, value)


def simulate(
    main: Callable[[VirtualClock], Awaitable[T]],
    *,
    seed: int,
    start: datetime = EPOCH,
    task_factory: TaskFactory | None = None,
    skew: Callable[[], float] = lambda: 0.0,
) -> T:
    """Run ``main(clock)`` to completion on a fresh virtual loop, deterministically for
    ``seed``; wall time reads the clock, ``skew()`` seconds off."""
    clock = VirtualClock(start)
    loop = VirtualLoop(clock)
    if task_factory is not None:
        loop.set_task_factory(task_factory)
    try:
        with clock.as_wall_time(skew), clock.as_monotonic(), Entropy(seed).installed():
            return loop.run_until_complete(main(clock))
    finally:
        _cancel_everything(loop)
        loop.close()


def _cancel_everything(loop: VirtualLoop) -> None:
    """Cancel what the run left behind (the services' idle loops) without running it on."""
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        with contextlib.suppress(BaseException):
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
