"""Each user's contact lists, their contacts and their CSV imports: the one writer of
``contact_lists``, ``list_contacts`` and ``list_imports`` (deploy/cql/0025_lists.cql).

A list's contacts live in :data:`BUCKETS` partitions ``(list_id, bucket)``, the bucket a hash
of the address (:func:`bucket_of`): an address has one place, so an import finds the
contacts already in the list by key, and a list is read bucket by bucket, each in address
order (:func:`read_page` for the API's pages; a campaign can read buckets as its slices).

Contacts are keyed by their address in lower case (:func:`shared.core.addresses.address_key`),
as suppressions are. The list's ``contacts`` count is what its writer last set: the import
sets it as it goes and from an exact recount (:meth:`ContactLists.count`) when it ends; a
removed contact takes one off.

A list's unsubscribes are the suppressions scoped by its id (:func:`list_scope`), not its
name: two lists may share a name.

Only one import runs per list: :meth:`ContactLists.begin_import` takes the list's
``latest_import`` by a lightweight transaction from the one the caller saw. Deleting a list
deletes its row by a lightweight transaction too, then its contacts and imports.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Protocol

import orjson
from cassandra.query import BoundStatement

from services.api.contacts_csv import Contact
from services.api.list_import import ImportJob, Problem, Progress
from shared.core.addresses import address_key
from shared.infra.db import Database, Row, slices, utc

#: Partitions per list: a list of a million contacts is about 16,000 rows per partition.
BUCKETS: Final = 64
#: Buckets read at once when paging a list past a bucket's end (most of a small list's
#: are empty).
READ_AHEAD: Final = 8
#: Addresses looked up per query (within one bucket).
LOOKUP_CHUNK: Final = 100
#: Contacts per write batch (one partition each), and write batches in flight.
WRITE_SLICE: Final = 20
WRITE_WINDOW: Final = 16
#: Approximate bytes of contacts per write batch: a slice of wide contacts (50 fields of
#: 1,000 characters each) is split, so no batch nears the database's batch size limit.
WRITE_BYTES: Final = 256 * 1024
#: Bytes counted per row and per field on top of their text (keys, timestamps, lengths).
_ROW_OVERHEAD: Final = 64
_FIELD_OVERHEAD: Final = 16


def bucket_of(email: str) -> int:
    """The bucket of an address (stable across processes and releases)."""
    digest = hashlib.blake2b(address_key(email).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") % BUCKETS


def contact_size(contact: Contact) -> int:
    """About how many bytes ``contact``'s row takes in a write (its text, UTF-8, plus
    overheads)."""
    text = sum(len(k.encode()) + len(v.encode()) for k, v in contact.fields.items())
    fields = _FIELD_OVERHEAD * len(contact.fields)
    return _ROW_OVERHEAD + len(contact.email.encode()) + text + fields


def write_slices(
    sizes: Sequence[int], *, count: int = WRITE_SLICE, limit: int = WRITE_BYTES
) -> list[range]:
    """``sizes`` cut, in order, into runs of at most ``count`` items of at most ``limit``
    bytes together (an item larger than ``limit`` alone): :func:`shared.infra.db.slices`."""
    return slices(sizes, limit, count=count)


def list_scope(list_id: uuid.UUID) -> str:
    """The suppression scope (``shared.audience.suppressions``) of a list's unsubscribes: its id, as
    mail sent to the list names it (``list``), so its one-click unsubscribes land there."""
    return str(list_id)


def contact_name(fields: dict[str, str]) -> str | None:
    """The display name among a contact's fields, if any."""
    return fields.get("name") or fields.get("full_name") or None


@dataclass(frozen=True, slots=True)
class ContactList:
    user_id: uuid.UUID
    list_id: uuid.UUID
    name: str
    created_at: datetime
    contacts: int
    latest_import: uuid.UUID | None


@dataclass(frozen=True, slots=True)
class ListContact:
    email: str
    name: str | None
    fields: dict[str, str]
    added_at: datetime


@dataclass(frozen=True, slots=True)
class Position:
    """Where a reading of a list stands: the bucket, and the last address read in it."""

    bucket: int = 0
    after: str | None = None


class ContactReader(Protocol):
    """What :func:`read_page` needs: :class:`ContactLists` or its twin."""

    async def contacts(
        self, list_id: uuid.UUID, bucket: int, after: str | None, limit: int
    ) -> list[ListContact]: ...


