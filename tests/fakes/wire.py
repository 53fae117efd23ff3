"""How a twin's round trip to its (in-memory) database travels: the seam where a simulator
injects faults.

Each twin operation makes one :meth:`Wire.trip` per round trip the real store makes, before
its effect, and calls :meth:`Trip.landed` after it. A wire may fail the request before it
applies (the trip raises), lose the answer after it applied (``landed`` raises), or end the
calling process right after it (``landed`` raises a ``BaseException`` that nothing in the
services handles). :data:`LOOPBACK`, every twin's default, only yields to the event loop, so
concurrent callers interleave at every query as they do against Cassandra.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, Literal, ParamSpec, Protocol, TypeVar

#: What a round trip does, as far as its faults go: a read can only fail; a write can fail or
#: land with its answer lost; a lightweight transaction likewise (whether it applied is then
#: unknown to the caller).
Kind = Literal["read", "write", "lwt"]


class Trip(Protocol):
    def landed(self) -> None:
        """The effect is applied: raise if the answer must not reach the caller."""


class Wire(Protocol):
    async def trip(self, op: str, kind: Kind) -> Trip:
        """Start round trip ``op``; raises if the request fails before it applies."""
        ...


class _Delivered:
    def landed(self) -> None:
        return None


_DELIVERED = _Delivered()


class Loopback:
    """A wire that never fails: it yields once, as a round trip does."""

    async def trip(self, op: str, kind: Kind) -> Trip:
        await asyncio.sleep(0)
        return _DELIVERED


#: The wire every twin uses unless it is given another.
LOOPBACK = Loopback()


class Held:
    """A wire whose first round trip ``op`` waits until the test calls :meth:`release` (every
    other one only yields, as over :data:`LOOPBACK`): a query Cassandra is slow to answer, or
    the turn its answer comes back in."""

    def __init__(self, op: str) -> None:
        self.op = op
        self.reached = asyncio.Event()
        """Set once the held round trip has started."""
        self._answered = asyncio.Event()

    async def trip(self, op: str, kind: Kind) -> Trip:
        if op != self.op or self.reached.is_set():
            return await LOOPBACK.trip(op, kind)
        self.reached.set()
        await self._answered.wait()
        return _DELIVERED

    def release(self) -> None:
        """The held round trip's answer arrives: its caller goes on in the next turn."""
        self._answered.set()


class Traveller(Protocol):
    """A twin whose round trips go over its ``wire``."""

    # Read-only: some twins pass on their tables' wire as a property.
    @property
    def wire(self) -> Wire: ...


S = TypeVar("S", bound=Traveller)
P = ParamSpec("P")
R = TypeVar("R")


def round_trip(
    op: str, kind: Kind
) -> Callable[
    [Callable[Concatenate[S, P], Coroutine[Any, Any, R]]],
    Callable[Concatenate[S, P], Coroutine[Any, Any, R]],
]:
    """Decorate a twin method that makes one round trip: ``op`` over ``self.wire``, its
    effect applied between the trip and its landing."""

    def wrap(
        method: Callable[Concatenate[S, P], Coroutine[Any, Any, R]],
    ) -> Callable[Concatenate[S, P], Coroutine[Any, Any, R]]:
        @functools.wraps(method)
        async def travelled(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
            trip = await self.wire.trip(op, kind)
            result = await method(self, *args, **kwargs)
            trip.landed()
            return result

        return travelled

    return wrap
