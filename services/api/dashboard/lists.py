"""The dashboard's Lists page: the user's contact lists with their contact counts and each
one's latest CSV import (its state, progress and problems), read with the same use cases as
``/v1/lists``. Lists are created and imported into through the API."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from services.api.contact_lists import ContactList
from services.api.dashboard.pages import page, render
from services.api.dashboard.views import fmt_time, iso
from services.api.list_import import ImportJob
from services.api.lists import Lists
from services.api.sessions import require_user

#: How each import state is badged.
TONES: Final = {"queued": "pending", "running": "pending", "done": "ok", "failed": "bad"}
#: The counts a summary names (besides rows read), in this order.
_COUNTED: Final = (
    ("added", "added"),
    ("updated", "updated"),
    ("invalid", "invalid"),
    ("duplicates", "duplicate"),
    ("suppressed", "suppressed"),
    ("unsubscribed", "unsubscribed"),
    ("over_limit", "over the limit"),
)


@dataclass(frozen=True, slots=True)
class ImportRow:
    import_id: uuid.UUID
    state: str
    tone: str
    summary: str
    reason: str | None
    updated: str
    updated_iso: str
    problems: int


@dataclass(frozen=True, slots=True)
class ListRow:
    list_id: uuid.UUID
    name: str
    contacts: str
    created: str
    created_iso: str
    latest: ImportRow | None


def import_summary(job: ImportJob) -> str:
    """``1,000 rows read: 990 added, 10 invalid`` (only the counts that are not zero)."""
    p = job.progress
    counts = [(getattr(p, name), label) for name, label in _COUNTED]
    parts = [
        f"{n:,} {label}{'s' if label == 'duplicate' and n != 1 else ''}" for n, label in counts if n
    ]
    head = f"{p.rows_read:,} row{'s' if p.rows_read != 1 else ''} read"
    return f"{head}: {', '.join(parts)}" if parts else head


def import_row(job: ImportJob) -> ImportRow:
    return ImportRow(
        import_id=job.import_id,
        state=job.state,
        tone=TONES.get(job.state, "warn"),
        summary=import_summary(job),
        reason=job.reason,
        updated=fmt_time(job.heartbeat),
        updated_iso=iso(job.heartbeat),
        problems=len(job.problems),
    )


def list_rows(found: Sequence[tuple[ContactList, ImportJob | None]]) -> list[ListRow]:
    return [
        ListRow(
            list_id=x.list_id,
            name=x.name,
            contacts=f"{x.contacts:,}",
            created=fmt_time(x.created_at),
            created_iso=iso(x.created_at),
            latest=import_row(job) if job else None,
        )
        for x, job in found
    ]


@page
async def lists_page(request: Request) -> Response:
    user = await require_user(request)
    request.state.user = user
    rows = list_rows(await Lists.of(request).overview(user.user_id))
    running = any(r.latest is not None and r.latest.tone == "pending" for r in rows)
    context = {"title": "Contact lists", "active": "lists", "rows": rows, "running": running}
    return render(request, "lists.html", context)


def lists_routes() -> list[BaseRoute]:
    return [Route("/lists", lists_page, methods=["GET"], name="dashboard_lists")]