_LIST_COLUMNS = "user_id, list_id, name, created_at, contacts, latest_import"
_IMPORT_COLUMNS = (
    "list_id, import_id, user_id, state, reason, rows_read, added, updated, invalid, "
    "duplicates, suppressed, unsubscribed, over_limit, problems, created_at, heartbeat, "
    "finished_at"
)


class ContactBook(Protocol):
    """What callers use of :class:`ContactLists` (the store, or its in-memory twin)."""

    async def create(
        self, user_id: uuid.UUID, name: str, list_id: uuid.UUID | None = None
    ) -> ContactList: ...

    async def get(self, user_id: uuid.UUID, list_id: uuid.UUID) -> ContactList | None: ...

    async def lists(self, user_id: uuid.UUID) -> list[ContactList]: ...

    async def delete(self, user_id: uuid.UUID, list_id: uuid.UUID) -> bool: ...

    async def set_count(self, user_id: uuid.UUID, list_id: uuid.UUID, contacts: int) -> None: ...

    async def contacts(
        self, list_id: uuid.UUID, bucket: int, after: str | None, limit: int
    ) -> list[ListContact]: ...

    async def existing(self, list_id: uuid.UUID, emails: Iterable[str]) -> set[str]: ...

    async def put(self, list_id: uuid.UUID, contacts: Sequence[Contact]) -> None: ...

    async def remove(self, list_id: uuid.UUID, email: str) -> bool: ...

    async def count(self, list_id: uuid.UUID) -> int: ...

    async def begin_import(self, job: ImportJob, previous: uuid.UUID | None) -> bool: ...

    async def save_import(self, job: ImportJob) -> None: ...

    async def get_import(self, list_id: uuid.UUID, import_id: uuid.UUID) -> ImportJob | None: ...


