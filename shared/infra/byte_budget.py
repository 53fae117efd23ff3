"""How many bytes of large work one process holds at once: a semaphore counted in bytes.

A process's memory grows with the bytes of the requests and jobs it holds at the same time
(a 10 MB batch body is held as bytes, parsed, validated and encoded again before it is
answered), and neither a count of requests (``shared.infra.http.AdmissionLimit``) nor an AMQP
prefetch counts bytes. :class:`ByteBudget` does: work takes its size before it holds it, and
gives it back when done. Takers are served in arrival order (a large one is not starved by a
stream of small ones); one that waits longer than it was told to gets
:class:`BudgetExhausted` and holds nothing. A taker larger than the whole budget takes all of
it, so it runs alone rather than never.

:class:`Lease` is one piece of work's share, taken in steps as its size becomes known (a body
whose length is not declared grows as it streams in) and given back all at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field


class BudgetExhausted(Exception):
    """The budget did not have room for the work within the wait it was allowed."""

    def __init__(self, total: int, wanted: int) -> None:
        super().__init__(f"{wanted} bytes did not fit in a budget of {total} within the wait")
        self.total = total
        self.wanted = wanted


@dataclass
class _Waiter:
    size: int
    granted: asyncio.Future[None]


@dataclass
class ByteBudget:
    """``total`` bytes shared by the work of one process (see the module docstring)."""

    total: int
    free: int = field(init=False)
    _queue: deque[_Waiter] = field(init=False, default_factory=deque)

    def __post_init__(self) -> None:
        self.free = self.total

    def try_take(self, size: int) -> int | None:
        """Take ``size`` bytes (at most the whole budget) if there is room now and nobody is
        waiting; what was taken, or None."""
        size = max(0, min(size, self.total))
        if self._queue or size > self.free:
            return None
        self.free -= size
        return size

    async def take(self, size: int, *, wait: float) -> int:
        """Take ``size`` bytes (at most the whole budget), waiting up to ``wait`` seconds;
        returns what was taken (give exactly that back). Raises BudgetExhausted, holding
        nothing, when the wait ends first."""
        taken = self.try_take(size)
        if taken is not None:
            return taken
        size = max(0, min(size, self.total))
        waiter = _Waiter(size, asyncio.get_running_loop().create_future())
        self._queue.append(waiter)
        try:
            async with asyncio.timeout(wait):
                await asyncio.shield(waiter.granted)
        except BaseException as exc:
            if waiter.granted.done():
                # Granted as the wait ended: give it back, this taker is gone.
                self.give(size)
            else:
                waiter.granted.cancel()
                self._queue.remove(waiter)
                self._grant()  # those behind it may fit now
            if isinstance(exc, TimeoutError):
                raise BudgetExhausted(self.total, size) from None
            raise
        return size

    @property
    def waiting(self) -> int:
        """Takers waiting for room."""
        return len(self._queue)

    def give(self, size: int) -> None:
        """Return bytes taken with :meth:`take`."""
        self.free += size
        self._grant()

    def _grant(self) -> None:
        while self._queue and self._queue[0].size <= self.free:
            waiter = self._queue.popleft()
            self.free -= waiter.size
            waiter.granted.set_result(None)

    @contextlib.asynccontextmanager
    async def holding(self, size: int, *, wait: float) -> AsyncIterator[int]:
        """``size`` bytes for the duration of the block, given back however it ends."""
        taken = await self.take(size, wait=wait)
        try:
            yield taken
        finally:
            self.give(taken)


@dataclass
class Lease:
    """One piece of work's share of a budget, grown as its size becomes known. Sizes up to
    ``small`` take nothing (a small request never waits behind large ones)."""

    budget: ByteBudget
    wait: float
    small: int = 0
    held: int = 0

    async def cover(self, size: int) -> None:
        """Hold ``size`` bytes in all (at most the whole budget). Raises BudgetExhausted."""
        if size <= self.small:
            return
        more = min(size, self.budget.total) - self.held
        if more > 0:
            self.held += await self.budget.take(more, wait=self.wait)

    def release(self) -> None:
        """Give back everything held (idempotent)."""
        held, self.held = self.held, 0
        if held:
            self.budget.give(held)
