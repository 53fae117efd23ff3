"""Holding the work of paused campaigns, and ending the work of cancelled ones.

A dispatch job whose batch belongs to a campaign (``shared.audience.campaigns.METADATA_KEY`` in its
metadata) that is paused is held before anything of it is claimed (:meth:`CampaignHold.held`,
asked first by ``Dispatcher.handle``): the same job is published again, unchanged, into a
delay queue, and the delivery is acked. Nothing else is written: no attempt, no recipient
row, no user webhook event, so a pause of a week costs a few thousand republishes per chunk
and nothing in Cassandra. The wait grows with how long this process has seen the campaign
paused (:func:`hold_delay`: from :data:`HOLD_SECONDS` to :data:`HOLD_MAX`), so a resume lets
every held chunk go within :data:`HOLD_MAX` seconds. A check of an attempt already started is
not held: it settles what was begun before the pause.

Before a chunk goes to a provider, the sender asks again (:meth:`CampaignHold.check`): a
campaign cancelled ends the chunk's recipients failed with the reason (``WorkCancelled``),
and one paused since the job was let through is held as capacity is (``CapacityHeld``: the
attempt is recorded as held and the next one, a few seconds on, is held without one). A
campaign's state is read at most every :data:`FRESH_FOR` seconds per process, so a pause
holds everything not yet handed to a provider within about a second.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from services.consumers import protocol
from shared.audience.campaigns import METADATA_KEY, StoredCampaigns
from shared.core.errors import CapacityHeld, ProviderError, WorkCancelled
from shared.core.models import ChunkJob, LogJob, Message
from shared.infra.broker import Broker
from shared.infra.topology import dispatch_key, log_key

log = logging.getLogger(__name__)

#: Seconds a campaign's state is trusted.
FRESH_FOR: Final = 0.5
#: Seconds the first hold of a paused campaign's job waits (and a chunk held at its call).
HOLD_SECONDS: Final = 5.0
#: Seconds the longest hold waits: a resumed campaign's held jobs come back within this.
HOLD_MAX: Final = 120.0
#: Campaign states remembered per process before the memory is cleared.
REMEMBERED: Final = 10_000


def campaign_of(message: Message) -> uuid.UUID | None:
    """The campaign a batch's message belongs to (pure)."""
    raw = message.metadata.get(METADATA_KEY)
    if raw is None:
        return None
    try:
        return uuid.UUID(raw)
    except ValueError:
        return None


def hold_delay(paused_for: float, tiers: Sequence[int]) -> int:
    """The delay tier a paused campaign's job waits in, ``paused_for`` seconds after it was
    first seen paused: the longest tier no longer than that, within [:data:`HOLD_SECONDS`,
    :data:`HOLD_MAX`] (the smallest tier if none fits). Each wait is about as long as the
    pause so far, so the waits roughly double up to the cap (pure)."""
    wanted = min(max(paused_for, HOLD_SECONDS), HOLD_MAX)
    fitting = [t for t in tiers if t <= wanted]
    return max(fitting) if fitting else min(tiers)


def again(job: protocol.Job) -> tuple[str, bytes, str]:
    """The routing key, body and message id of ``job`` (not a check) as it was published
    (pure)."""
    if job.log_id is None:
        body = ChunkJob(batch_id=job.batch_id, chunk=job.chunk, attempt=job.attempt).encode()
        key = dispatch_key(job.provider, job.batch_id, job.attempt, job.lane)
        return key, body, f"{job.batch_id}:{job.chunk}:{job.attempt}"
    body = LogJob(
        batch_id=job.batch_id, chunk=job.chunk, log_id=job.log_id, attempt=job.attempt
    ).encode()
    return log_key(job.provider, job.log_id, job.attempt), body, f"{job.log_id}:{job.attempt}"


def _monotonic() -> float:
    # Looked up at each call, not bound once at import as a default ``time.monotonic`` is: a
    # clock put in its place later (the simulator's virtual one) is the clock the hold reads.
    return time.monotonic()


@dataclass
class CampaignHold:
    store: StoredCampaigns
    clock: Callable[[], float] = _monotonic
    _seen: dict[tuple[uuid.UUID, uuid.UUID], tuple[float, str | None]] = field(default_factory=dict)
    _paused: dict[tuple[uuid.UUID, uuid.UUID], float] = field(default_factory=dict)
    """When this process first saw each campaign paused (since it last saw it otherwise)."""

    async def held(
        self, job: protocol.Job, user_id: uuid.UUID, message: Message, broker: Broker
    ) -> bool:
        """Whether ``job`` waits for its paused campaign; if so it was published again,
        unchanged, with a delay (the caller acks the delivery and does nothing else)."""
        campaign = campaign_of(message)
        if campaign is None or job.check is not None:
            return False
        key = (user_id, campaign)
        if await self._state(key) != "paused":
            return False
        paused_for = self.clock() - self._paused.get(key, self.clock())
        tier = hold_delay(paused_for, broker.topology.all_delay_tiers)
        routing_key, body, message_id = again(job)
        await broker.publish(routing_key, body, delay=tier, message_id=message_id)
        log.debug("%s attempt %d held %ds: its campaign is paused", job.line, job.attempt, tier)
        return True

    async def check(
        self, user_id: uuid.UUID, message: Message, provider: str
    ) -> ProviderError | None:
        """Why the chunk may not go now (None: it may)."""
        campaign = campaign_of(message)
        if campaign is None:
            return None
        state = await self._state((user_id, campaign))
        if state == "paused":
            return CapacityHeld(provider, "its campaign is paused", retry_after=HOLD_SECONDS)
        if state == "cancelled":
            return WorkCancelled(provider, "its campaign was cancelled")
        return None

    async def _state(self, key: tuple[uuid.UUID, uuid.UUID]) -> str | None:
        """The campaign's state, read at most every :data:`FRESH_FOR` seconds."""
        now = self.clock()
        seen = self._seen.get(key)
        if seen is None or now - seen[0] > FRESH_FOR:
            state = await self.store.state(*key)  # the user's own campaigns only
            if len(self._seen) > REMEMBERED:
                self._seen.clear()
                self._paused.clear()
            self._seen[key] = seen = (now, state)
            if state == "paused":
                self._paused.setdefault(key, now)
            else:
                self._paused.pop(key, None)
        return seen[1]
