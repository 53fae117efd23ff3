"""The dashboard's Lists pages: the user's contact lists with their contact counts and each
one's latest CSV import (its state, progress and problems); a list made or deleted; one list's
contacts a page at a time, each removable; and a CSV file imported into it, uploaded by the
page's script to ``POST /lists/{id}/imports`` (the session's cookie and CSRF token; the body
is the file as ``text/csv``) whose import the page then follows each second from
``GET /lists/{id}/imports/{import_id}`` into a ``<progress>``. Both answer JSON as the API
does. Everything goes through the same use cases as ``/v1/lists``
(:class:`services.api.lists.Lists`); another user's list is a 404."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from services.api.contact_lists import ContactList, ListContact
from services.api.dashboard.pages import (
    checked_form,
    page,
    page_user,
    render,
    see_other,
)
from services.api.dashboard.views import fmt_time, form_errors, iso
from services.api.list_import import ImportJob
from services.api.lists import Lists, import_view, list_name
from services.api.queries import path_uuid
from services.api.sessions import SessionUser, current_user, verify_csrf
from shared.infra.http import ApiError

#: How each import state is badged.
TONES: Final = {"queued": "pending", "running": "pending", "done": "ok", "failed": "bad"}
#: Contacts on a page of a list.
CONTACTS_PER_PAGE: Final = 50
#: The states an import may still move from.
RUNNING: Final = frozenset({"queued", "running"})
_NOTICES: Final = {
    "created": "The list was created: import a CSV file into it below.",
    "deleted": "The list was deleted with its contacts.",
    "removed": "The contact was removed from the list.",
}
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


@dataclass(frozen=True, slots=True)
class ContactRow:
    email: str
    name: str
    fields: str
    added: str
    added_iso: str


def contact_rows(found: Sequence[ListContact]) -> list[ContactRow]:
    return [
        ContactRow(
            email=c.email,
            name=c.name or "",
            fields=", ".join(f"{k}: {v}" for k, v in sorted(c.fields.items())),
            added=fmt_time(c.added_at),
            added_iso=iso(c.added_at),
        )
        for c in found
    ]


def done_notice(params: Mapping[str, str]) -> str | None:
    return _NOTICES.get(params.get("done", ""))


async def _lists_page(
    request: Request, user: SessionUser, *, status: int = 200, **extra: Any
) -> Response:
    rows = list_rows(await Lists.of(request).overview(user.user_id))
    running = any(r.latest is not None and r.latest.tone == "pending" for r in rows)
    context: dict[str, Any] = {
        "title": "Contact lists",
        "active": "lists",
        "rows": rows,
        "running": running,
        "errors": {},
        "values": {"name": ""},
        "notice": done_notice(request.query_params),
    }
    context.update(extra)
    return render(request, "lists.html", context, status=status)


@page
async def lists_page(request: Request) -> Response:
    """The user's lists; POST creates one (as ``POST /v1/lists`` does)."""
    user = await page_user(request)
    if request.method != "POST":
        return await _lists_page(request, user)
    form = await checked_form(request, user)
    name = form.get("name", "")
    try:
        made = await Lists.of(request).create(user.user_id, list_name({"name": name}))
    except ApiError as exc:
        if exc.status not in (409, 422):
            raise
        errors = form_errors(exc.fields or {"name": exc.message}, form_fields={"name"})
        values = {"name": name}
        return await _lists_page(request, user, status=exc.status, errors=errors, values=values)
    return see_other(f"/lists/{made.list_id}", done="created")


async def _list_page(
    request: Request, user: SessionUser, found: ContactList, *, status: int = 200, **extra: Any
) -> Response:
    lists = Lists.of(request)
    cursor = request.query_params.get("cursor")
    contacts, next_cursor = await lists.contacts(found, cursor, CONTACTS_PER_PAGE)
    latest = await lists.latest(found)
    (row,) = list_rows([(found, latest)])
    context: dict[str, Any] = {
        "title": f"List {found.name}",
        "active": "lists",
        "l": row,
        "running": latest is not None and latest.state in RUNNING,
        "contacts": contact_rows(contacts),
        "next_cursor": next_cursor,
        "paged": bool(cursor),
        "problem": None,
        "notice": done_notice(request.query_params),
    }
    context.update(extra)
    return render(request, "list.html", context, status=status)


async def _owned(request: Request, user: SessionUser) -> ContactList:
    return await Lists.of(request).owned(user.user_id, path_uuid(request, "list_id"))


@page
async def list_page(request: Request) -> Response:
    """One list: its latest import, the CSV upload and its contacts a page at a time."""
    user = await page_user(request)
    return await _list_page(request, user, await _owned(request, user))


@page
async def delete_list(request: Request) -> Response:
    """Delete the list (as ``DELETE /v1/lists/{id}``: refused while an import of it runs or
    a campaign sends it, which the page tells)."""
    user = await page_user(request)
    await checked_form(request, user)
    found = await _owned(request, user)
    try:
        await request.app.state.campaigns.refuse_if_used(user.user_id, list_id=found.list_id)
        await Lists.of(request).delete(found)
    except ApiError as exc:
        if exc.status != 409:
            raise
        return await _list_page(request, user, found, status=409, problem=exc.message)
    return see_other("/lists", done="deleted")


@page
async def remove_contact(request: Request) -> Response:
    user = await page_user(request)
    form = await checked_form(request, user)
    found = await _owned(request, user)
    await Lists.of(request).remove_contact(found, form.get("email", ""))
    return see_other(f"/lists/{found.list_id}", done="removed")


async def upload(request: Request) -> Response:
    """The page's CSV upload: the body is the file (``text/csv``), the CSRF token in
    ``X-CSRF-Token``. Answers 202 with the import's id and the rows it will read, or the
    API's JSON error (a missing session: 401)."""
    user = await _json_user(request)
    await verify_csrf(request, user, None)
    job, rows = await Lists.of(request).upload(request, user.user_id, path_uuid(request, "list_id"))
    answer = {"import_id": str(job.import_id), "state": job.state, "rows": rows}
    return JSONResponse(answer, status_code=202, headers={"Cache-Control": "no-store"})


async def import_progress(request: Request) -> Response:
    """An import's progress and report, as ``GET /v1/lists/{id}/imports/{import_id}``."""
    user = await _json_user(request)
    lists = Lists.of(request)
    found = await lists.owned(user.user_id, path_uuid(request, "list_id"))
    job = await lists.import_of(found, path_uuid(request, "import_id"))
    view = {**import_view(job), "summary": import_summary(job)}
    return JSONResponse(view, headers={"Cache-Control": "no-store"})


async def _json_user(request: Request) -> SessionUser:
    user = await current_user(request)
    if user is None:
        raise ApiError(401, "unauthorized", "log in again: the session has ended")
    return user


def lists_routes() -> list[BaseRoute]:
    return [
        Route("/lists", lists_page, methods=["GET", "POST"], name="dashboard_lists"),
        Route("/lists/{list_id}", list_page, methods=["GET"], name="dashboard_list"),
        Route("/lists/{list_id}/delete", delete_list, methods=["POST"]),
        Route("/lists/{list_id}/contacts/remove", remove_contact, methods=["POST"]),
        Route("/lists/{list_id}/imports", upload, methods=["POST"]),
        Route("/lists/{list_id}/imports/{import_id}", import_progress, methods=["GET"]),
    ]
