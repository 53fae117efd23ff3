"""Work that one process of many does at a time: a lease in Cassandra (the rows of
``shared.schedule_store``'s ``scheduler_state``, one per name), renewed a third of the way
through so that a holder that stalls past the rest loses it, and the loop that runs a pass
after pass, releasing the lease on the way out."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from shared.errors import DependencyUnavailable

log = logging.getLogger(__name__)


class LeaseRows(Protocol):
    async def take_lease(self, owner: uuid.UUID, seconds: int) -> bool: ...

    async def release_lease(self, owner: uuid.UUID) -> None: ...


@dataclass
class Lease:
    rows: LeaseRows
    seconds: int
    owner: uuid.UUID = field(default_factory=uuid.uuid4)
    _renew_at: float = 0.0

    async def held(self) -> bool:
        """Whether this process holds the lease (taken or renewed when due)."""
        if time.monotonic() < self._renew_at:
            return True
        if not await self.rows.take_lease(self.owner, self.seconds):
            return False
        self._renew_at = time.monotonic() + self.seconds / 3
        return True

    def lost(self) -> None:
        """A conditional write under the lease failed: ask for it again next time."""
        self._renew_at = 0.0

    async def release(self) -> None:
        try:
            await asyncio.shield(self.rows.release_lease(self.owner))
        except DependencyUnavailable:
            log.warning("a lease was not released; it lapses by itself")


async def keep_running(
    step: Callable[[], Awaitable[object]], every: float, lease: Lease, what: str
) -> None:
    """``step()`` every ``every`` seconds until cancelled (an outage or a failure stops a
    pass, not the loop); the lease is released on the way out."""
    try:
        while True:
            try:
                await step()
            except DependencyUnavailable as exc:
                log.warning("%s pass stopped: %s", what, exc)
            except Exception:
                # A bug in one pass must not end the loop: work left to it (scheduled
                # batches, campaigns) would wait forever without a sign.
                log.exception("%s pass failed", what)
            await asyncio.sleep(every)
    finally:
        await lease.release()
