"""Twins of the stores of :mod:`services.api`: dashboard sessions and ``Idempotency-Key`` claims
(in :class:`tests.fakes.cassandra.FakeCassandra`, with the semantics :mod:`tests.fakes.accounts`
describes),
recent mail for the cooldown, caps and contact lists.

In-memory twin of :class:`services.api.cap_store.CapStore` (held to it by
``tests/contracts/test_cap_store.py``): one ledger per user and name, read whole, rewritten
whole only while its version is the one the writer read (a missing ledger's is None), and
dropped likewise; claim times kept at Cassandra's millisecond precision. Each operation is one
round trip over its wire (``tests.fakes.wire``), so a simulator can fail it before or after
it applies.

In-memory twin of :class:`services.api.contact_lists.ContactLists` (held to it by
``tests/contracts/test_contact_lists.py``): lists per user newest first, contacts per list
bucket in address order, imports per list, the lightweight transaction that makes one
import the list's latest, and a deletion (its row, then its contents). Timestamps at
Cassandra's millisecond precision.

Recent mail (:class:`FakeRecentMail`) lives in the tables of
:class:`tests.fakes.cassandra.FakeCassandra`, each row for its cooldown (its TTL);
``tests/contracts/test_acceptance_stores.py`` holds it to the real store.
"""

from __future__ import annotations

import hmac
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from services.api import session_store as sessions
from services.api.capping import CapLedger
from services.api.caps import Holds
from services.api.contact_lists import (
    ContactBook,
    ContactList,
    ListContact,
    bucket_of,
    contact_name,
)
from services.api.contacts_csv import Contact
from services.api.cooldown import LOOKUP_CHUNK, RecentSends, cooling
from services.api.idempotency import Claimed, Existing, IdempotencyKeys
from services.api.list_import import ImportJob
from services.api.session_store import Session, Sessions
from shared.core.addresses import address_key
from tests.fakes.cassandra import FakeCassandra, Row, as_stored, interleave, millis, ms
from tests.fakes.wire import LOOPBACK, Wire, round_trip

#: ``idempotency_keys``' ``default_time_to_live`` (deploy/cql/0001_core.cql).
IDEMPOTENCY_TTL = 86_400


#: The columns a claim writes (``response`` is written only by ``complete``).
_CLAIM_COLUMNS = ("body_hash", "batch_id", "owner", "lease_until", "created_at")


#: Every column of ``idempotency_keys`` besides its key.
_IDEMPOTENCY_COLUMNS = (*_CLAIM_COLUMNS, "response")


class FakeSessionStore(Sessions):
    """Twin of :class:`services.api.session_store.SessionStore`; every row carries its TTL."""

    def __init__(
        self,
        tables: FakeCassandra | None = None,
        *,
        idle_ttl: int = sessions.DEFAULT_IDLE_TTL,
        max_age: int = sessions.DEFAULT_MAX_AGE,
    ) -> None:
        self.tables = tables or FakeCassandra()
        self.idle_ttl = idle_ttl
        self.max_age = max_age

    async def create(self, user_id: uuid.UUID, *, replaces: str | None = None) -> tuple[str, str]:
        if replaces:
            await self.delete(replaces)
        session_id, csrf = sessions.new_token(), sessions.new_token()
        now = self.tables.now()
        expires = sessions.expiry(now, now, idle_ttl=self.idle_ttl, max_age=self.max_age)
        await interleave()
        row = self.tables.sessions[sessions.session_hash(session_id)] = Row()
        row.write(_session_cells(user_id, csrf, now, now, expires), self._ttl(expires), insert=True)
        return session_id, csrf

    async def get(self, session_id: str) -> Session | None:
        if not session_id or len(session_id) > sessions.MAX_ID_LENGTH:
            return None
        key = sessions.session_hash(session_id)
        await interleave()
        row = self._live(key)
        if row is None or row.get("user_id") is None:
            return None
        now = self.tables.now()
        session = Session(
            user_id=row["user_id"],
            csrf_token=str(row["csrf_token"]),
            created_at=row["created_at"].replace(tzinfo=UTC),
            refreshed_at=row["refreshed_at"].replace(tzinfo=UTC),
            expires_at=row["expires_at"].replace(tzinfo=UTC),
        )
        if session.expires_at <= now:
            return None
        if now - session.refreshed_at >= sessions.refresh_interval(self.idle_ttl):
            session = await self._refresh(key, session, now)
        return session

    async def delete(self, session_id: str) -> None:
        if session_id and len(session_id) <= sessions.MAX_ID_LENGTH:
            await interleave()
            self.tables.sessions.pop(sessions.session_hash(session_id), None)

    async def _refresh(self, key: str, session: Session, now: datetime) -> Session:
        expires = sessions.expiry(
            session.created_at, now, idle_ttl=self.idle_ttl, max_age=self.max_age
        )
        if expires <= session.expires_at:
            return session
        await interleave()
        if self._live(key) is not None:  # IF EXISTS: never resurrect a deleted session
            cells = _session_cells(
                session.user_id, session.csrf_token, session.created_at, now, expires
            )
            self.tables.sessions[key].write(cells, self._ttl(expires), insert=False)
        return Session(session.user_id, session.csrf_token, session.created_at, now, expires)

    def _ttl(self, expires: datetime) -> datetime:
        now = self.tables.now()
        return now + timedelta(seconds=sessions.ttl_seconds(expires, now))

    def _live(self, key: str) -> dict[str, Any] | None:
        row = self.tables.sessions.get(key)
        return row.read(self.tables.now()) if row else None