class ContactLists:
    def __init__(self, db: Database) -> None:
        self.db = db

    # ------------------------------------------------------------------ lists

    async def create(
        self, user_id: uuid.UUID, name: str, list_id: uuid.UUID | None = None
    ) -> ContactList:
        """A new empty list (``list_id``: the id its place under the cap was claimed for).

        Written by a lightweight transaction, as ``delete`` and ``begin_import`` write the
        row: a plain write carries the client's microsecond timestamp, a transaction the
        server's (milliseconds), so a deletion in the same millisecond as a plain insert
        would leave the list standing (seen in CI). Transactions on one row are ordered by
        their ballots. A retry after a timeout finds the row made: that is the list."""
        made = ContactList(user_id, list_id or uuid.uuid1(), name, _now(), 0, None)
        await self.db.one(
            "INSERT INTO contact_lists (user_id, list_id, name, created_at, contacts) "
            "VALUES (?, ?, ?, ?, 0) IF NOT EXISTS",
            (user_id, made.list_id, name, made.created_at),
        )
        return made

    async def get(self, user_id: uuid.UUID, list_id: uuid.UUID) -> ContactList | None:
        row = await self.db.one(
            f"SELECT {_LIST_COLUMNS} FROM contact_lists WHERE user_id = ? AND list_id = ?",  # noqa: S608 - fixed names
            (user_id, list_id),
        )
        return _list(row) if row and _kept(row) else None

    async def lists(self, user_id: uuid.UUID) -> list[ContactList]:
        """Newest first."""
        rows = await self.db.all_pages(
            f"SELECT {_LIST_COLUMNS} FROM contact_lists WHERE user_id = ?",  # noqa: S608 - fixed names
            (user_id,),
        )
        return [_list(r) for r in rows if _kept(r)]

    async def delete(self, user_id: uuid.UUID, list_id: uuid.UUID) -> bool:
        """Delete the list, then its contacts and imports; False when there was no such list
        (its contents are deleted all the same: a deletion that died part-way is finished).
        The list's row goes by a lightweight transaction, as ``begin_import`` takes it: an
        import can no longer begin, and no clock skew lets a later transaction's cell
        outlive the deletion."""
        gone = await self.db.one(
            "DELETE FROM contact_lists WHERE user_id = ? AND list_id = ? IF EXISTS",
            (user_id, list_id),
        )
        window = asyncio.Semaphore(WRITE_WINDOW)

        async def bucket(number: int) -> None:
            async with window:
                await self.db.execute(
                    "DELETE FROM list_contacts WHERE list_id = ? AND bucket = ?",
                    (list_id, number),
                    idempotent=True,
                )

        await asyncio.gather(*(bucket(b) for b in range(BUCKETS)))
        await self.db.execute(
            "DELETE FROM list_imports WHERE list_id = ?", (list_id,), idempotent=True
        )
        return bool(gone and gone["[applied]"])

    async def set_count(self, user_id: uuid.UUID, list_id: uuid.UUID, contacts: int) -> None:
        await self.db.execute(
            "UPDATE contact_lists SET contacts = ? WHERE user_id = ? AND list_id = ?",
            (contacts, user_id, list_id),
            idempotent=True,
        )

    # ------------------------------------------------------------------ contacts

    async def contacts(
        self, list_id: uuid.UUID, bucket: int, after: str | None, limit: int
    ) -> list[ListContact]:
        """Up to ``limit`` contacts of one bucket, in address order, after ``after``."""
        query = (
            "SELECT email, name, fields, added_at FROM list_contacts "
            "WHERE list_id = ? AND bucket = ?"
        )
        params: tuple[Any, ...] = (list_id, bucket)
        if after is not None:
            query += " AND email > ?"
            params += (after,)
        rows = await self.db.rows(query + " LIMIT ?", (*params, limit))
        return [_contact(r) for r in rows]

    async def existing(self, list_id: uuid.UUID, emails: Iterable[str]) -> set[str]:
        """The subset of ``emails`` (as :func:`address_key`) in the list."""
        by_bucket: dict[int, list[str]] = {}
        for key in sorted({address_key(e) for e in emails}):
            by_bucket.setdefault(bucket_of(key), []).append(key)
        parts = [
            (bucket, keys[i : i + LOOKUP_CHUNK])
            for bucket, keys in by_bucket.items()
            for i in range(0, len(keys), LOOKUP_CHUNK)
        ]
        window = asyncio.Semaphore(WRITE_WINDOW)

        async def one(bucket: int, keys: list[str]) -> list[Row]:
            async with window:
                return await self.db.rows(
                    "SELECT email FROM list_contacts WHERE list_id = ? AND bucket = ? "
                    "AND email IN ?",
                    (list_id, bucket, keys),
                )

        found = await asyncio.gather(*(one(b, keys) for b, keys in parts))
        return {r["email"] for rows in found for r in rows}

    async def put(self, list_id: uuid.UUID, contacts: Sequence[Contact]) -> None:
        """Add or replace ``contacts`` (their name and fields), one batch per partition
        slice (:func:`write_slices`: by count and by bytes), a window of them at once."""
        insert = await self.db.prepare(
            "INSERT INTO list_contacts (list_id, bucket, email, name, fields, added_at) "
            "VALUES (?, ?, ?, ?, ?, ?)"
        )
        now = _now()
        by_bucket: dict[int, list[Contact]] = {}
        for c in contacts:
            by_bucket.setdefault(bucket_of(c.email), []).append(c)
        window = asyncio.Semaphore(WRITE_WINDOW)

        def bound(bucket: int, c: Contact) -> BoundStatement:
            key = address_key(c.email)
            return insert.bind((list_id, bucket, key, contact_name(c.fields), c.fields, now))

        async def one(bucket: int, part: Sequence[Contact]) -> None:
            async with window:
                await self.db.batch([bound(bucket, c) for c in part])

        await asyncio.gather(
            *(
                one(bucket, [mine[i] for i in run])
                for bucket, mine in by_bucket.items()
                for run in write_slices([contact_size(c) for c in mine])
            )
        )

    async def remove(self, list_id: uuid.UUID, email: str) -> bool:
        """Take an address off the list; False when it was not on it."""
        key = address_key(email)
        params = (list_id, bucket_of(key), key)
        where = "WHERE list_id = ? AND bucket = ? AND email = ?"
        if await self.db.one(f"SELECT email FROM list_contacts {where}", params) is None:  # noqa: S608 - fixed
            return False
        await self.db.execute(f"DELETE FROM list_contacts {where}", params, idempotent=True)  # noqa: S608 - fixed
        return True

    async def count(self, list_id: uuid.UUID) -> int:
        """The contacts in the list, counted (a partition at a time)."""
        window = asyncio.Semaphore(READ_AHEAD)

        async def one(bucket: int) -> int:
            async with window:
                row = await self.db.one(
                    "SELECT COUNT(*) AS n FROM list_contacts WHERE list_id = ? AND bucket = ?",
                    (list_id, bucket),
                    timeout=60.0,
                )
            return int(row["n"]) if row else 0

        return sum(await asyncio.gather(*(one(b) for b in range(BUCKETS))))

    # ------------------------------------------------------------------ imports

    async def begin_import(self, job: ImportJob, previous: uuid.UUID | None) -> bool:
        """Make ``job`` the list's latest import, if the latest is still ``previous`` (two
        requests at once: one wins); False otherwise, or when the list does not exist (the
        condition on its name: a missing row has none). The job is stored when it won."""
        taken = await self.db.one(
            "UPDATE contact_lists SET latest_import = ? WHERE user_id = ? AND list_id = ? "
            "IF name != null AND latest_import = ?",
            (job.import_id, job.user_id, job.list_id, previous),
        )
        if taken is None or not taken["[applied]"]:
            return False
        await self.save_import(job)
        return True

    async def save_import(self, job: ImportJob) -> None:
        p = job.progress
        problems = orjson.dumps([[x.row, x.email, x.kind, x.reason] for x in job.problems]).decode()
        await self.db.execute(
            f"INSERT INTO list_imports ({_IMPORT_COLUMNS}) "  # noqa: S608 - fixed names
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                job.list_id,
                job.import_id,
                job.user_id,
                job.state,
                job.reason,
                p.rows_read,
                p.added,
                p.updated,
                p.invalid,
                p.duplicates,
                p.suppressed,
                p.unsubscribed,
                p.over_limit,
                problems,
                job.created_at,
                job.heartbeat,
                job.finished_at,
            ),
            idempotent=True,
        )

    async def get_import(self, list_id: uuid.UUID, import_id: uuid.UUID) -> ImportJob | None:
        row = await self.db.one(
            f"SELECT {_IMPORT_COLUMNS} FROM list_imports WHERE list_id = ? AND import_id = ?",  # noqa: S608 - fixed names
            (list_id, import_id),
        )
        return _import(row) if row else None


