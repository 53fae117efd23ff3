"""Each template's rollout as it stands (its live version, its canary's), as the senders
read it to choose a chunk's copy when it is sent (``shared.templates.template_use``).

A batch carries its canary's copy from its acceptance, but whether a canary chunk still goes
with it is decided at send time, from the template as it is then: once the canary judge rolls
the canary back (or the user publishes another version), the canary's chunks not yet sent go
with the live copy. Reading the template for every chunk would be a read per chunk; a rollout
is kept :data:`KEEP_FOR` seconds instead, one read per template and process at a time (the
chunks of a batch arriving together wait for that one read), so a rollback reaches every
process within that long. The judge running in this process forgets the template it
concluded at once (:meth:`LiveRollouts.forget`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from shared.templates.template_use import TemplateState
from shared.templates.templates import StoredTemplates

#: Seconds a template's rollout is kept before it is read again.
KEEP_FOR: Final = 2.0
#: Templates kept at most; past that, those kept longest ago are let go first.
MOST: Final = 10_000


@dataclass
class LiveRollouts:
    """Templates' rollouts read through a short-lived cache (``None``: the template is gone)."""

    templates: StoredTemplates
    keep_for: float = KEEP_FOR
    clock: Callable[[], float] = time.monotonic
    _kept: dict[uuid.UUID, tuple[float, TemplateState | None]] = field(default_factory=dict)
    _reading: dict[uuid.UUID, asyncio.Future[TemplateState | None]] = field(default_factory=dict)
    _stale: set[uuid.UUID] = field(default_factory=set)
    """Templates forgotten while a read of them was under way."""

    async def rollout(self, user_id: uuid.UUID, template_id: uuid.UUID) -> TemplateState | None:
        """The template's rollout, read at most :attr:`keep_for` seconds ago. Raises
        DependencyUnavailable when it must be read and cannot be."""
        kept = self._kept.get(template_id)
        if kept is not None and self.clock() - kept[0] < self.keep_for:
            return kept[1]
        reading = self._reading.get(template_id)
        if reading is not None:
            # Another chunk is reading it: wait for that read, not a read of our own.
            try:
                return await asyncio.shield(reading)
            except asyncio.CancelledError:
                if not reading.cancelled():
                    raise  # we were cancelled, not the read
                # The reader was cancelled (its delivery ended): read it ourselves.
        return await self._read(user_id, template_id)

    async def _read(self, user_id: uuid.UUID, template_id: uuid.UUID) -> TemplateState | None:
        future: asyncio.Future[TemplateState | None] = asyncio.get_running_loop().create_future()
        self._reading[template_id] = future
        self._stale.discard(template_id)
        at = self.clock()
        try:
            template = await self.templates.get(user_id, template_id)
        except Exception as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: nobody else may be waiting for it
            raise
        except BaseException:
            future.cancel()
            raise
        finally:
            del self._reading[template_id]
        found = (
            None
            if template is None
            else TemplateState(
                template.live_version, template.canary_version, template.canary_since
            )
        )
        future.set_result(found)
        if template_id in self._stale:
            self._stale.discard(template_id)  # forgotten while read: maybe read before
        else:
            self._keep(template_id, at, found)
        return found

    def forget(self, template_id: uuid.UUID) -> None:
        """Read the template again next time (its rollout was just changed here); a read
        under way may have read it before the change, so what it reads is not kept."""
        self._kept.pop(template_id, None)
        if template_id in self._reading:
            self._stale.add(template_id)

    def _keep(self, template_id: uuid.UUID, at: float, found: TemplateState | None) -> None:
        if len(self._kept) >= MOST:
            for old in sorted(self._kept, key=lambda t: self._kept[t][0])[: MOST // 10]:
                del self._kept[old]
        self._kept[template_id] = (at, found)
