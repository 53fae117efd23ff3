"""In-memory twins of the account-side stores: users and API keys (:mod:`shared.accounts.accounts`),
dashboard sessions (:class:`services.api.session_store.SessionStore`), ``Idempotency-Key`` claims
(:class:`services.api.idempotency.IdempotencyStore`) and the suppression list
(:class:`shared.audience.suppressions.SuppressionStore`).

They keep the Cassandra semantics these stores depend on:

* every round trip yields to the event loop, so concurrent callers interleave where they
  would in production, and a lightweight transaction (``IF NOT EXISTS``, ``IF EXISTS``,
  ``IF col = ?``) applies only when its condition holds at that moment;
* timestamps come back as Cassandra returns them: naive UTC, millisecond precision;
* a ``USING TTL`` or a table's ``default_time_to_live`` expires each cell on its own: a row
  lives as long as any of its cells (or the marker an INSERT writes) does;
* an UPDATE of a missing row creates it (an upsert), a DELETE removes the whole row;
* rows cluster in Cassandra's order (text by its UTF-8 bytes, the order of ``str``).

Where a store derives something from what it read (hashing a session id, expiry, parsing and
verifying a key) the twins call the production functions themselves. The module-level
functions of :mod:`shared.accounts.accounts` take a ``Database``; :class:`FakeAccounts` offers them
as methods without it. ``tests/contracts/test_account_stores.py`` runs one suite over each twin
and the real store, so the twins cannot drift from what they stand in for.
"""

from __future__ import annotations

import asyncio
import hmac
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from cassandra import InvalidRequest

from services.api import session_store as sessions
from services.api.idempotency import Claimed, Existing, IdempotencyKeys
from services.api.session_store import Session, Sessions
from shared.accounts import apikeys
from shared.accounts.accounts import ApiKeyRecord, StoredKey, UserProfile, key_record
from shared.audience.suppressions import Suppressions
from shared.core.addresses import address_key
from shared.infra.db import utc
from tests.fakes.stores import FakeCassandra, FakeSuppressions
from tests.fakes.wire import LOOPBACK, Wire

#: ``idempotency_keys``' ``default_time_to_live`` (deploy/cql/0001_core.cql).
IDEMPOTENCY_TTL = 86_400
#: The columns a claim writes (``response`` is written only by ``complete``).
_CLAIM_COLUMNS = ("body_hash", "batch_id", "owner", "lease_until", "created_at")
#: Every column of ``idempotency_keys`` besides its key.
_IDEMPOTENCY_COLUMNS = (*_CLAIM_COLUMNS, "response")


def stored(value: datetime) -> datetime:
    """A timestamp as Cassandra returns it: naive UTC, millisecond precision."""
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


async def _round_trip() -> None:
    # Concurrent callers interleave at every query, as they do against Cassandra.
    await asyncio.sleep(0)


@dataclass
class Clock:
    """Server time: the wall clock, moved forward by :meth:`advance` (what a test cannot do to
    Cassandra's own clock it does to the twin's)."""

    offset: timedelta = timedelta()

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += timedelta(seconds=seconds)


@dataclass
class _Cell:
    value: Any
    expires: datetime | None = None


@dataclass
class _Row:
    """A row's cells and its INSERT marker, each expiring on its own."""

    cells: dict[str, _Cell] = field(default_factory=dict)
    marker: _Cell | None = None

    def live(self, now: datetime) -> dict[str, Any] | None:
        """The row as a SELECT sees it at ``now`` (expired cells read as null); None when
        nothing of it is left."""
        alive = {c: cell.value for c, cell in self.cells.items() if _alive(cell, now)}
        if not alive and (self.marker is None or not _alive(self.marker, now)):
            return None
        return alive

    def write(self, values: dict[str, Any], expires: datetime | None, *, insert: bool) -> None:
        for column, value in values.items():
            self.cells[column] = _Cell(value, expires)
        if insert:
            self.marker = _Cell(True, expires)


def _alive(cell: _Cell, now: datetime) -> bool:
    return cell.value is not None and (cell.expires is None or now < cell.expires)