def _session_cells(
    user_id: uuid.UUID, csrf: str, created: datetime, refreshed: datetime, expires: datetime
) -> dict[str, Any]:
    return {
        "user_id": user_id,
        "csrf_token": csrf,
        "created_at": as_stored(created),
        "refreshed_at": as_stored(refreshed),
        "expires_at": as_stored(expires),
    }


class FakeIdempotencyStore(IdempotencyKeys):
    """Twin of :class:`services.api.idempotency.IdempotencyStore`: lightweight transactions on
    ``idempotency_keys``, whose every write expires after the table's default TTL."""

    def __init__(self, tables: FakeCassandra | None = None, *, lease: float = 30.0) -> None:
        self.tables = tables or FakeCassandra()
        self.lease = timedelta(seconds=lease)

    async def claim(
        self, user_id: uuid.UUID, key: str, body_hash: bytes, batch_id: uuid.UUID, owner: uuid.UUID
    ) -> Claimed | Existing:
        trip = await self.tables.wire.trip("idempotency.claim", "lwt")
        claimed = self._claim(user_id, key, body_hash, batch_id, owner)
        trip.landed()
        return claimed

    def _claim(
        self, user_id: uuid.UUID, key: str, body_hash: bytes, batch_id: uuid.UUID, owner: uuid.UUID
    ) -> Claimed | Existing:
        now = self.tables.now()
        row = self._live(user_id, key)
        if row is not None and (row.get("body_hash") is None or row.get("batch_id") is None):
            # What is left once the claim's cells expired claims nothing: cleared, claimed anew.
            del self.tables.idempotency_keys[(user_id, key)]
            row = None
        if row is None:  # IF NOT EXISTS
            values = {
                "body_hash": body_hash,
                "batch_id": batch_id,
                "owner": owner,
                "lease_until": as_stored(now + self.lease),
                "created_at": as_stored(now),
            }
            self._write(user_id, key, values, insert=True)
            return Claimed(batch_id)
        lease_until = row.get("lease_until")
        return Existing(
            same_body=hmac.compare_digest(row.get("body_hash") or b"", body_hash),
            batch_id=row["batch_id"],
            response=row.get("response"),
            owner=row.get("owner"),
            lease_until=lease_until.replace(tzinfo=UTC) if lease_until else None,
        )

    async def take_over(
        self, user_id: uuid.UUID, key: str, stale: Existing, owner: uuid.UUID
    ) -> bool:
        trip = await self.tables.wire.trip("idempotency.take_over", "lwt")
        row = self._live(user_id, key) or {}
        taken = row.get("owner") == stale.owner and row.get("response") is None
        if taken:
            until = as_stored(self.tables.now() + self.lease)
            self._write(user_id, key, {"owner": owner, "lease_until": until}, insert=False)
        trip.landed()
        return taken

    async def complete(self, user_id: uuid.UUID, key: str, response: bytes) -> None:
        trip = await self.tables.wire.trip("idempotency.complete", "lwt")
        if self._live(user_id, key) is not None:  # IF EXISTS
            self._write(user_id, key, {"response": response}, insert=False)
        trip.landed()

    async def release(self, user_id: uuid.UUID, key: str, owner: uuid.UUID) -> None:
        trip = await self.tables.wire.trip("idempotency.release", "lwt")
        row = self._live(user_id, key)
        if row is not None and row.get("owner") == owner:
            del self.tables.idempotency_keys[(user_id, key)]
        trip.landed()

    def _live(self, user_id: uuid.UUID, key: str) -> dict[str, Any] | None:
        row = self.tables.idempotency_keys.get((user_id, key))
        return row.read(self.tables.now()) if row else None

    def _write(self, user_id: uuid.UUID, key: str, values: dict[str, Any], *, insert: bool) -> None:
        expires = self.tables.now() + timedelta(seconds=IDEMPOTENCY_TTL)
        row = self.tables.idempotency_keys.setdefault((user_id, key), Row())
        row.write(values, expires, insert=insert)

    def age(self, user_id: uuid.UUID, key: str, *, remaining: float) -> None:
        """Let a claim's cells all expire ``remaining`` seconds from now (as if it was written
        a day ago, less ``remaining``)."""
        row = self.tables.idempotency_keys[(user_id, key)]
        expires = self.tables.now() + timedelta(seconds=remaining)
        for cell in (*row.cells.values(), *([row.marker] if row.marker else [])):
            cell.expires = expires


