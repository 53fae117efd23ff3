"""``/v1/lists``: contact lists: create, list, read (with counts and the latest import), page
through contacts, remove one, import a CSV file (in the background, 202) and follow the
import's progress and report.

:class:`Lists` holds the use cases (the dashboard shares them); the handlers parse, call
and answer. Another user's list is a 404, as a missing one is. One import runs per list at a
time (409 while one does); an import whose process died reads as failed once its heartbeat
is stale, and another may then begin.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from services.api.auth import require_key
from services.api.importing import Importer
from services.api.queries import decode_cursor, encode_cursor, page_limit, path_uuid
from services.api.schema import ListIn, checked
from shared import contacts_csv
from shared.background import Background
from shared.config import ListSettings
from shared.contact_lists import (
    BUCKETS,
    ContactList,
    ContactLists,
    ListContact,
    Position,
    read_page,
)
from shared.http import JSON, ApiError, read_capped, read_json
from shared.list_import import ImportJob, live, shown
from shared.suppressions import SuppressionStore

SMALL_BODY = 4 * 1024
#: Content types taken for a CSV import.
CSV_TYPES = frozenset({"text/csv", "application/csv"})
#: Seconds an import's body may take to arrive (it may be tens of MB).
UPLOAD_TIMEOUT = 300.0
#: Latest imports read at once when listing a user's lists (one query each).
LATEST_WINDOW = 8


def _when(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


def import_view(job: ImportJob) -> dict[str, Any]:
    p = job.progress
    return {
        "id": str(job.import_id),
        "list_id": str(job.list_id),
        "state": job.state,
        "reason": job.reason,
        "created_at": job.created_at.isoformat(),
        "updated_at": job.heartbeat.isoformat(),
        "finished_at": _when(job.finished_at),
        "progress": {
            "rows_read": p.rows_read,
            "added": p.added,
            "updated": p.updated,
            "invalid": p.invalid,
            "duplicates": p.duplicates,
            "suppressed": p.suppressed,
            "unsubscribed": p.unsubscribed,
            "over_limit": p.over_limit,
        },
        "problems": [
            {"row": x.row, "email": x.email, "kind": x.kind, "reason": x.reason}
            for x in job.problems
        ],
    }


def list_view(found: ContactList, latest: ImportJob | None) -> dict[str, Any]:
    return {
        "id": str(found.list_id),
        "name": found.name,
        "created_at": found.created_at.isoformat(),
        "contacts": found.contacts,
        "latest_import": import_view(latest) if latest else None,
    }


def contact_view(c: ListContact) -> dict[str, Any]:
    return {
        "email": c.email,
        "name": c.name,
        "fields": c.fields,
        "added_at": c.added_at.isoformat(),
    }


@dataclass(frozen=True, slots=True)
class Lists:
    """The use cases behind ``/v1/lists``: raw values in, lists and imports out, or
    ApiError."""

    store: ContactLists
    suppressions: SuppressionStore
    background: Background
    settings: ListSettings

    @classmethod
    def of(cls, request: Request) -> Lists:
        state = request.app.state
        return cls(
            ContactLists(state.resources.db),
            state.suppressions,
            state.background,
            state.settings.lists,
        )

    @property
    def stale_after(self) -> timedelta:
        return timedelta(seconds=self.settings.import_stale_after)

    async def owned(self, user_id: uuid.UUID, list_id: uuid.UUID) -> ContactList:
        found = await self.store.get(user_id, list_id)
        if found is None:
            raise ApiError(404, "not_found", "no such list")
        return found

    async def latest(self, found: ContactList) -> ImportJob | None:
        """The list's latest import as it is to be shown (a stale one as failed)."""
        if found.latest_import is None:
            return None
        job = await self.store.get_import(found.list_id, found.latest_import)
        return shown(job, datetime.now(UTC), self.stale_after) if job else None

    async def overview(self, user_id: uuid.UUID) -> list[tuple[ContactList, ImportJob | None]]:
        """Every list of the user with its latest import, newest list first."""
        mine = await self.store.lists(user_id)
        window = asyncio.Semaphore(LATEST_WINDOW)

        async def one(found: ContactList) -> ImportJob | None:
            async with window:
                return await self.latest(found)

        latest = await asyncio.gather(*(one(x) for x in mine))
        return list(zip(mine, latest, strict=True))

    async def begin_import(self, found: ContactList, data: bytes) -> ImportJob:
        """Check ``data``'s layout (422 when it cannot be imported at all), take the list's
        import (409 while another runs) and start it in the background."""
        try:
            await asyncio.to_thread(contacts_csv.check, data)
        except contacts_csv.CsvError as exc:
            raise ApiError(
                422, "invalid_csv", f"the file cannot be imported: {exc}", fields={"body": str(exc)}
            ) from None
        now = datetime.now(UTC)
        previous = await self.latest(found)
        if previous is not None and live(previous, now, self.stale_after):
            raise _busy()
        job = ImportJob(found.list_id, uuid.uuid1(), found.user_id, "queued", now, now)
        if not await self.store.begin_import(job, found.latest_import):
            raise _busy()
        importer = Importer(self.store, self.suppressions, self.settings)
        self.background.spawn(importer.run(job, data, base=found.contacts))
        return job

    async def remove_contact(self, found: ContactList, email: str) -> None:
        if not email.strip() or not await self.store.remove(found.list_id, email.strip()):
            raise ApiError(404, "not_found", "that address is not in the list")
        # The next import's recount corrects this if two removals raced.
        await self.store.set_count(found.user_id, found.list_id, max(found.contacts - 1, 0))


