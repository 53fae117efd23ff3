"""The dashboard's Templates page: each of the user's templates with its versions, which one
is live and which in canary (with its share and start), and its canary rollouts' audited
verdicts (promoted or rolled back, and why); and forms that add a version, preview one
(rendered with its sample data, its HTML in a sandboxed frame) and publish one, live or as a
canary share, through the same use cases as ``/v1/templates``
(:class:`services.api.templates.Templates`). Templates are made through the API."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from services.api.dashboard.pages import checked_form, page, page_user, render, see_other
from services.api.dashboard.views import fmt_time, iso
from services.api.schema import PreviewIn, PublishIn, TemplateVersionIn, checked
from services.api.sessions import SessionUser
from services.api.templates import BODY_LIMIT, Templates
from shared.infra.http import ApiError
from shared.templates.canary import Counts
from shared.templates.canary_store import Outcome
from shared.templates.templates import Template, VersionHeader


@dataclass(frozen=True, slots=True)
class VersionRow:
    version: int
    subject: str
    created: str
    created_iso: str
    state: str
    """``live``, ``canary`` or empty."""


@dataclass(frozen=True, slots=True)
class RolloutRow:
    at: str
    at_iso: str
    canary_version: int
    live_version: int
    decision: str
    rolled_back: bool
    reason: str
    canary: str
    live: str


@dataclass(frozen=True, slots=True)
class TemplateRow:
    template_id: str
    name: str
    created: str
    created_iso: str
    live_version: int | None
    canary_version: int | None
    canary_percent: str
    canary_since: str
    canary_since_iso: str
    versions: list[VersionRow]
    rollouts: list[RolloutRow]


def _state(t: Template, number: int) -> str:
    if number == t.live_version:
        return "live"
    return "canary" if number == t.canary_version else ""


def _tally(c: Counts) -> str:
    """``1,200 sent: 3 provider failures, 2 hard bounces, 0 complaints``."""
    return (
        f"{c.sent:,} sent: {c.provider_failures:,} provider failures, "
        f"{c.hard_bounces:,} hard bounces, {c.complaints:,} complaints"
    )


def rollout_rows(verdicts: Iterable[Outcome]) -> list[RolloutRow]:
    return [
        RolloutRow(
            at=fmt_time(o.at),
            at_iso=iso(o.at),
            canary_version=o.canary_version,
            live_version=o.live_version,
            decision=o.decision,
            rolled_back=o.decision == "rollback",
            reason=o.reason,
            canary=_tally(o.canary),
            live=_tally(o.live),
        )
        for o in verdicts
    ]


def template_rows(
    found: Iterable[tuple[Template, Sequence[VersionHeader], Sequence[Outcome]]],
) -> list[TemplateRow]:
    """Each template with its versions and rollout verdicts (newest first), as the page
    shows them."""
    return [
        TemplateRow(
            template_id=str(t.template_id),
            name=t.name,
            created=fmt_time(t.created_at),
            created_iso=iso(t.created_at),
            live_version=t.live_version,
            canary_version=t.canary_version,
            canary_percent=f"{t.canary_percent:g}%" if t.canary_percent is not None else "",
            canary_since=fmt_time(t.canary_since),
            canary_since_iso=iso(t.canary_since),
            versions=[
                VersionRow(
                    v.version,
                    v.subject,
                    fmt_time(v.created_at),
                    iso(v.created_at),
                    _state(t, v.version),
                )
                for v in versions
            ],
            rollouts=rollout_rows(verdicts),
        )
        for t, versions, verdicts in found
    ]


#: What the page says after a step.
DONE: Final = {
    "version": "Version {} was added: preview it, then publish it.",
    "published": "Version {} is published.",
}


def done_notice(params: Mapping[str, str]) -> str | None:
    message, number = DONE.get(params.get("done", "")), params.get("version", "")
    return message.format(number) if message and number.isdecimal() and len(number) < 6 else None


def version_body(form: Mapping[str, str]) -> dict[str, Any]:
    """The ``POST /v1/templates/{id}/versions`` body the form stands for (blank parts left
    out; the sample is JSON, a 422 naming it when it is not an object)."""
    body: dict[str, Any] = {"subject": form.get("subject", "").strip()}
    for part in ("html", "text"):
        if form.get(part, "").strip():
            body[part] = form[part].replace("\r\n", "\n")
    raw = form.get("sample", "").strip()
    if raw:
        try:
            sample = orjson.loads(raw)
        except orjson.JSONDecodeError:
            sample = None
        if not isinstance(sample, dict):
            raise ApiError(
                422,
                "invalid_fields",
                "the sample data is not valid",
                fields={"sample": 'a JSON object, e.g. {"first_name": "Ann"}'},
            )
        body["sample"] = sample
    return body


def publish_body(form: Mapping[str, str]) -> dict[str, Any]:
    """The ``POST /v1/templates/{id}/publish`` body (a blank share: live at once)."""
    raw = form.get("version", "").strip()
    body: dict[str, Any] = {"version": int(raw) if raw.isascii() and raw.isdecimal() else raw}
    share = form.get("canary_percent", "").strip().removesuffix("%")
    if share:
        try:
            body["canary_percent"] = float(share)
        except ValueError:
            body["canary_percent"] = share  # for the checks to name
    return body


def told(exc: ApiError) -> str:
    """An error of a form on this page, in words (field problems named)."""
    fields = "; ".join(f"{k}: {v}" for k, v in (exc.fields or {}).items())
    return f"Not done: {fields or exc.message}."


@page
async def templates_page(request: Request) -> Response:
    return await _page(request, await page_user(request))


async def _page(
    request: Request, user: SessionUser, *, status: int = 200, problem: str | None = None
) -> Response:
    templates = Templates.of(request)
    found = await templates.store.templates(user.user_id)
    versions, verdicts = await asyncio.gather(
        asyncio.gather(*(templates.store.version_headers(t.template_id) for t in found)),
        asyncio.gather(*(templates.canaries.history(t.template_id) for t in found)),
    )
    context = {
        "title": "Templates",
        "active": "templates",
        "rows": template_rows(zip(found, versions, verdicts, strict=True)),
        "problem": problem,
        "notice": None if problem else done_notice(request.query_params),
    }
    return render(request, "templates.html", context, status=status)


@page
async def add_version(request: Request) -> Response:
    """A new version of the template (as ``POST /v1/templates/{id}/versions``)."""
    user = await page_user(request)
    form = await checked_form(request, user, BODY_LIMIT)
    templates = Templates.of(request)
    found = await templates.owned(user.user_id, request.path_params["template_id"])
    try:
        number = await templates.add_version(found, checked(TemplateVersionIn, version_body(form)))
    except ApiError as exc:
        if exc.status not in (409, 422):
            raise
        return await _page(request, user, status=exc.status, problem=told(exc))
    return see_other("/templates", done="version", version=number)


@page
async def publish(request: Request) -> Response:
    """Publish a version: live, or as a canary share (as ``POST /v1/templates/{id}/publish``;
    it must render with its sample data)."""
    user = await page_user(request)
    form = await checked_form(request, user)
    raw_id = request.path_params["template_id"]
    try:
        done = await Templates.of(request).publish(
            user.user_id, raw_id, checked(PublishIn, publish_body(form))
        )
    except ApiError as exc:
        if exc.status not in (409, 422):
            raise
        return await _page(request, user, status=exc.status, problem=told(exc))
    shown = done.canary_version or done.live_version or 0
    return see_other("/templates", done="published", version=shown)


@page
async def preview(request: Request) -> Response:
    """A version rendered with its sample data (as ``POST /v1/templates/{id}/preview``)."""
    user = await page_user(request)
    raw = request.query_params.get("version", "")
    number = int(raw) if raw.isascii() and raw.isdecimal() and len(raw) < 6 else None
    templates = Templates.of(request)
    found = await templates.owned(user.user_id, request.path_params["template_id"])
    out = await templates.preview(
        user.user_id,
        request.path_params["template_id"],
        checked(PreviewIn, {"version": number}),
    )
    context = {
        "title": f"Preview of {found.name}",
        "active": "templates",
        "name": found.name,
        "out": out,
    }
    return render(request, "template_preview.html", context)


def template_routes() -> list[BaseRoute]:
    return [
        Route("/templates", templates_page, methods=["GET"], name="dashboard_templates"),
        Route("/templates/{template_id}/versions", add_version, methods=["POST"]),
        Route("/templates/{template_id}/publish", publish, methods=["POST"]),
        Route("/templates/{template_id}/preview", preview, methods=["GET"]),
    ]
