"""Holding the work of paused campaigns, and ending the work of cancelled ones.

Before a chunk goes to a provider, the sender asks whether its batch belongs to a campaign
(``shared.campaigns.METADATA_KEY`` in its metadata) that is paused, in which case the chunk
is held (``CapacityHeld``: it waits in a delay queue and comes back to the same place, no
attempt used), or cancelled, in which case its recipients end failed with the reason
(``WorkCancelled``). A campaign's state is read at most every :data:`FRESH_FOR` seconds per
process, so a pause holds everything not yet handed to a provider within about a second.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from shared.campaigns import METADATA_KEY, CampaignStore
from shared.errors import CapacityHeld, ProviderError, WorkCancelled
from shared.models import Message

#: Seconds a campaign's state is trusted.
FRESH_FOR: Final = 0.5
#: Seconds a paused campaign's chunk waits before it is looked at again.
HOLD_SECONDS: Final = 5.0


def campaign_of(message: Message) -> uuid.UUID | None:
    """The campaign a batch's message belongs to (pure)."""
    raw = message.metadata.get(METADATA_KEY)
    if raw is None:
        return None
    try:
        return uuid.UUID(raw)
    except ValueError:
        return None


@dataclass
class CampaignHold:
    store: CampaignStore
    clock: Callable[[], float] = time.monotonic
    _seen: dict[tuple[uuid.UUID, uuid.UUID], tuple[float, str | None]] = field(default_factory=dict)

    async def check(
        self, user_id: uuid.UUID, message: Message, provider: str
    ) -> ProviderError | None:
        """Why the chunk may not go now (None: it may)."""
        campaign = campaign_of(message)
        if campaign is None:
            return None
        key = (user_id, campaign)
        now = self.clock()
        seen = self._seen.get(key)
        if seen is None or now - seen[0] > FRESH_FOR:
            state = await self.store.state(user_id, campaign)  # the user's own campaigns only
            if len(self._seen) > 10_000:
                self._seen.clear()
            self._seen[key] = seen = (now, state)
        state = seen[1]
        if state == "paused":
            return CapacityHeld(provider, "its campaign is paused", retry_after=HOLD_SECONDS)
        if state == "cancelled":
            return WorkCancelled(provider, "its campaign was cancelled")
        return None
