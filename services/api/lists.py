"""``/v1/lists``: contact lists: create, list, read (with counts and the latest import), page
through contacts, remove one, delete a list, import a CSV file (in the background, 202) and
follow the import's progress and report.

:class:`Lists` holds the use cases (the dashboard shares them); the handlers parse, call
and answer. Another user's list is a 404, as a missing one is. One import runs per list at a
time (409 while one does); an import whose process died reads as failed once its heartbeat
is stale, and another may then begin.

A user's lists and imports in progress are capped (``services.api.capping``): a list's
place is claimed before it is made and given back once it is deleted; an import's is claimed
before its upload and given back when it ends. An upload is spooled to a temporary file as it
arrives, counted (413 past the contacts one import may carry), then read back a slice at a
time: an import holds about a slice of the file in memory, whatever its size.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import IO, Any

from starlette.requests import Request
from starlette.responses import Response

from services.api import contacts_csv, schema
from services.api.auth import require_key
from services.api.capping import Caps, Census
from services.api.contact_lists import (
    BUCKETS,
    ContactBook,
    ContactList,
    ContactLists,
    ListContact,
    Position,
    read_page,
)
from services.api.importing import Importer
from services.api.list_import import ImportJob, live, shown
from services.api.operations import CSV_BODY, CURSOR, LIST_ID, Param, operation
from services.api.queries import decode_cursor, encode_cursor, page_limit, path_uuid
from services.api.schema import ListIn, checked
from shared.audience.suppressions import Suppressions
from shared.infra.background import Background
from shared.infra.config import ListSettings
from shared.infra.gil import CpuLane
from shared.infra.http import Answer, ApiError, read_json, spool_capped

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

    store: ContactBook
    suppressions: Suppressions
    background: Background
    settings: ListSettings
    caps: Caps
    cpu: CpuLane

    @classmethod
    def of(cls, request: Request) -> Lists:
        state = request.app.state
        return cls(
            ContactLists(state.resources.db),
            state.suppressions,
            state.background,
            state.settings.lists,
            state.caps,
            state.cpu,
        )

    async def create(self, user_id: uuid.UUID, name: str) -> ContactList:
        """A new list, if the user has room for one (409 ``too_many_lists``)."""
        list_id = uuid.uuid1()
        await self.caps.claim(user_id, "lists", str(list_id), self._lists_of(user_id))
        return await self.store.create(user_id, name, list_id)

    async def delete(self, found: ContactList) -> None:
        """Delete ``found`` with its contacts and imports (409 while an import of it runs)
        and give its place back."""
        previous = await self.latest(found)
        if previous is not None and live(previous, datetime.now(UTC), self.stale_after):
            raise _busy()
        await self.store.delete(found.user_id, found.list_id)
        await self.caps.release_quietly(found.user_id, "lists", str(found.list_id))

    def _lists_of(self, user_id: uuid.UUID) -> Census:
        async def census(_: Collection[str]) -> set[str]:
            return {str(x.list_id) for x in await self.store.lists(user_id)}

        return census

    def _running(self, user_id: uuid.UUID) -> Census:
        """Which of the holders (``<list id>/<import id>``) are imports still running."""

        async def census(holders: Collection[str]) -> set[str]:
            now = datetime.now(UTC)

            async def one(holder: str) -> str | None:
                list_id, _, import_id = holder.partition("/")
                try:
                    job = await self.store.get_import(uuid.UUID(list_id), uuid.UUID(import_id))
                except ValueError:
                    return None
                return holder if job is not None and live(job, now, self.stale_after) else None

            found = await asyncio.gather(*(one(h) for h in holders))
            return {h for h in found if h is not None}

        return census

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

    async def claim_import(self, found: ContactList) -> uuid.UUID:
        """An id for a new import of ``found``, its place among the user's imports in
        progress claimed (409 ``too_many_imports``): it is kept through the upload."""
        import_id = uuid.uuid1()
        await self.caps.claim(
            found.user_id,
            "imports",
            _holder(found.list_id, import_id),
            self._running(found.user_id),
            extra_grace=UPLOAD_TIMEOUT,
        )
        return import_id

    async def release_import(self, found: ContactList, import_id: uuid.UUID) -> None:
        await self.caps.release_quietly(found.user_id, "imports", _holder(found.list_id, import_id))

    async def begin_import(
        self, found: ContactList, source: IO[bytes], import_id: uuid.UUID
    ) -> tuple[ImportJob, int]:
        """Check the file's layout and count its rows (422 when it cannot be imported at
        all, 413 past the contacts one import may carry), take the list's import (409 while
        another runs) and start it in the background, which then owns ``source`` and the
        import's place (it closes the one and gives back the other when it ends). Returns
        the import and the rows it will read."""
        limit = self.caps.settings.contacts_per_import
        try:
            rows = await self.cpu.run(contacts_csv.count, source, limit=limit)
            await asyncio.to_thread(source.seek, 0)
        except contacts_csv.CsvError as exc:
            raise ApiError(
                422, "invalid_csv", f"the file cannot be imported: {exc}", fields={"body": str(exc)}
            ) from None
        if rows > limit:
            raise ApiError(
                413,
                "too_many_contacts",
                f"the file has more than {limit:,} contacts, the most one import may carry: "
                "split it",
                limit=("contacts_per_import", limit),
            )
        now = datetime.now(UTC)
        previous = await self.latest(found)
        if previous is not None and live(previous, now, self.stale_after):
            raise _busy()
        job = ImportJob(found.list_id, import_id, found.user_id, "queued", now, now)
        if not await self.store.begin_import(job, found.latest_import):
            raise _busy()
        self.background.spawn(self._run(job, source, found.contacts))
        return job, rows

    async def _run(self, job: ImportJob, source: IO[bytes], base: int) -> None:
        try:
            importer = Importer(self.store, self.suppressions, self.settings, self.cpu)
            await importer.run(job, source, base=base)
        finally:
            await asyncio.to_thread(source.close)
            await self.caps.release_quietly(
                job.user_id, "imports", _holder(job.list_id, job.import_id)
            )

    async def upload(
        self, request: Request, user_id: uuid.UUID, list_id: uuid.UUID
    ) -> tuple[ImportJob, int]:
        """Import the request's ``text/csv`` body into the user's list (415 for another
        type): the upload is spooled under the import's claimed place, then begun (see
        :meth:`begin_import`); the place is given back if it cannot begin."""
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype not in CSV_TYPES:
            raise ApiError(415, "unsupported_media_type", "send the file as text/csv")
        found = await self.owned(user_id, list_id)
        import_id = await self.claim_import(found)
        source: IO[bytes] | None = None
        try:
            source = await spool_capped(
                request, self.settings.import_max_bytes, timeout=UPLOAD_TIMEOUT
            )
            # Read again: the upload may have taken minutes, and an import that ended
            # meanwhile changed the list's latest import (taking it from the stale one is a
            # false 409) and its count (the new import's base).
            return await self.begin_import(await self.owned(user_id, list_id), source, import_id)
        except BaseException:
            if source is not None:
                await asyncio.to_thread(source.close)
            await self.release_import(found, import_id)
            raise

    async def import_of(self, found: ContactList, import_id: uuid.UUID) -> ImportJob:
        """One import of ``found`` as it is to be shown (a stale one as failed), or 404."""
        job = await self.store.get_import(found.list_id, import_id)
        if job is None:
            raise ApiError(404, "not_found", "no such import")
        return shown(job, datetime.now(UTC), self.stale_after)

    async def contacts(
        self, found: ContactList, cursor: str | None, limit: int
    ) -> tuple[list[ListContact], str | None]:
        """A page of the list's contacts from ``cursor`` (400 for a malformed one), and the
        next page's cursor (None after the last)."""
        page, following = await read_page(self.store, found.list_id, position_of(cursor), limit)
        after = (
            encode_cursor({"bucket": following.bucket, "after": following.after})
            if following is not None
            else None
        )
        return page, after

    async def remove_contact(self, found: ContactList, email: str) -> None:
        if not email.strip() or not await self.store.remove(found.list_id, email.strip()):
            raise ApiError(404, "not_found", "that address is not in the list")
        # The next import's recount corrects this if two removals raced.
        await self.store.set_count(found.user_id, found.list_id, max(found.contacts - 1, 0))


