"""The dashboard's Campaigns page: the user's campaigns with their state (and why one paused
by itself), send time and progress, and forms that schedule, pause, resume or cancel one
through the same use cases as ``/v1/campaigns`` (``services.api.campaigns.Campaigns``),
and a form that creates a draft (one of the user's templates to one of their lists) as
``POST /v1/campaigns`` does, with its checks told beside the fields.

A step the campaign's state does not allow (a stale page, a second tab) shows the page
again with the reason and the 409, never an error page: the list beside it is current."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast, get_args

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from services.api.campaigns import Campaigns
from services.api.dashboard.pages import checked_form, page, page_user, render, see_other
from services.api.dashboard.views import fmt_time, form_errors, iso
from services.api.schema import CampaignIn, checked
from services.api.sessions import SessionUser
from shared.audience.campaigns import Action, Campaign, LifecycleError, next_state
from shared.infra.http import ApiError

#: How each state is badged.
TONES: Final = {
    "draft": "pending",
    "scheduled": "pending",
    "sending": "ok",
    "paused": "warn",
    "sent": "ok",
    "cancelled": "bad",
}
#: The buttons, in the order shown.
ACTIONS: Final[tuple[Action, ...]] = get_args(Action)
#: What the page says after each step (about the campaign it names).
DONE: Final = {
    "schedule": "{} is scheduled.",
    "pause": "{} is paused: its held mail waits until you resume it.",
    "resume": "{} is resumed.",
    "cancel": "{} is cancelled: nothing more of it will be sent.",
    "create": "{} is created as a draft: schedule it to send it.",
}
#: The create form's fields (``from`` is the body's name for the sender).
FORM_FIELDS: Final = ("name", "template_id", "list_id", "from", "rate", "send_at")
#: Campaigns whose recipient counts are read at once (each reads its batches' counts).
_COUNTING: Final = 4


@dataclass(frozen=True, slots=True)
class CampaignRow:
    campaign_id: uuid.UUID
    name: str
    state: str
    tone: str
    reason: str | None
    template: str
    contact_list: str
    send_at: str
    send_at_iso: str
    created: str
    created_iso: str
    batches: int
    released: str
    skipped: str
    queued: str
    success: str
    failed: str
    actions: tuple[str, ...]
    """The steps its state allows, in :data:`ACTIONS` order."""


def allowed(c: Campaign) -> tuple[str, ...]:
    """The steps ``c``'s state allows (the lifecycle decides, not the page)."""
    out = []
    for action in ACTIONS:
        try:
            next_state(c.state, action, started=c.slices > 0)
        except LifecycleError:
            continue
        out.append(action)
    return tuple(out)


def campaign_rows(
    found: Sequence[tuple[Campaign, Counter[str]]],
    template_names: Mapping[uuid.UUID, str],
    list_names: Mapping[uuid.UUID, str],
) -> list[CampaignRow]:
    return [
        CampaignRow(
            campaign_id=c.campaign_id,
            name=c.name,
            state=c.state,
            tone=TONES.get(c.state, "warn"),
            reason=c.reason,
            template=template_names.get(c.template_id, str(c.template_id)),
            contact_list=list_names.get(c.list_id, str(c.list_id)),
            send_at=fmt_time(c.send_at) if c.send_at else "As soon as scheduled",
            send_at_iso=iso(c.send_at),
            created=fmt_time(c.created_at),
            created_iso=iso(c.created_at),
            batches=c.slices,
            released=f"{c.released:,}",
            skipped=f"{c.skipped:,}",
            queued=f"{counts.get('queued', 0):,}",
            success=f"{counts.get('success', 0):,}",
            failed=f"{counts.get('failed', 0):,}",
            actions=allowed(c),
        )
        for c, counts in found
    ]


def done_notice(params: Mapping[str, str], rows: Sequence[CampaignRow]) -> str | None:
    """The confirmation after a step: only for a known step and one of the user's campaigns,
    named from the store (the page never repeats arbitrary text from its URL)."""
    message = DONE.get(params.get("done", ""))
    names = {str(r.campaign_id): r.name for r in rows}
    name = names.get(params.get("campaign", ""))
    return message.format(f"“{name}”") if message and name is not None else None


async def _counted(campaigns: Campaigns, found: Sequence[Campaign]) -> list[Counter[str]]:
    window = asyncio.Semaphore(_COUNTING)

    async def one(c: Campaign) -> Counter[str]:
        if c.slices == 0:
            return Counter()
        async with window:
            return await campaigns.counts(c)

    return list(await asyncio.gather(*(one(c) for c in found)))


