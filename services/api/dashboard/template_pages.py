"""The dashboard's Templates page: each of the user's templates with its versions, which one
is live and which in canary (with its share and start), and its canary rollouts' audited
verdicts (promoted or rolled back, and why). Read-only: templates are made, versioned and
published through ``/v1/templates``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from services.api.dashboard.pages import page, render
from services.api.dashboard.views import fmt_time, iso
from services.api.sessions import require_user
from services.api.templates import Templates
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


@page
async def templates_page(request: Request) -> Response:
    user = await require_user(request)
    request.state.user = user
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
    }
    return render(request, "templates.html", context)


def template_routes() -> list[BaseRoute]:
    return [Route("/templates", templates_page, methods=["GET"], name="dashboard_templates")]
