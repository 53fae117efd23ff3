"""The open-loop send schedule: request ``i`` is due at ``start + i / rate``, whatever happened
to the requests before it, so a slow response never delays the next send (no coordinated
omission). Latency is measured from the scheduled time, not from when the request went out."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RateSchedule:
    """Evenly spaced send times at ``rate`` per second from ``start`` (seconds, any clock)."""

    rate: float
    start: float

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ValueError(f"rate must be positive, not {self.rate}")

    def at(self, index: int) -> float:
        """When request ``index`` (from 0) is due."""
        return self.start + index / self.rate

    def due_by(self, now: float) -> int:
        """How many requests are due at or before ``now``."""
        if now < self.start:
            return 0
        # The epsilon keeps a send that is due exactly now from being missed by rounding.
        return math.floor((now - self.start) * self.rate + 1e-9) + 1

    def count(self, duration: float) -> int:
        """How many requests fall within ``[start, start + duration)``."""
        return max(0, math.ceil(duration * self.rate - 1e-9))

    def index_at_or_after(self, offset: float) -> int:
        """The first request due at or after ``start + offset``."""
        return max(0, math.ceil(offset * self.rate - 1e-9))
