"""The campaign runner: starts scheduled campaigns when their time comes and sends running
ones slice by slice, at their rate, through the ordinary acceptance of batches.

One runner works per namespace at a time (a lease); every API process runs one and the
others wait. Each pass looks at the campaigns on the runners' list (``shared.campaigns``):
a scheduled one whose time came starts sending; a sending one gets its next slices (as many
as its rate allows per pass, at least one): the next contacts from its cursor become one
batch of the campaign's template, accepted by :class:`services.api.sending.Sending` under
the Idempotency-Key ``campaign.<id>.<slice>`` (so every batch goes through the same checks,
suppressions, quota and durability as any other, and a runner that dies before moving the
cursor gets the first batch's answer back, not a second batch); then the cursor moves, by a
conditional update. A list that has no contact left ends the campaign ``sent``.

The batches go in the bulk lane (never in front of transactional mail) and name the list
(``shared.engagement``): their copies carry a one-click unsubscribe scoped to the list, and
the list's own unsubscribes are left out.
A slice the daily quota refuses pauses the campaign with that reason.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from services.api.sending import Sending
from shared import template_use
from shared.campaigns import METADATA_KEY, Campaign, CampaignStore, Slice
from shared.contact_lists import (
    BUCKETS,
    ContactLists,
    ListContact,
    Position,
    list_scope,
    read_page,
)
from shared.http import ApiError
from shared.leases import Lease, keep_running
from shared.schedule_store import ScheduleStore
from shared.templates import TemplateStore

log = logging.getLogger(__name__)

#: Seconds between two passes.
PASS_EVERY: Final = 0.5
#: Recipients per slice (one batch, one chunk at most providers' limits).
SLICE: Final = 500
#: Seconds a runner's lease lasts without renewal.
LEASE_SECONDS: Final = 15


def _now() -> datetime:
    return datetime.now(UTC)


def pace(rate: int, every: float = PASS_EVERY) -> tuple[int, int]:
    """How many slices of how many recipients a pass releases for a campaign sending
    ``rate`` recipients a second (at least one of one: a pass always makes progress). The
    size depends on the rate alone, so a slice read again after a crash is the same (pure)."""
    size = min(SLICE, max(1, round(rate * every)))
    return max(1, round(rate * every / size)), size


def recipients_of(contacts: list[ListContact], personal: frozenset[str]) -> list[dict[str, Any]]:
    """The ``to`` of a slice: each contact with their fields as substitutions, a
    per-recipient variable a contact has no field for as empty (pure)."""
    out: list[dict[str, Any]] = []
    for c in contacts:
        subs = {k: v for k, v in c.fields.items() if isinstance(v, str)}
        subs.update({name: "" for name in personal if name not in subs})
        entry: dict[str, Any] = {"email": c.email, "substitutions": subs}
        if c.name:
            entry["name"] = c.name
        out.append(entry)
    return out


def slice_body(campaign: Campaign, to: list[dict[str, Any]]) -> dict[str, Any]:
    """The batch request of one slice (pure)."""
    return {
        "from": campaign.sender,
        "to": to,
        "template_id": str(campaign.template_id),
        "data": campaign.data,
        "list": list_scope(campaign.list_id),
        "unsubscribe": True,
        "priority": "bulk",
        "metadata": {METADATA_KEY: str(campaign.campaign_id)},
    }


@dataclass
class CampaignRunner:
    campaigns: CampaignStore
    lists: ContactLists
    templates: TemplateStore
    sending: Sending
    leases: ScheduleStore
    """Where the runner's lease is kept."""
    owner: uuid.UUID = field(default_factory=uuid.uuid4)
    clock: Callable[[], datetime] = _now

    def __post_init__(self) -> None:
        self.lease = Lease(self.leases, LEASE_SECONDS, self.owner)

    async def run(self) -> None:
        await keep_running(self.pass_once, PASS_EVERY, self.lease, "campaign runner")

    async def pass_once(self) -> int:
        """One pass; the slices it released (0 without the lease)."""
        if not await self.lease.held():
            log.debug("campaign runner %s: another holds the lease", self.owner)
            return 0
        released = 0
        for user_id, campaign_id in await self.campaigns.runs():
            campaign = await self.campaigns.get(user_id, campaign_id)
            if campaign is None or campaign.state in ("sent", "cancelled"):
                await self.campaigns.retire(campaign_id)
                continue
            if campaign.state == "draft":
                # Listed by a schedule whose conditional update has not landed yet (or
                # failed): retiring it now could leave it scheduled and never looked at.
                continue
            try:
                released += await self.step(campaign)
            except ApiError as exc:
                if exc.status >= 500 or exc.code == "idempotency_in_progress":
                    # A dependency is down, or an earlier pass's request for the slice is
                    # still in progress: the next pass tries the same slice again.
                    log.warning("campaign %s waits: %s", campaign_id, exc.message)
                    continue
                # The campaign cannot go on as it is (the quota is spent, its template has
                # no live version, the list changed under a slice being retried): paused
                # with the reason, for its owner to see and resume.
                await self.campaigns.move(campaign, "paused", reason=exc.message)
                log.warning("campaign %s paused: %s", campaign_id, exc.message)
        return released

    async def step(self, campaign: Campaign) -> int:
        if campaign.state == "scheduled":
            if campaign.send_at is not None and campaign.send_at > self.clock():
                return 0
            if not await self.campaigns.move(campaign, "sending"):
                return 0
            found = await self.campaigns.get(campaign.user_id, campaign.campaign_id)
            if found is None:
                return 0
            campaign = found
        if campaign.state != "sending":
            return 0  # paused: nothing is released
        personal = await self._personal(campaign)
        released = 0
        slices, size = pace(campaign.rate)
        for _ in range(slices):
            moved = await self.release(campaign, personal, size)
            if moved is None:
                return released
            released += 1
            campaign = moved
        return released

    async def release(
        self, campaign: Campaign, personal: frozenset[str], size: int
    ) -> Campaign | None:
        """Accept the campaign's next slice and move its cursor; the campaign after, or None
        when nothing was released (the list is exhausted, or another runner moved it)."""
        at = Position(campaign.cursor_bucket, campaign.cursor_after)
        contacts, after = await read_page(self.lists, campaign.list_id, at, size)
        if not contacts:
            if await self.campaigns.move(campaign, "sent"):
                await self.campaigns.retire(campaign.campaign_id)
            return None
        key = f"campaign.{campaign.campaign_id}.{campaign.slices}"
        body = slice_body(campaign, recipients_of(contacts, personal))
        batch_id, accepted = await self._accept(campaign, body, key)
        log.info("campaign %s: slice %d accepted", campaign.campaign_id, campaign.slices)
        if batch_id is not None:
            await self.campaigns.record(
                campaign.campaign_id, Slice(campaign.slices, batch_id, accepted)
            )
        end = after or Position(BUCKETS, None)  # past the last bucket: exhausted next time
        if not await self.campaigns.advance(
            campaign, end.bucket, end.after, accepted, len(contacts) - accepted
        ):
            return None
        return await self.campaigns.get(campaign.user_id, campaign.campaign_id)

    async def _accept(
        self, campaign: Campaign, body: dict[str, Any], key: str
    ) -> tuple[uuid.UUID | None, int]:
        """The slice's batch and how many it mails; (None, 0) when every contact of the
        slice was left out (suppressed, unsubscribed from the list, cooling down)."""
        try:
            answer = await self.sending.accept(campaign.user_id, body, key)
        except ApiError as exc:
            if exc.status == 422 and exc.code == "no_recipients":
                return None, 0
            raise
        return uuid.UUID(answer["batch_id"]), int(answer["accepted"])

    async def _personal(self, campaign: Campaign) -> frozenset[str]:
        """The live version's per-recipient variables (filled from each contact's fields)."""
        template = await self.templates.get(campaign.user_id, campaign.template_id)
        if template is None or template.live_version is None:
            raise ApiError(
                422, "template_unavailable", "the campaign's template has no live version"
            )
        version = await self.templates.version(campaign.template_id, template.live_version)
        if version is None:
            raise ApiError(422, "template_unavailable", "the campaign's template version is gone")
        source = template_use.Source(version.version, version.subject, version.html, version.text)
        return template_use.per_recipient(source, campaign.data)