def _busy() -> ApiError:
    return ApiError(409, "import_running", "an import of this list is in progress; wait for it")


# ------------------------------------------------------------------------------ handlers


async def create_list(request: Request) -> Response:
    key = await require_key(request, "send")
    _, body = await read_json(request, SMALL_BODY)
    name = checked(ListIn, body).name.strip()
    if not name:
        raise ApiError(422, "invalid_fields", "bad name", fields={"name": "must not be blank"})
    made = await Lists.of(request).store.create(key.user_id, name)
    return JSON(list_view(made, None), status_code=201)


async def list_lists(request: Request) -> Response:
    key = await require_key(request, "read")
    found = await Lists.of(request).overview(key.user_id)
    return JSON({"data": [list_view(x, latest) for x, latest in found]})


async def get_list(request: Request) -> Response:
    key = await require_key(request, "read")
    lists = Lists.of(request)
    found = await lists.owned(key.user_id, path_uuid(request, "list_id"))
    return JSON(list_view(found, await lists.latest(found)))


async def list_contacts(request: Request) -> Response:
    key = await require_key(request, "read")
    limit = page_limit(request, default=100, maximum=1000)
    at = _position(request.query_params.get("cursor"))
    lists = Lists.of(request)
    found = await lists.owned(key.user_id, path_uuid(request, "list_id"))
    page, following = await read_page(lists.store, found.list_id, at, limit)
    cursor = (
        encode_cursor({"bucket": following.bucket, "after": following.after})
        if following is not None
        else None
    )
    return JSON({"data": [contact_view(c) for c in page], "next_cursor": cursor})


def _position(cursor: str | None) -> Position:
    data = decode_cursor(cursor)
    if data is None:
        return Position()
    bucket, after = data.get("bucket"), data.get("after")
    if (
        not isinstance(bucket, int)
        or isinstance(bucket, bool)
        or not 0 <= bucket <= BUCKETS
        or not (after is None or (isinstance(after, str) and len(after) <= 320))
    ):
        raise ApiError(400, "bad_cursor", "the cursor is malformed")
    return Position(bucket, after)


async def delete_contact(request: Request) -> Response:
    key = await require_key(request, "send")
    lists = Lists.of(request)
    found = await lists.owned(key.user_id, path_uuid(request, "list_id"))
    await lists.remove_contact(found, request.path_params["email"])
    return Response(status_code=204)


async def import_contacts(request: Request) -> Response:
    key = await require_key(request, "send")
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype not in CSV_TYPES:
        raise ApiError(415, "unsupported_media_type", "send the file as text/csv")
    lists = Lists.of(request)
    list_id = (await lists.owned(key.user_id, path_uuid(request, "list_id"))).list_id
    data = await read_capped(request, lists.settings.import_max_bytes, timeout=UPLOAD_TIMEOUT)
    # Read again: the upload may have taken minutes, and an import that ended meanwhile
    # changed the list's latest import (taking it from the stale one is a false 409) and
    # its count (the new import's base).
    job = await lists.begin_import(await lists.owned(key.user_id, list_id), data)
    answer = {"import_id": str(job.import_id), "list_id": str(job.list_id), "state": job.state}
    return JSON(answer, status_code=202)


async def get_import(request: Request) -> Response:
    key = await require_key(request, "read")
    lists = Lists.of(request)
    found = await lists.owned(key.user_id, path_uuid(request, "list_id"))
    job = await lists.store.get_import(found.list_id, path_uuid(request, "import_id"))
    if job is None:
        raise ApiError(404, "not_found", "no such import")
    return JSON(import_view(shown(job, datetime.now(UTC), lists.stale_after)))