@dataclass
class AccountTables:
    """The tables the twins share, as one keyspace is shared by the real stores."""

    clock: Clock = field(default_factory=Clock)
    users: dict[uuid.UUID, dict[str, Any]] = field(default_factory=dict)
    users_by_login: dict[str, uuid.UUID] = field(default_factory=dict)
    users_by_github: dict[int, uuid.UUID] = field(default_factory=dict)
    api_keys: dict[str, dict[str, Any]] = field(default_factory=dict)
    api_keys_by_user: dict[uuid.UUID, set[str]] = field(default_factory=dict)
    sessions: dict[str, _Row] = field(default_factory=dict)
    idempotency_keys: dict[tuple[uuid.UUID, str], _Row] = field(default_factory=dict)
    wire: Wire = LOOPBACK
    """How each round trip travels (``tests.fakes.wire``); so far only the idempotency
    twin's go over it."""

    def now(self) -> datetime:
        return self.clock.now()


class FakeAccounts:
    """Twin of the functions of :mod:`shared.accounts.accounts` (each without its ``db``
    argument)."""

    def __init__(self, tables: AccountTables | None = None) -> None:
        self.tables = tables or AccountTables()

    async def ensure_user(self, login: str) -> uuid.UUID:
        await _round_trip()
        _not_empty(login)
        existing = self.tables.users_by_login.get(login)
        if existing:
            return existing
        await _round_trip()
        user_id = self.tables.users_by_login.setdefault(login, uuid.uuid4())  # IF NOT EXISTS
        await _round_trip()
        self._user(user_id).update(login=login, created_at=stored(self.tables.now()))
        return user_id

    async def upsert_github_user(
        self,
        *,
        github_id: int,
        login: str,
        name: str | None,
        email: str | None,
        avatar_url: str | None,
    ) -> uuid.UUID:
        now = stored(self.tables.now())
        await _round_trip()
        user_id = self.tables.users_by_github.get(github_id)
        if user_id is None:
            await _round_trip()
            candidate = uuid.uuid4()
            user_id = self.tables.users_by_github.setdefault(github_id, candidate)
            if user_id == candidate:
                await _round_trip()
                self._user(user_id)["created_at"] = now
        await _round_trip()
        self._user(user_id).update(
            login=login, github_id=github_id, name=name, email=email, avatar_url=avatar_url
        )
        return user_id

    async def get_user(self, user_id: uuid.UUID) -> UserProfile | None:
        await _round_trip()
        row = self.tables.users.get(user_id)
        if row is None or row.get("login") is None:
            return None
        return UserProfile(
            user_id=user_id,
            login=str(row["login"]),
            name=row.get("name"),
            email=row.get("email"),
            avatar_url=row.get("avatar_url"),
            sessions_after=utc(row.get("sessions_after")),
            github_id=row.get("github_id"),
        )

    async def end_sessions(self, user_id: uuid.UUID) -> None:
        await _round_trip()
        self._user(user_id)["sessions_after"] = stored(self.tables.now())

    async def create_key(
        self,
        user_id: uuid.UUID,
        name: str,
        *,
        scopes: Iterable[str] = apikeys.DEFAULT_SCOPES,
        expires_at: datetime | None = None,
    ) -> str:
        key = apikeys.generate()
        now = stored(self.tables.now())
        await _round_trip()
        self._key(key.key_id).update(
            user_id=user_id,
            secret_hash=key.secret_hash,
            name=name,
            created_at=now,
            scopes=set(scopes) or None,  # Cassandra stores an empty set as null
            expires_at=stored(expires_at) if expires_at else None,
        )
        await _round_trip()
        self.tables.api_keys_by_user.setdefault(user_id, set()).add(key.key_id)
        return key.plaintext

    async def authenticate(self, presented: str) -> ApiKeyRecord | None:
        parsed = apikeys.parse(presented)
        key_id, secret = parsed if parsed else ("", presented)
        row = None
        if parsed:
            await _round_trip()
            row = self.tables.api_keys.get(key_id)
        stored_hash = row["secret_hash"] if row else b"\0" * 32
        if not apikeys.verify(secret, stored_hash) or row is None:
            return None
        record = key_record(row)
        return record if record.live(self.tables.now()) else None

    async def read_key(self, key_id: str) -> StoredKey | None:
        await _round_trip()
        _not_empty(key_id)
        row = self.tables.api_keys.get(key_id)
        return StoredKey(key_record(row), bytes(row["secret_hash"])) if row else None

    async def list_keys(self, user_id: uuid.UUID) -> list[ApiKeyRecord]:
        await _round_trip()
        out = []
        for key_id in sorted(self.tables.api_keys_by_user.get(user_id, ())):
            await _round_trip()
            row = self.tables.api_keys.get(key_id)
            if row:
                out.append(key_record(row))
        return out

    async def revoke_key(self, user_id: uuid.UUID, key_id: str) -> bool:
        await _round_trip()
        _not_empty(key_id)
        row = self.tables.api_keys.get(key_id)
        if row is None or row["user_id"] != user_id:
            return False
        await _round_trip()
        row["revoked_at"] = stored(self.tables.now())
        return True

    async def touch_key(self, key_id: str) -> None:
        await _round_trip()
        _not_empty(key_id)
        self._key(key_id)["last_used_at"] = stored(self.tables.now())

    def _user(self, user_id: uuid.UUID) -> dict[str, Any]:
        return self.tables.users.setdefault(user_id, {})

    def _key(self, key_id: str) -> dict[str, Any]:
        """A row of ``api_keys`` to write (an UPDATE creates it when missing)."""
        columns = (
            "user_id",
            "secret_hash",
            "name",
            "created_at",
            "revoked_at",
            "last_used_at",
            "scopes",
            "expires_at",
        )
        return self.tables.api_keys.setdefault(key_id, {"key_id": key_id, **dict.fromkeys(columns)})


