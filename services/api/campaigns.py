"""``/v1/campaigns``: a template sent to a contact list, now or later. Create (a draft),
list, read (with its progress), schedule, pause, resume, cancel and delete; the runner
(``services.api.campaign_runner``) does the sending, ``shared.audience.campaigns`` owns the
lifecycle.

A lifecycle step the campaign's state does not allow is a 409 naming the state; a step that
raced another (the runner starting it, a second click) is answered from the state it found.
A user's campaigns are capped (``services.api.capping``): a place is claimed before one is
made and given back once it is deleted (a draft, or one that ended). A list or template a
campaign that has not ended uses cannot be deleted (409 ``in_use``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from services.api import schema
from services.api.auth import require_key
from services.api.capping import Caps, Census
from services.api.contact_lists import ContactBook
from services.api.operations import CAMPAIGN_ID, operation
from services.api.queries import batch_counts, path_uuid
from services.api.schema import CampaignIn, CampaignScheduleIn, checked
from services.api.sending import Sending
from shared.audience.campaigns import (
    DELETABLE,
    Action,
    Campaign,
    LifecycleError,
    StoredCampaigns,
    next_state,
)
from shared.core import lanes
from shared.core.addresses import parse_address
from shared.delivery.batchstore import BatchStore
from shared.infra.http import Answer, ApiError, read_json
from shared.infra.leases import CAMPAIGNS_WAKE, wake
from shared.templates.templates import StoredTemplates

SMALL_BODY = 64 * 1024
#: Recipients a second a campaign sends at unless it says.
DEFAULT_RATE = 2_000


def _invalid(field: str, problem: str) -> ApiError:
    return ApiError(
        422, "invalid_fields", "the request has invalid fields", fields={field: problem}
    )


def view(c: Campaign, counts: Counter[str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": str(c.campaign_id),
        "name": c.name,
        "template_id": str(c.template_id),
        "list_id": str(c.list_id),
        "from": c.sender,
        "data": c.data,
        "rate": c.rate,
        "send_at": c.send_at.isoformat() if c.send_at else None,
        "state": c.state,
        "reason": c.reason,
        "created_at": c.created_at.isoformat(),
        "updated_at": c.updated_at.isoformat() if c.updated_at else None,
        "progress": {"batches": c.slices, "released": c.released, "skipped": c.skipped},
    }
    if counts is not None:
        out["progress"].update({s: counts.get(s, 0) for s in ("queued", "success", "failed")})
    return out


@dataclass(frozen=True, slots=True)
class Campaigns:
    """The use cases (the dashboard shares them)."""

    store: StoredCampaigns
    templates: StoredTemplates
    lists: ContactBook
    batches: BatchStore
    sending: Sending
    caps: Caps

    async def create(self, user_id: uuid.UUID, body: CampaignIn) -> Campaign:
        """A new draft, if the user has room for one (409 ``too_many_campaigns``)."""
        template_id = _uuid(body.template_id, "template_id")
        list_id = _uuid(body.list_id, "list_id")
        template = await self.templates.get(user_id, template_id)
        if template is None:
            raise _invalid("template_id", "no such template of yours")
        if await self.lists.get(user_id, list_id) is None:
            raise _invalid("list_id", "no such list of yours")
        sender = _sender(body.from_)
        await self.sending.check_sender(user_id, sender["email"])
        send_at = self._send_at(body.send_at)
        campaign_id = uuid.uuid1()
        await self.caps.claim(user_id, "campaigns", str(campaign_id), self._campaigns_of(user_id))
        return await self.store.create(
            user_id,
            body.name,
            template_id,
            list_id,
            sender,
            body.data or {},
            body.rate or DEFAULT_RATE,
            send_at,
            campaign_id,
        )

    async def delete(self, user_id: uuid.UUID, campaign_id: uuid.UUID) -> None:
        """Delete a draft or a campaign that ended (409 ``campaign_state`` while it is
        scheduled, sending or paused: cancel it first) and give its place back."""
        for _ in range(5):
            campaign = await self.store.get(user_id, campaign_id)
            if campaign is None:
                break  # deleted meanwhile: as asked
            if campaign.state not in DELETABLE:
                raise ApiError(
                    409,
                    "campaign_state",
                    f"the campaign is {campaign.state}: cancel it before deleting it",
                )
            if await self.store.delete(campaign):
                break
            # Raced (scheduled or deleted meanwhile): look again.
        else:
            raise ApiError(409, "campaign_busy", "the campaign keeps changing; try again")
        await self.caps.release_quietly(user_id, "campaigns", str(campaign_id))

    async def refuse_if_used(
        self,
        user_id: uuid.UUID,
        *,
        list_id: uuid.UUID | None = None,
        template_id: uuid.UUID | None = None,
    ) -> None:
        """409 ``in_use`` naming a campaign that has not ended (a draft included) and sends
        the list or template: deleting it would leave the campaign nothing to send."""
        for c in await self.store.campaigns(user_id):
            if c.state in ("sent", "cancelled"):
                continue
            if c.list_id == list_id or c.template_id == template_id:
                what = "list" if c.list_id == list_id else "template"
                raise ApiError(
                    409,
                    "in_use",
                    f"the campaign “{c.name}” ({c.campaign_id}, {c.state}) sends this {what}: "
                    "cancel or delete it first",
                )

    def _campaigns_of(self, user_id: uuid.UUID) -> Census:
        async def census(_: Collection[str]) -> set[str]:
            return {str(c.campaign_id) for c in await self.store.campaigns(user_id)}

        return census

    def _send_at(self, value: str | None) -> datetime | None:
        horizon = timedelta(days=self.sending.settings.api.schedule_horizon_days)
        try:
            return lanes.send_at(value, datetime.now(UTC), horizon)
        except lanes.ScheduleError as exc:
            raise _invalid("send_at", str(exc)) from None

    async def get(self, user_id: uuid.UUID, campaign_id: uuid.UUID) -> Campaign:
        found = await self.store.get(user_id, campaign_id)
        if found is None:
            raise ApiError(404, "not_found", "no such campaign")
        return found

    async def counts(self, campaign: Campaign) -> Counter[str]:
        """Its recipients per state, over the batches it released so far."""
        window = asyncio.Semaphore(8)
        total: Counter[str] = Counter()

        async def one(batch_id: uuid.UUID) -> Counter[str]:
            async with window:
                states, _, _ = await batch_counts(self.batches, batch_id)
            return states

        parts = await self.store.slices(campaign.campaign_id)
        for states in await asyncio.gather(*(one(p.batch_id) for p in parts)):
            total.update(states)
        return total

    async def act(
        self, user_id: uuid.UUID, campaign_id: uuid.UUID, action: Action, send_at: str | None
    ) -> Campaign:
        when = self._send_at(send_at) if send_at is not None else None
        for _ in range(5):
            campaign = await self.get(user_id, campaign_id)
            try:
                to = next_state(campaign.state, action, started=campaign.slices > 0)
            except LifecycleError as exc:
                if _already(campaign.state, action):
                    return campaign  # a repeated click: the same answer
                raise ApiError(409, "campaign_state", str(exc)) from None
            if await self.store.move(campaign, to, send_at=when):
                if to in ("scheduled", "sending"):
                    # An idle runner waits for its own next due time: wake them all (a lost
                    # wake-up costs its lease's renewal period, 5 s at most).
                    self.sending.background.spawn(
                        wake(self.sending.acceptance.broker, CAMPAIGNS_WAKE)
                    )
                return await self.get(user_id, campaign_id)
            # Raced (the runner started or finished it): look again.
        raise ApiError(409, "campaign_busy", "the campaign keeps changing; try again")


def _already(state: str, action: Action) -> bool:
    return (action, state) in {("pause", "paused"), ("cancel", "cancelled")}


def _uuid(value: str, field: str) -> uuid.UUID:
    """One of our ids: a time UUID (Cassandra refuses any other kind in a ``timeuuid``
    column, which would be a 500)."""
    try:
        found = uuid.UUID(value)
    except ValueError:
        raise _invalid(field, "must be an id (a UUID string)") from None
    if found.version != 1:
        raise _invalid(field, "must be one of our ids (a time UUID, version 1)")
    return found


def _sender(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            address = parse_address(value)
        except ValueError as exc:
            raise _invalid("from", f"not an address: {exc}") from None
        return {"email": address.email, "name": address.name}
    return {"email": value.email, "name": value.name}


def _campaigns(request: Request) -> Campaigns:
    found: Campaigns = request.app.state.campaigns
    return found


@operation(
    "create_campaign",
    "Create a campaign (a draft): a template sent to a contact list",
    schema.CampaignOut,
    status=201,
    body=schema.CampaignIn,
    errors=(400, 409, 413, 415, 422),
    description="409 `too_many_campaigns` when you have as many campaigns as you may, "
    "ended ones included (`error.limit`); deleting one frees its place.",
)
async def create_campaign(request: Request) -> Response:
    key = await require_key(request, "send")
    _, body = await read_json(request, SMALL_BODY)
    made = await _campaigns(request).create(key.user_id, checked(CampaignIn, body))
    return Answer(schema.CampaignOut.model_validate(view(made)), status_code=201)


@operation(
    "list_campaigns",
    "Your campaigns, newest first",
    schema.CampaignList,
)
async def list_campaigns(request: Request) -> Response:
    key = await require_key(request, "read")
    found = await _campaigns(request).store.campaigns(key.user_id)
    return Answer(schema.CampaignList.model_validate({"data": [view(c) for c in found]}))


@operation(
    "get_campaign",
    "A campaign with its progress: batches, recipients released and per state",
    schema.CampaignOut,
    params=(CAMPAIGN_ID,),
    errors=(404,),
)
async def get_campaign(request: Request) -> Response:
    key = await require_key(request, "read")
    campaigns = _campaigns(request)
    campaign = await campaigns.get(key.user_id, path_uuid(request, "campaign_id"))
    return Answer(
        schema.CampaignOut.model_validate(view(campaign, await campaigns.counts(campaign)))
    )


@operation(
    "delete_campaign",
    "Delete a draft, or a campaign that was sent or cancelled",
    None,
    status=204,
    params=(CAMPAIGN_ID,),
    errors=(404, 409),
    description="409 `campaign_state` while it is scheduled, sending or paused: cancel "
    "it first. Its batches stay.",
)
async def delete_campaign(request: Request) -> Response:
    key = await require_key(request, "send")
    campaigns = _campaigns(request)
    found = await campaigns.get(key.user_id, path_uuid(request, "campaign_id"))
    await campaigns.delete(key.user_id, found.campaign_id)
    return Response(status_code=204)


async def _act(request: Request, action: Action) -> Response:
    key = await require_key(request, "send")
    send_at = await _schedule_body(request) if action == "schedule" else None
    campaign = await _campaigns(request).act(
        key.user_id, path_uuid(request, "campaign_id"), action, send_at
    )
    return Answer(schema.CampaignOut.model_validate(view(campaign)))


async def _schedule_body(request: Request) -> str | None:
    """The schedule step's ``send_at``: its body is optional (none, or a blank one, keeps the
    time the campaign was made with), and read under the size cap like any other."""
    _, body = await read_json(request, SMALL_BODY, optional=True)
    return None if body is None else checked(CampaignScheduleIn, body).send_at


@operation(
    "schedule_campaign",
    "Schedule a draft: it starts at its send_at (now when it has none)",
    schema.CampaignOut,
    body=schema.CampaignScheduleIn,
    params=(CAMPAIGN_ID,),
    errors=(400, 404, 409, 413, 415, 422),
    description="The body may set a new `send_at`. It goes out in batches of the template's live "
    "version at the campaign's rate, as bulk mail with a one-click unsubscribe from the "
    "list; the list's unsubscribes and your suppressions are left out.",
)
async def schedule_campaign(request: Request) -> Response:
    return await _act(request, "schedule")


@operation(
    "pause_campaign",
    "Pause a scheduled or sending campaign",
    schema.CampaignOut,
    params=(CAMPAIGN_ID,),
    errors=(404, 409),
    description="Nothing more is handed to a provider from about a second on; what was released "
    "waits, and a resume sends it with nothing sent twice. Pausing a paused campaign "
    "answers the same.",
)
async def pause_campaign(request: Request) -> Response:
    return await _act(request, "pause")


@operation(
    "resume_campaign",
    "Resume a paused campaign",
    schema.CampaignOut,
    params=(CAMPAIGN_ID,),
    errors=(404, 409),
    description="It goes on where it stopped (or waits for its send_at if it had not started).",
)
async def resume_campaign(request: Request) -> Response:
    return await _act(request, "resume")


@operation(
    "cancel_campaign",
    "Cancel a campaign that has not been sent",
    schema.CampaignOut,
    params=(CAMPAIGN_ID,),
    errors=(404, 409),
    description="Nothing more is released; recipients of released batches not yet handed to a "
    "provider end failed (`its campaign was cancelled`).",
)
async def cancel_campaign(request: Request) -> Response:
    return await _act(request, "cancel")
