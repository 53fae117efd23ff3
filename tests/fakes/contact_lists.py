"""In-memory twin of :class:`services.api.contact_lists.ContactLists` (held to it by
``tests/contracts/test_contact_lists.py``): lists per user newest first, contacts per list
bucket in address order, imports per list, the lightweight transaction that makes one
import the list's latest, and a deletion (its row, then its contents). Timestamps at
Cassandra's millisecond precision."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime

from services.api.contact_lists import (
    ContactBook,
    ContactList,
    ListContact,
    bucket_of,
    contact_name,
)
from services.api.contacts_csv import Contact
from services.api.list_import import ImportJob
from shared.core.addresses import address_key
from tests.fakes.wire import LOOPBACK, Wire, round_trip


def _now() -> datetime:
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


class FakeContactLists(ContactBook):
    def __init__(self, wire: Wire = LOOPBACK) -> None:
        self.wire = wire
        """How each round trip travels (``tests.fakes.wire``)."""
        self.lists_by_user: dict[uuid.UUID, dict[uuid.UUID, ContactList]] = {}
        self.rows: dict[tuple[uuid.UUID, int], dict[str, ListContact]] = {}
        self.imports: dict[tuple[uuid.UUID, uuid.UUID], ImportJob] = {}

    @round_trip("lists.create", "write")
    async def create(
        self, user_id: uuid.UUID, name: str, list_id: uuid.UUID | None = None
    ) -> ContactList:
        made = ContactList(user_id, list_id or uuid.uuid1(), name, _now(), 0, None)
        self.lists_by_user.setdefault(user_id, {})[made.list_id] = made
        return made

    async def delete(self, user_id: uuid.UUID, list_id: uuid.UUID) -> bool:
        trip = await self.wire.trip("lists.delete", "lwt")
        gone = self.lists_by_user.get(user_id, {}).pop(list_id, None) is not None
        trip.landed()
        trip = await self.wire.trip("lists.delete_contents", "write")
        for part in [k for k in self.rows if k[0] == list_id]:
            del self.rows[part]
        for job in [k for k in self.imports if k[0] == list_id]:
            del self.imports[job]
        trip.landed()
        return gone

    @round_trip("lists.get", "read")
    async def get(self, user_id: uuid.UUID, list_id: uuid.UUID) -> ContactList | None:
        return self.lists_by_user.get(user_id, {}).get(list_id)

    @round_trip("lists.lists", "read")
    async def lists(self, user_id: uuid.UUID) -> list[ContactList]:
        mine = self.lists_by_user.get(user_id, {}).values()
        return sorted(mine, key=lambda x: (x.list_id.time, x.list_id.bytes), reverse=True)

    @round_trip("lists.set_count", "write")
    async def set_count(self, user_id: uuid.UUID, list_id: uuid.UUID, contacts: int) -> None:
        found = self.lists_by_user.get(user_id, {}).get(list_id)
        if found is not None:
            self.lists_by_user[user_id][list_id] = replace(found, contacts=contacts)

    @round_trip("lists.contacts", "read")
    async def contacts(
        self, list_id: uuid.UUID, bucket: int, after: str | None, limit: int
    ) -> list[ListContact]:
        part = self.rows.get((list_id, bucket), {})
        keys = sorted(k for k in part if after is None or k > after)
        return [part[k] for k in keys[:limit]]

    @round_trip("lists.existing", "read")
    async def existing(self, list_id: uuid.UUID, emails: Iterable[str]) -> set[str]:
        keys = {address_key(e) for e in emails}
        return {k for k in keys if k in self.rows.get((list_id, bucket_of(k)), {})}

    @round_trip("lists.put", "write")
    async def put(self, list_id: uuid.UUID, contacts: Sequence[Contact]) -> None:
        now = _now()
        for c in contacts:
            key = address_key(c.email)
            stored = ListContact(key, contact_name(c.fields), dict(c.fields), now)
            self.rows.setdefault((list_id, bucket_of(key)), {})[key] = stored

    @round_trip("lists.remove", "write")
    async def remove(self, list_id: uuid.UUID, email: str) -> bool:
        key = address_key(email)
        return self.rows.get((list_id, bucket_of(key)), {}).pop(key, None) is not None

    @round_trip("lists.count", "read")
    async def count(self, list_id: uuid.UUID) -> int:
        return sum(len(part) for (lid, _), part in self.rows.items() if lid == list_id)

    @round_trip("lists.begin_import", "lwt")
    async def begin_import(self, job: ImportJob, previous: uuid.UUID | None) -> bool:
        found = self.lists_by_user.get(job.user_id, {}).get(job.list_id)
        if found is None or found.latest_import != previous:
            return False
        self.lists_by_user[job.user_id][job.list_id] = replace(found, latest_import=job.import_id)
        self.imports[(job.list_id, job.import_id)] = job
        return True

    @round_trip("lists.save_import", "write")
    async def save_import(self, job: ImportJob) -> None:
        self.imports[(job.list_id, job.import_id)] = job

    @round_trip("lists.get_import", "read")
    async def get_import(self, list_id: uuid.UUID, import_id: uuid.UUID) -> ImportJob | None:
        return self.imports.get((list_id, import_id))
