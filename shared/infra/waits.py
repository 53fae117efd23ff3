"""Waiting on an :class:`asyncio.Event` for at most some seconds, in a way that a
cancellation always ends.

``asyncio.wait_for(event.wait(), timeout)`` on Python 3.11 swallows a cancellation that
arrives in the turn the event is set: the event's wait has ended, so ``wait_for`` answers its
result instead of raising, and a task stopped at shutdown runs on (a consumer stopped by
SIGTERM hung that way with a loop still waiting, ``shared.infra.leases.Alarm``). Every such wait
goes through :func:`set_within`, which times out with ``asyncio.timeout`` instead."""

from __future__ import annotations

import asyncio
import contextlib


async def set_within(event: asyncio.Event, seconds: float) -> bool:
    """Wait until ``event`` is set, for ``seconds`` at most (none when not positive): whether
    it is set. Cancelled, it raises ``CancelledError`` whether or not the event was set."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(max(0.0, seconds)):
            await event.wait()
    return event.is_set()
