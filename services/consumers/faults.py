"""The send path's hooks for fault injection: every point where a process can die on it.

The dispatcher and its collaborators ``await fault_points(point, job)`` there; tests and the
simulator inject crashes and interleavings through it, and in production it does nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from services.consumers import protocol

#: ``await fault_points(point, job)`` at every point where a process could die on the send
#: path: tests inject crashes and interleavings there.
FaultPoints = Callable[[str, protocol.Job], Awaitable[None]]


async def no_faults(point: str, job: protocol.Job) -> None:
    """Production: no fault is injected anywhere."""