def create_body(form: Mapping[str, str]) -> dict[str, Any]:
    """The ``POST /v1/campaigns`` body the create form stands for (a blank optional field is
    left out; a rate that is not a number is sent as typed, for the checks to name)."""
    body: dict[str, Any] = {k: form.get(k, "").strip() for k in FORM_FIELDS}
    for optional in ("rate", "send_at"):
        if not body[optional]:
            del body[optional]
    rate = body.get("rate")
    if isinstance(rate, str) and rate.isascii() and rate.isdecimal():
        body["rate"] = int(rate)
    return body


async def _page(
    request: Request,
    user: SessionUser,
    *,
    status: int = 200,
    problem: str | None = None,
    errors: Mapping[str, list[str]] | None = None,
    values: Mapping[str, str] | None = None,
) -> Response:
    campaigns: Campaigns = request.app.state.campaigns
    found, templates, lists = await asyncio.gather(
        campaigns.store.campaigns(user.user_id),
        campaigns.templates.templates(user.user_id),
        campaigns.lists.lists(user.user_id),
    )
    rows = campaign_rows(
        list(zip(found, await _counted(campaigns, found), strict=True)),
        {t.template_id: t.name for t in templates},
        {x.list_id: x.name for x in lists},
    )
    context: dict[str, Any] = {
        "title": "Campaigns",
        "active": "campaigns",
        "rows": rows,
        "problem": problem,
        "notice": None if problem or errors else done_notice(request.query_params, rows),
        "templates": sorted(((str(t.template_id), t.name) for t in templates), key=_by_name),
        "lists": sorted(((str(x.list_id), x.name) for x in lists), key=_by_name),
        "errors": dict(errors or {}),
        "values": {k: (values or {}).get(k, "") for k in FORM_FIELDS},
    }
    return render(request, "campaigns.html", context, status=status)


def _by_name(pair: tuple[str, str]) -> str:
    return pair[1].lower()


@page
async def campaigns_page(request: Request) -> Response:
    """The user's campaigns; POST creates a draft (as ``POST /v1/campaigns`` does)."""
    user = await page_user(request)
    if request.method != "POST":
        return await _page(request, user)
    form = await checked_form(request, user)
    campaigns: Campaigns = request.app.state.campaigns
    try:
        made = await campaigns.create(user.user_id, checked(CampaignIn, create_body(form)))
    except ApiError as exc:
        if exc.status not in (409, 422):
            raise
        errors = form_errors(exc.fields or {}, form_fields=FORM_FIELDS) or {"form": [exc.message]}
        return await _page(request, user, status=exc.status, errors=errors, values=form)
    return see_other("/campaigns", done="create", campaign=str(made.campaign_id))


@page
async def campaign_step(request: Request) -> Response:
    """Schedule, pause, resume or cancel one campaign (``send_at``: an RFC 3339 time to
    schedule it for, empty for the time it was made with)."""
    user = await page_user(request)
    form = await checked_form(request, user)
    action = request.path_params["action"]
    if action not in ACTIONS:
        raise ApiError(404, "not_found", "There is no such campaign step.")
    campaign_id = _campaign_id(request.path_params["campaign_id"])
    send_at = (form.get("send_at") or "").strip() or None
    campaigns: Campaigns = request.app.state.campaigns
    try:
        await campaigns.act(
            user.user_id,
            campaign_id,
            cast(Action, action),
            send_at if action == "schedule" else None,
        )
    except ApiError as exc:
        if exc.status not in (409, 422):
            raise
        told = "; ".join(f"{k} {v}" for k, v in (exc.fields or {}).items()) or exc.message
        return await _page(request, user, status=exc.status, problem=f"Not done: {told}.")
    return see_other("/campaigns", done=action, campaign=str(campaign_id))


def _campaign_id(value: str) -> uuid.UUID:
    """A campaign id from the path: a time UUID (any other kind names nothing, and Cassandra
    would refuse it in a ``timeuuid`` column)."""
    try:
        found = uuid.UUID(value)
    except ValueError:
        found = None
    if found is None or found.version != 1:
        raise ApiError(404, "not_found", "There is no such campaign in your account.")
    return found


def campaign_routes() -> list[BaseRoute]:
    return [
        Route("/campaigns", campaigns_page, methods=["GET", "POST"], name="dashboard_campaigns"),
        Route(
            "/campaigns/{campaign_id}/{action}",
            campaign_step,
            methods=["POST"],
            name="dashboard_campaign_step",
        ),
    ]