def list_name(body: object) -> str:
    """The name of a new list from a ``POST /v1/lists`` body (422 when it is not one)."""
    name = checked(ListIn, body).name.strip()
    if not name:
        raise ApiError(422, "invalid_fields", "bad name", fields={"name": "must not be blank"})
    return name


def _busy() -> ApiError:
    return ApiError(409, "import_running", "an import of this list is in progress; wait for it")


def _holder(list_id: uuid.UUID, import_id: uuid.UUID) -> str:
    """An import's holder among its user's imports in progress."""
    return f"{list_id}/{import_id}"


# ------------------------------------------------------------------------------ handlers


@operation(
    "create_list",
    "Create a contact list",
    schema.ContactListView,
    status=201,
    body=schema.ListIn,
    errors=(400, 409, 413, 415, 422),
    description="409 `too_many_lists` when you have as many lists as you may "
    "(`error.limit`); deleting one frees its place.",
)
async def create_list(request: Request) -> Response:
    key = await require_key(request, "send")
    _, body = await read_json(request, SMALL_BODY)
    made = await Lists.of(request).create(key.user_id, list_name(body))
    return Answer(schema.ContactListView.model_validate(list_view(made, None)), status_code=201)


@operation(
    "delete_list",
    "Delete a contact list with its contacts and imports",
    None,
    status=204,
    params=(LIST_ID,),
    errors=(404, 409),
    description="409 `import_running` while an import of it runs; `in_use` while a "
    "campaign that has not ended (a draft included) sends it.",
)
async def delete_list(request: Request) -> Response:
    key = await require_key(request, "send")
    lists = Lists.of(request)
    found = await lists.owned(key.user_id, path_uuid(request, "list_id"))
    await request.app.state.campaigns.refuse_if_used(key.user_id, list_id=found.list_id)
    await lists.delete(found)
    return Response(status_code=204)


