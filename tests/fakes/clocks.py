"""Clocks a test moves by hand, for code that takes its clock as a callable.

:class:`Ticks` stands in for ``time.monotonic`` (a linger's, a relay's or a refresh's
periods). The wall clocks stay with the twins they time: the World's
(:class:`tests.fakes.world.Clock`) and the account tables' server clock
(:class:`tests.fakes.cassandra.Clock`)."""

from __future__ import annotations


class Ticks:
    """Monotonic seconds: the test sets or moves ``now``; calling it reads it."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