def _not_empty(key: str) -> None:
    """Cassandra refuses an empty partition key (the driver's error leaks through as is)."""
    if not key:
        raise InvalidRequest("Key may not be empty")


class FakeSessionStore(Sessions):
    """Twin of :class:`services.api.session_store.SessionStore`; every row carries its TTL."""

    def __init__(
        self,
        tables: AccountTables | None = None,
        *,
        idle_ttl: int = sessions.DEFAULT_IDLE_TTL,
        max_age: int = sessions.DEFAULT_MAX_AGE,
    ) -> None:
        self.tables = tables or AccountTables()
        self.idle_ttl = idle_ttl
        self.max_age = max_age

    async def create(self, user_id: uuid.UUID, *, replaces: str | None = None) -> tuple[str, str]:
        if replaces:
            await self.delete(replaces)
        session_id, csrf = sessions.new_token(), sessions.new_token()
        now = self.tables.now()
        expires = sessions.expiry(now, now, idle_ttl=self.idle_ttl, max_age=self.max_age)
        await _round_trip()
        row = self.tables.sessions[sessions.session_hash(session_id)] = _Row()
        row.write(_session_cells(user_id, csrf, now, now, expires), self._ttl(expires), insert=True)
        return session_id, csrf

    async def get(self, session_id: str) -> Session | None:
        if not session_id or len(session_id) > sessions.MAX_ID_LENGTH:
            return None
        key = sessions.session_hash(session_id)
        await _round_trip()
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
            await _round_trip()
            self.tables.sessions.pop(sessions.session_hash(session_id), None)

    async def _refresh(self, key: str, session: Session, now: datetime) -> Session:
        expires = sessions.expiry(
            session.created_at, now, idle_ttl=self.idle_ttl, max_age=self.max_age
        )
        if expires <= session.expires_at:
            return session
        await _round_trip()
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
        return row.live(self.tables.now()) if row else None


def _session_cells(
    user_id: uuid.UUID, csrf: str, created: datetime, refreshed: datetime, expires: datetime
) -> dict[str, Any]:
    return {
        "user_id": user_id,
        "csrf_token": csrf,
        "created_at": stored(created),
        "refreshed_at": stored(refreshed),
        "expires_at": stored(expires),
    }