class FakeRecentMail(RecentSends):
    """Twin of :class:`services.api.cooldown.RecentMail`: when each address was last accepted for,
    per scope, each row living for its cooldown (the real rows' TTL)."""

    def __init__(self, db: FakeCassandra) -> None:
        self.db = db

    async def cooling(
        self,
        user_id: uuid.UUID,
        emails: Iterable[str],
        scopes: Sequence[str],
        seconds: int,
        *,
        exclude: uuid.UUID | None = None,
        now: datetime | None = None,
    ) -> set[str]:
        now = now or datetime.now(UTC)
        wanted = sorted({address_key(e) for e in emails})
        found: set[str] = set()
        for i in range(0, len(wanted), LOOKUP_CHUNK):
            self.db._after(await self.db._before("recent.cooling"))
            for email in wanted[i : i + LOOKUP_CHUNK]:
                for scope in scopes:
                    stored = self.db.recent.get((user_id, email, scope))
                    row = stored.read(self.db.now()) if stored else None
                    if row is None:
                        continue  # never written, or expired: its TTL passed
                    if row["batch_id"] != exclude and cooling(row["last_at"], now, seconds):
                        found.add(email)
        return found

    async def record(
        self,
        user_id: uuid.UUID,
        emails: Iterable[str],
        scopes: Sequence[str],
        seconds: int,
        batch_id: uuid.UUID,
        at: datetime | None = None,
    ) -> None:
        at = at or datetime.now(UTC)
        for email in sorted({address_key(e) for e in emails}):
            for scope in scopes:
                done = await self.db._before("recent.record")
                expires = self.db.now() + timedelta(seconds=seconds)
                row = self.db.recent[(user_id, email, scope)] = Row()
                row.write({"last_at": ms(at), "batch_id": batch_id}, expires, insert=True)
                self.db._after(done)


class FakeCapStore(CapLedger):
    def __init__(self, wire: Wire = LOOPBACK) -> None:
        self.wire = wire
        """How each round trip travels (``tests.fakes.wire``)."""
        self.ledgers: dict[tuple[uuid.UUID, str], Holds] = {}

    @round_trip("caps.read", "read")
    async def read(self, user_id: uuid.UUID, ledger: str) -> Holds:
        return self.ledgers.get((user_id, ledger), Holds(None, {}))

    @round_trip("caps.write", "lwt")
    async def write(
        self,
        user_id: uuid.UUID,
        ledger: str,
        expected: int | None,
        holders: Mapping[str, datetime],
    ) -> bool:
        found = self.ledgers.get((user_id, ledger), Holds(None, {}))
        if found.version != expected:
            return False
        kept = {h: millis(at) for h, at in holders.items()}
        self.ledgers[(user_id, ledger)] = Holds((expected or 0) + 1, kept)
        return True

    @round_trip("caps.drop", "lwt")
    async def drop(self, user_id: uuid.UUID, ledger: str, expected: int | None) -> bool:
        found = self.ledgers.get((user_id, ledger))
        if expected is None or found is None:
            return True  # read as never written, or gone: nothing to drop
        if found.version != expected:
            return False
        del self.ledgers[(user_id, ledger)]
        return True


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
