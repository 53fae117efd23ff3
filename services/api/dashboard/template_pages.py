"""The dashboard's Templates page: each of the user's templates with its versions, which one
is live and which in canary (with its share and start). Read-only: templates are made,
versioned and published through ``/v1/templates``."""

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
from shared.templates import Template, VersionHeader


@dataclass(frozen=True, slots=True)
class VersionRow:
    version: int
    subject: str
    created: str
    created_iso: str
    state: str
    """``live``, ``canary`` or empty."""


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


def _state(t: Template, number: int) -> str:
    if number == t.live_version:
        return "live"
    return "canary" if number == t.canary_version else ""


def template_rows(
    found: Iterable[tuple[Template, Sequence[VersionHeader]]],
) -> list[TemplateRow]:
    """Each template with its versions (newest first), as the page shows them."""
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
        )
        for t, versions in found
    ]


@page
async def templates_page(request: Request) -> Response:
    user = await require_user(request)
    request.state.user = user
    store = Templates.of(request).store
    found = await store.templates(user.user_id)
    versions = await asyncio.gather(*(store.version_headers(t.template_id) for t in found))
    context = {
        "title": "Templates",
        "active": "templates",
        "rows": template_rows(zip(found, versions, strict=True)),
    }
    return render(request, "templates.html", context)


def template_routes() -> list[BaseRoute]:
    return [Route("/templates", templates_page, methods=["GET"], name="dashboard_templates")]