@operation(
    "list_lists",
    "Your contact lists, newest first, with counts and each one's latest import",
    schema.ContactListList,
)
async def list_lists(request: Request) -> Response:
    key = await require_key(request, "read")
    found = await Lists.of(request).overview(key.user_id)
    return Answer(
        schema.ContactListList.model_validate(
            {"data": [list_view(x, latest) for x, latest in found]}
        )
    )


@operation(
    "get_list",
    "A contact list with its count and latest import",
    schema.ContactListView,
    params=(LIST_ID,),
    errors=(404,),
)
async def get_list(request: Request) -> Response:
    key = await require_key(request, "read")
    lists = Lists.of(request)
    found = await lists.owned(key.user_id, path_uuid(request, "list_id"))
    return Answer(
        schema.ContactListView.model_validate(list_view(found, await lists.latest(found)))
    )


@operation(
    "list_list_contacts",
    "A list's contacts, a page at a time",
    schema.ListContactsPage,
    params=(LIST_ID, Param("limit", "query", "1-1000, default 100.", "integer"), CURSOR),
    errors=(400, 404, 422),
    description="Pages follow the list's storage order (not alphabetical overall); "
    "a page may be short before the last one.",
)
async def list_contacts(request: Request) -> Response:
    key = await require_key(request, "read")
    limit = page_limit(request, default=100, maximum=1000)
    lists = Lists.of(request)
    found = await lists.owned(key.user_id, path_uuid(request, "list_id"))
    page, cursor = await lists.contacts(found, request.query_params.get("cursor"), limit)
    # Up to 1,000 entries: built trusted (validated under tests).
    data = [schema.trusted(schema.ListContactView, contact_view(c)) for c in page]
    return Answer(schema.ListContactsPage(data=data, next_cursor=cursor))


def position_of(cursor: str | None) -> Position:
    """Where a page of contacts starts, from its cursor (400 for a malformed one)."""
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


@operation(
    "delete_list_contact",
    "Remove a contact from a list",
    None,
    status=204,
    params=(LIST_ID, Param("email", "path", "The contact's address.", required=True)),
    errors=(404,),
)
async def delete_contact(request: Request) -> Response:
    key = await require_key(request, "send")
    lists = Lists.of(request)
    found = await lists.owned(key.user_id, path_uuid(request, "list_id"))
    await lists.remove_contact(found, request.path_params["email"])
    return Response(status_code=204)


@operation(
    "import_list_contacts",
    "Import a CSV file of contacts into a list (in the background)",
    schema.ImportAccepted,
    status=202,
    params=(LIST_ID,),
    errors=(404, 409, 413, 415, 422),
    description="The file is checked (UTF-8, an address column), then imported in "
    "slices while you follow the import. Contacts already in the list get the file's "
    "fields; addresses suppressed for all of your mail, or unsubscribed from this list "
    "(`/v1/suppressions?list=<list id>`), are not added; every such row, invalid rows "
    "and duplicates are reported with their row. One import per list at a time: 409 "
    "while one runs; `too_many_imports` when as many of your imports as you may run at "
    "once are in progress (their uploads included). 413 `too_many_contacts` for a file "
    "of more rows than one import may carry. The upload is spooled to disk as it "
    "arrives and read back a slice at a time.",
    extra=CSV_BODY,
)
async def import_contacts(request: Request) -> Response:
    key = await require_key(request, "send")
    job, _ = await Lists.of(request).upload(request, key.user_id, path_uuid(request, "list_id"))
    answer = {"import_id": str(job.import_id), "list_id": str(job.list_id), "state": job.state}
    return Answer(schema.ImportAccepted.model_validate(answer), status_code=202)


@operation(
    "get_list_import",
    "An import's progress and report",
    schema.ImportView,
    params=(LIST_ID, Param("import_id", "path", "The import's id.", required=True)),
    errors=(404,),
)
async def get_import(request: Request) -> Response:
    key = await require_key(request, "read")
    lists = Lists.of(request)
    found = await lists.owned(key.user_id, path_uuid(request, "list_id"))
    job = await lists.import_of(found, path_uuid(request, "import_id"))
    return Answer(schema.ImportView.model_validate(import_view(job)))