async def read_page(
    store: ContactReader, list_id: uuid.UUID, at: Position, limit: int
) -> tuple[list[ListContact], Position | None]:
    """Up to ``limit`` contacts from ``at`` on, and where the next page starts (None at the
    end). The bucket at hand is read alone (a large list's fill the page); once it runs
    short, the next :data:`READ_AHEAD` are read at once (a small list's are mostly empty)."""
    out: list[ListContact] = []
    bucket, after, width = at.bucket, at.after, 1
    while bucket < BUCKETS:
        wanted = limit - len(out)
        ahead = range(bucket, min(bucket + width, BUCKETS))
        found = await asyncio.gather(
            *(store.contacts(list_id, b, after if b == bucket else None, wanted) for b in ahead)
        )
        for b, part in zip(ahead, found, strict=True):
            out.extend(part[: limit - len(out)])
            if len(out) >= limit:
                return out, Position(b, out[-1].email)
        bucket, after, width = ahead[-1] + 1, None, READ_AHEAD
    return out, None


def _now() -> datetime:
    """Now, at Cassandra's precision (milliseconds)."""
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


def _kept(row: Row) -> bool:
    """Whether a row is a list: a deleted list's row brought back by a late update of its
    count (an import or a removal racing the deletion) has no name, and is none."""
    return row["name"] is not None


def _list(row: Row) -> ContactList:
    return ContactList(
        user_id=row["user_id"],
        list_id=row["list_id"],
        name=row["name"],
        created_at=utc(row["created_at"]) or _now(),
        contacts=row["contacts"] or 0,
        latest_import=row["latest_import"],
    )


def _contact(row: Row) -> ListContact:
    return ListContact(
        email=row["email"],
        name=row["name"],
        fields=dict(row["fields"] or {}),
        added_at=utc(row["added_at"]) or _now(),
    )


def _import(row: Row) -> ImportJob:
    problems = tuple(Problem(*p) for p in orjson.loads(row["problems"] or "[]"))
    progress = Progress(
        **{
            name: row[name] or 0
            for name in (
                "rows_read",
                "added",
                "updated",
                "invalid",
                "duplicates",
                "suppressed",
                "unsubscribed",
                "over_limit",
            )
        }
    )
    return ImportJob(
        list_id=row["list_id"],
        import_id=row["import_id"],
        user_id=row["user_id"],
        state=row["state"],
        created_at=utc(row["created_at"]) or _now(),
        heartbeat=utc(row["heartbeat"]) or _now(),
        progress=progress,
        problems=problems,
        reason=row["reason"],
        finished_at=utc(row["finished_at"]),
    )