class FakeIdempotencyStore(IdempotencyKeys):
    """Twin of :class:`services.api.idempotency.IdempotencyStore`: lightweight transactions on
    ``idempotency_keys``, whose every write expires after the table's default TTL."""

    def __init__(self, tables: AccountTables | None = None, *, lease: float = 30.0) -> None:
        self.tables = tables or AccountTables()
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
                "lease_until": stored(now + self.lease),
                "created_at": stored(now),
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
            until = stored(self.tables.now() + self.lease)
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
        return row.live(self.tables.now()) if row else None

    def _write(self, user_id: uuid.UUID, key: str, values: dict[str, Any], *, insert: bool) -> None:
        expires = self.tables.now() + timedelta(seconds=IDEMPOTENCY_TTL)
        row = self.tables.idempotency_keys.setdefault((user_id, key), _Row())
        row.write(values, expires, insert=insert)

    def age(self, user_id: uuid.UUID, key: str, *, remaining: float) -> None:
        """Let a claim's cells all expire ``remaining`` seconds from now (as if it was written
        a day ago, less ``remaining``)."""
        row = self.tables.idempotency_keys[(user_id, key)]
        expires = self.tables.now() + timedelta(seconds=remaining)
        for cell in (*row.cells.values(), *([row.marker] if row.marker else [])):
            cell.expires = expires


class FakeSuppressionStore(FakeSuppressions, Suppressions):
    """Twin of the whole :class:`shared.audience.suppressions.SuppressionStore` (the twin in
    ``tests/fakes/stores.py`` covers only what the consumers and webhooks use)."""

    def __init__(self, db: FakeCassandra | None = None) -> None:
        super().__init__(db or FakeCassandra())

    async def add(
        self,
        user_id: uuid.UUID,
        email: str,
        *,
        reason: str,
        source: str,
        event_id: str | None = None,
        at: datetime | None = None,
        scope: str | None = None,
        by_recipient: str | None = None,
    ) -> None:
        await super().add(
            user_id,
            email,
            reason=reason,
            source=source,
            event_id=event_id,
            at=at,
            scope=scope,
            by_recipient=by_recipient,
        )
        created = stored(at or self.db.now())
        self._table(scope)[self._key(user_id, email, scope)]["created_at"] = created

    async def entry(
        self, user_id: uuid.UUID, email: str, scope: str | None = None
    ) -> dict[str, Any] | None:
        await _round_trip()
        row = self._table(scope).get(self._key(user_id, email, scope))
        if row is None:
            return None
        return {**_suppression(address_key(email), row), "version": row["version"]}

    async def forget(
        self, user_id: uuid.UUID, email: str, scope: str | None = None, *, version: int
    ) -> None:
        """``DELETE ... USING TIMESTAMP version``: the cells written at or before it go; a
        row written since keeps its own (and its mark, if that too is newer)."""
        await _round_trip()
        table, key = self._table(scope), self._key(user_id, email, scope)
        row = table.get(key)
        if row is None:
            return
        if row["version"] <= version:
            del table[key]
        elif row["by_recipient_at"] <= version:
            row |= {"by_recipient": None, "by_recipient_at": 0}

    def _table(self, scope: str | None) -> dict[Any, dict[str, Any]]:
        return self.db.suppressions if scope is None else self.db.list_suppressions

    @staticmethod
    def _key(user_id: uuid.UUID, email: str, scope: str | None) -> tuple[Any, ...]:
        if scope is None:
            return (user_id, address_key(email))
        return (user_id, scope, address_key(email))

    async def remove(self, user_id: uuid.UUID, email: str, scope: str | None = None) -> bool:
        found = await self.entry(user_id, email, scope)
        if found is None:
            return False
        await self.forget(user_id, email, scope, version=found["version"])
        return True

    async def page(
        self, user_id: uuid.UUID, limit: int, after: str | None, scope: str | None = None
    ) -> list[dict[str, Any]]:
        await _round_trip()
        if limit <= 0:
            raise InvalidRequest("LIMIT must be strictly positive")
        table = self._table(scope)
        emails = sorted(
            key[-1]
            for key in table
            if key[0] == user_id
            and (scope is None or key[1] == scope)
            and (not after or key[-1] > after)
        )
        return [_suppression(e, table[self._key(user_id, e, scope)]) for e in emails[:limit]]


def _suppression(email: str, row: dict[str, Any]) -> dict[str, Any]:
    return {
        "email": email,
        "reason": row["reason"],
        "source": row["source"],
        "event_id": row["event_id"],
        "created_at": row.get("created_at"),
        "by_recipient": row.get("by_recipient"),
    }
