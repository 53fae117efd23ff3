"""The campaign runner: starts scheduled campaigns when their time comes and sends running
ones slice by slice, at their rate, through the ordinary acceptance of batches.

One runner works per namespace at a time (a lease); every API process runs one and the
others wait. Each pass looks at the campaigns on the runners' list (``shared.audience.campaigns``):
a scheduled one whose time came starts sending; a sending one gets its next slices (as many
as its rate allows per pass, at least one): the next contacts from its cursor become one
batch request of the campaign's template, staged before anything else (``Staged``: its batch
id, the request, the cursor after it), then accepted by :class:`services.api.sending.Sending`
under the Idempotency-Key ``campaign.<id>.<slice>`` with that batch id (so every batch goes
through the same checks, suppressions, quota and durability as any other); the batch is
recorded, the cursor moves by a conditional update, and the staged slice is closed. A list
that has no contact left ends the campaign ``sent``.

A runner that dies (or loses a race, or sees a write time out) anywhere in a slice leaves it
staged, and whoever comes next finishes that slice from what was staged, never from the list
again: if its batch is stored, it is recorded and the cursor moves without accepting
anything; otherwise the same request is accepted again under the same key and batch id (the
first answer, if there was one). A contact or template that changed meanwhile cannot make the
retry a different request (a 409 that would pause the campaign for good) or, once the key has
expired, a second batch.

The batches go in the bulk lane (never in front of transactional mail) and name the list
(``shared.engagement.engagement``): their copies carry a one-click unsubscribe scoped to the list,
and the list's own unsubscribes are left out.
A slice the daily quota refuses pauses the campaign with that reason, and so does a live
version that does not render (or passes a template limit): the staged slice stays for a resume.

A pass costs a read of the runners' list. While a campaign is sending (or a pass waits on a
dependency) the next pass follows :data:`PASS_EVERY` later, the period its pace is counted
in; an idle holder (nothing listed, or only paused campaigns and scheduled ones whose time
has not come) waits instead until the earliest ``send_at`` it read or its lease's renewal (a
third of :data:`LEASE_SECONDS`), whichever is first, and the API wakes every runner
(``shared.infra.leases.wake``, :data:`WAKE`) when a campaign is scheduled or resumed, so it starts
within about :data:`PASS_EVERY` as before; one whose wake-up was lost (the broker was
unreachable) within the renewal period, 5 s. A runner without the lease asks for it again
after :data:`ASK_EVERY` (the holder's renewal period, 5 s: its lease cannot lapse sooner) or
when woken, not every pass period: a dead holder's lease is taken over within 20 s (its
15 s, then at most 5 s).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from services.api.contact_lists import (
    BUCKETS,
    ContactBook,
    ListContact,
    Position,
    list_scope,
    read_page,
)
from services.api.sending import Sending
from shared.audience.campaigns import (
    METADATA_KEY,
    Campaign,
    Slice,
    Staged,
    StoredCampaigns,
)
from shared.delivery.batchstore import new_batch_id
from shared.delivery.schedule_store import Schedules
from shared.infra.http import ApiError
from shared.infra.leases import CAMPAIGNS_WAKE, Lease, LeasedLoop
from shared.templates.templates import StoredTemplates

log = logging.getLogger(__name__)

#: Seconds between two passes.
PASS_EVERY: Final = 0.5
#: Recipients per slice (one batch, one chunk at most providers' limits).
SLICE: Final = 500
#: Seconds a runner's lease lasts without renewal.
LEASE_SECONDS: Final = 15
#: Seconds a process without the lease waits before asking again (unless woken): the holder
#: renews every third of :data:`LEASE_SECONDS`, so its lease cannot lapse sooner than that
#: after a refusal; a dead holder's is taken over within LEASE_SECONDS + ASK_EVERY, 20 s.
ASK_EVERY: Final = LEASE_SECONDS / 3
#: The name its wake-ups carry (``shared.infra.leases.wake``).
WAKE: Final = CAMPAIGNS_WAKE


def _now() -> datetime:
    return datetime.now(UTC)


def pace(rate: int, every: float = PASS_EVERY) -> tuple[int, int]:
    """How many slices of how many recipients a pass releases for a campaign sending
    ``rate`` recipients a second (at least one of one: a pass always makes progress). The
    size depends on the rate alone, so a slice read again after a crash is the same (pure)."""
    size = min(SLICE, max(1, round(rate * every)))
    return max(1, round(rate * every / size)), size


def next_wait(
    now: datetime, next_due: datetime | None, renew_in: float, *, busy: bool, held: bool = True
) -> float:
    """Seconds until the next pass (pure): :data:`ASK_EVERY` without the lease;
    :data:`PASS_EVERY` while a campaign sends, else
    until the first of the earliest ``send_at`` read and not come and the lease's renewal."""
    if not held:
        return ASK_EVERY
    if busy:
        return PASS_EVERY
    waits = [renew_in]
    if next_due is not None:
        waits.append((next_due - now).total_seconds())
    return max(0.0, min(waits))


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
    campaigns: StoredCampaigns
    lists: ContactBook
    templates: StoredTemplates
    sending: Sending
    leases: Schedules
    """Where the runner's lease is kept."""
    owner: uuid.UUID = field(default_factory=uuid.uuid4)
    clock: Callable[[], datetime] = _now
    next_due: datetime | None = None
    """The earliest ``send_at`` the last pass read that had not come."""
    busy: bool = True
    """Whether the last pass found work: the next follows soon."""
    held: bool = True
    """Whether the last pass held the lease (without it, the next asks after ASK_EVERY)."""

    def __post_init__(self) -> None:
        self.lease = Lease(self.leases, LEASE_SECONDS, self.owner)
        # Run it with ``loop.run()``; a wake-up heard by ``loop.heard`` (a campaign was
        # scheduled or resumed) rings ``loop.alarm``; once stopped, it wakes
        # the others to take the lease at once.
        self.loop = LeasedLoop(
            "campaign runner",
            WAKE,
            self.lease,
            PASS_EVERY,
            self.pass_once,
            self.next_in,
            announcer=self.sending.acceptance.broker,
        )

    def next_in(self) -> float:
        """Seconds until the next pass is due (see :func:`next_wait`)."""
        return next_wait(
            self.clock(), self.next_due, self.lease.renew_in(), busy=self.busy, held=self.held
        )

    async def pass_once(self) -> int:
        """One pass; the slices it released (0 without the lease)."""
        self.busy = True  # until this pass finds nothing to do soon
        self.held = await self.lease.held()
        if not self.held:
            log.debug("campaign runner %s: another holds the lease", self.owner)
            return 0
        released = 0
        busy = False
        self.next_due = None
        for user_id, campaign_id in await self.campaigns.runs():
            campaign = await self.campaigns.get(user_id, campaign_id)
            if campaign is None or campaign.state in ("sent", "cancelled"):
                await self.campaigns.retire(campaign_id)
                continue
            if campaign.state == "draft":
                # Listed by a schedule whose conditional update has not landed yet (or
                # failed): retiring it now could leave it scheduled and never looked at.
                busy = True
                continue
            if self._waiting(campaign):
                continue
            busy = True
            try:
                released += await self.step(campaign)
            except ApiError as exc:
                if exc.status >= 500 or exc.code == "idempotency_in_progress":
                    # A dependency is down, or an earlier pass's request for the slice is
                    # still in progress: the next pass tries the same slice again.
                    log.warning("campaign %s waits: %s", campaign_id, exc.message)
                    continue
                # The campaign cannot go on as it is (the quota is spent, its template has
                # no live version): paused with the reason, for its owner to see and resume
                # (the slice stays staged: a resume sends it as it was). Read again: the
                # step may have moved it from scheduled to sending, and a move from the
                # state read before would not apply.
                now = await self.campaigns.get(user_id, campaign_id)
                if now is not None and now.state == "sending":
                    await self.campaigns.move(now, "paused", reason=exc.message)
                    log.warning("campaign %s paused: %s", campaign_id, exc.message)
        self.busy = busy
        return released

    def _waiting(self, campaign: Campaign) -> bool:
        """Whether the campaign has nothing to send now (paused, or scheduled for a time that
        has not come: remembered as the next due time)."""
        if campaign.state == "paused":
            return True
        at = campaign.send_at
        if campaign.state != "scheduled" or at is None or at <= self.clock():
            return False
        self.next_due = at if self.next_due is None else min(self.next_due, at)
        return True

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
        released = 0
        slices, size = pace(campaign.rate)
        for _ in range(slices):
            moved = await self.release(campaign, size)
            if moved is None:
                return released
            released += 1
            campaign = moved
        return released

    async def release(self, campaign: Campaign, size: int) -> Campaign | None:
        """Send the campaign's next slice (the one staged, else the next ``size`` contacts,
        staged first) and move its cursor; the campaign after, or None when nothing was
        released (the list is exhausted, or another runner moved the cursor)."""
        number = campaign.slices
        staged = await self.campaigns.staged(campaign.campaign_id, number)
        if staged is None:
            staged = await self._stage(campaign, size)
            if staged is None:
                return None
        if staged.body is None:
            return None  # closed: another runner moved the cursor past it since we read it
        batch_id, accepted = await self._accept(campaign, staged, staged.body)
        log.info("campaign %s: slice %d accepted", campaign.campaign_id, number)
        if batch_id is not None:
            await self.campaigns.record(campaign.campaign_id, Slice(number, batch_id, accepted))
        if not await self.campaigns.advance(
            campaign, staged.end_bucket, staged.end_after, accepted, staged.contacts - accepted
        ):
            return None
        await self.campaigns.close(campaign.campaign_id, number)
        return await self.campaigns.get(campaign.user_id, campaign.campaign_id)

    async def _stage(self, campaign: Campaign, size: int) -> Staged | None:
        """Read the next slice from the cursor and stage it; the slice as staged (ours, or a
        racing runner's), or None when the list is exhausted (the campaign is then sent)."""
        at = Position(campaign.cursor_bucket, campaign.cursor_after)
        contacts, after = await read_page(self.lists, campaign.list_id, at, size)
        if not contacts:
            if await self.campaigns.move(campaign, "sent"):
                await self.campaigns.retire(campaign.campaign_id)
            return None
        personal = await self._personal(campaign)
        end = after or Position(BUCKETS, None)  # past the last bucket: exhausted next time
        part = Staged(
            slice=campaign.slices,
            batch_id=new_batch_id(time.time()),
            body=slice_body(campaign, recipients_of(contacts, personal)),
            contacts=len(contacts),
            end_bucket=end.bucket,
            end_after=end.after,
        )
        return await self.campaigns.stage(campaign.campaign_id, part)

    async def _accept(
        self, campaign: Campaign, staged: Staged, body: dict[str, Any]
    ) -> tuple[uuid.UUID | None, int]:
        """The slice's batch and how many it mails: the staged batch if it is stored, else
        the staged request accepted (or its first answer); (None, 0) when every contact of
        the slice was left out (suppressed, unsubscribed from the list, cooling down)."""
        answer = await self.sending.stored(campaign.user_id, staged.batch_id)
        if answer is None:
            key = f"campaign.{campaign.campaign_id}.{staged.slice}"
            try:
                answer = await self.sending.accept(
                    campaign.user_id, body, key, batch_id=staged.batch_id
                )
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
        if self.sending.templates is None:
            raise ApiError(503, "renderer_unavailable", "templates are not available")
        # Parsed by the renderer, off the event loop: a 422 (the version does not parse, or
        # passes a limit) pauses the campaign with why, a 503 waits for the next pass.
        return await self.sending.templates.personal(version, campaign.data)
