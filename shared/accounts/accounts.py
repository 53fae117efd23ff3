"""Users and API keys in Cassandra: creation without races, lookup, listing, revocation.

Dashboard users are keyed by their GitHub account id (never by e-mail or login, which can
change hands): ``users_by_github`` is claimed once with ``INSERT ... IF NOT EXISTS`` and the
profile in ``users`` is refreshed at every login, so a renamed account stays its user and an
account that registers a released login gets a user of its own. ``users_by_login`` serves the CLI's
``keys create --user LOGIN`` for accounts made without GitHub.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from shared.accounts import apikeys
from shared.core.errors import DependencyUnavailable
from shared.infra.config import Settings
from shared.infra.db import Database, Row, utc


@dataclass(frozen=True, slots=True)
class UserProfile:
    user_id: uuid.UUID
    login: str
    name: str | None
    email: str | None
    avatar_url: str | None
    sessions_after: datetime | None = None
    """Sessions started at or before this are over ("log out everywhere")."""
    github_id: int | None = None
    """The GitHub account it signed up with (None: made by the CLI); what operators are
    named by, never the login."""


@dataclass(frozen=True, slots=True)
class ApiKeyRecord:
    key_id: str
    user_id: uuid.UUID
    name: str
    created_at: datetime
    revoked_at: datetime | None
    last_used_at: datetime | None
    scopes: frozenset[str] = apikeys.DEFAULT_SCOPES
    expires_at: datetime | None = None

    def live(self, now: datetime) -> bool:
        """Neither revoked nor expired at ``now``."""
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)


@dataclass(frozen=True, slots=True)
class StoredKey:
    """A key's row as authentication needs it: its record and its secret's digest."""

    record: ApiKeyRecord
    secret_hash: bytes


async def ensure_user(db: Database, login: str) -> uuid.UUID:
    """The user with this login, created once even when two callers race (LWT)."""
    existing = await db.one("SELECT user_id FROM users_by_login WHERE login = ?", (login,))
    if existing:
        return existing["user_id"]  # type: ignore[no-any-return]
    candidate = uuid.uuid4()
    row = await db.one(
        "INSERT INTO users_by_login (login, user_id) VALUES (?, ?) IF NOT EXISTS",
        (login, candidate),
    )
    user_id: uuid.UUID = candidate if row and row["[applied]"] else row["user_id"]  # type: ignore[index]
    await db.execute(
        "INSERT INTO users (user_id, login, created_at) VALUES (?, ?, ?)",
        (user_id, login, datetime.now(UTC)),
        idempotent=True,
    )
    return user_id


async def github_user(db: Database, github_id: int) -> uuid.UUID | None:
    """The user of this GitHub account, if it ever signed up."""
    row = await db.one("SELECT user_id FROM users_by_github WHERE github_id = ?", (github_id,))
    return row["user_id"] if row else None


async def upsert_github_user(
    db: Database,
    *,
    github_id: int,
    login: str,
    name: str | None,
    email: str | None,
    avatar_url: str | None,
) -> uuid.UUID:
    """The user for this GitHub account, created once even when logins race; profile refreshed."""
    now = datetime.now(UTC)
    existing = await db.one("SELECT user_id FROM users_by_github WHERE github_id = ?", (github_id,))
    if existing:
        user_id: uuid.UUID = existing["user_id"]
    else:
        candidate = uuid.uuid4()
        row = await db.one(
            "INSERT INTO users_by_github (github_id, user_id, created_at) VALUES (?, ?, ?) "
            "IF NOT EXISTS",
            (github_id, candidate, now),
        )
        won = bool(row and row["[applied]"])
        user_id = candidate if won else row["user_id"]  # type: ignore[index]
        if won:
            await db.execute(
                "UPDATE users SET created_at = ? WHERE user_id = ?", (now, user_id), idempotent=True
            )
    await db.execute(
        "UPDATE users SET login = ?, github_id = ?, name = ?, email = ?, avatar_url = ? "
        "WHERE user_id = ?",
        (login, github_id, name, email, avatar_url, user_id),
        idempotent=True,
    )
    return user_id


async def get_user(db: Database, user_id: uuid.UUID) -> UserProfile | None:
    row = await db.one(
        "SELECT user_id, login, name, email, avatar_url, sessions_after, github_id FROM users "
        "WHERE user_id = ?",
        (user_id,),
    )
    if row is None or row["login"] is None:
        return None
    return UserProfile(
        user_id=row["user_id"],
        login=str(row["login"]),
        name=row["name"],
        email=row["email"],
        avatar_url=row["avatar_url"],
        sessions_after=utc(row["sessions_after"]),
        github_id=row["github_id"],
    )


async def end_sessions(db: Database, user_id: uuid.UUID) -> None:
    """Log the user out everywhere: every session started until now stops working."""
    await db.execute(
        "UPDATE users SET sessions_after = ? WHERE user_id = ?",
        (datetime.now(UTC), user_id),
        idempotent=True,
    )


async def create_key(
    db: Database,
    user_id: uuid.UUID,
    name: str,
    *,
    scopes: Iterable[str] = apikeys.DEFAULT_SCOPES,
    expires_at: datetime | None = None,
) -> str:
    """Store a new key's hash and return the plaintext key (shown once)."""
    key = apikeys.generate()
    now = datetime.now(UTC)
    created = await db.one(
        "INSERT INTO api_keys (key_id, user_id, secret_hash, name, created_at, scopes, "
        "expires_at) VALUES (?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS",
        (key.key_id, user_id, key.secret_hash, name, now, set(scopes), expires_at),
    )
    if not created or not created["[applied]"]:  # 80 random bits collided: never in practice
        raise DependencyUnavailable("cassandra", "a new key's id was taken; try again")
    await db.execute(
        "INSERT INTO api_keys_by_user (user_id, key_id, name, created_at) VALUES (?, ?, ?, ?)",
        (user_id, key.key_id, name, now),
    )
    return key.plaintext


async def authenticate(db: Database, presented: str) -> ApiKeyRecord | None:
    """The key record when ``presented`` is a live key; None otherwise (one answer for all)."""
    parsed = apikeys.parse(presented)
    # Hash something even for malformed keys so both paths cost about the same.
    key_id, secret = parsed if parsed else ("", presented)
    row = await db.one("SELECT * FROM api_keys WHERE key_id = ?", (key_id,)) if parsed else None
    stored = row["secret_hash"] if row else b"\0" * 32
    if not apikeys.verify(secret, stored) or row is None:
        return None
    record = key_record(row)
    return record if record.live(datetime.now(UTC)) else None


async def read_key(db: Database, key_id: str) -> StoredKey | None:
    """The row of ``key_id`` (live or not), for a cache to verify presented keys against."""
    row = await db.one("SELECT * FROM api_keys WHERE key_id = ?", (key_id,))
    return StoredKey(key_record(row), bytes(row["secret_hash"])) if row else None


async def list_keys(db: Database, user_id: uuid.UUID) -> list[ApiKeyRecord]:
    ids = await db.rows("SELECT key_id FROM api_keys_by_user WHERE user_id = ?", (user_id,))
    out = []
    for r in ids:
        row = await db.one("SELECT * FROM api_keys WHERE key_id = ?", (r["key_id"],))
        if row:
            out.append(key_record(row))
    return out


async def revoke_key(db: Database, user_id: uuid.UUID, key_id: str) -> bool:
    row = await db.one("SELECT user_id FROM api_keys WHERE key_id = ?", (key_id,))
    if row is None or row["user_id"] != user_id:
        return False
    await db.execute(
        "UPDATE api_keys SET revoked_at = ? WHERE key_id = ?", (datetime.now(UTC), key_id)
    )
    return True


def key_view(r: ApiKeyRecord) -> dict[str, object]:
    """What users may see of a key: never the secret or its hash."""
    return {
        "key_id": r.key_id,
        "prefix": f"sd_live_{r.key_id}_",
        "name": r.name,
        "created_at": r.created_at.isoformat(),
        "last_used_at": r.last_used_at.isoformat() if r.last_used_at else None,
        "revoked": r.revoked_at is not None,
        "scopes": sorted(r.scopes),
        "expires_at": r.expires_at.isoformat() if r.expires_at else None,
    }


async def touch_key(db: Database, key_id: str) -> None:
    await db.execute(
        "UPDATE api_keys SET last_used_at = ? WHERE key_id = ?",
        (datetime.now(UTC), key_id),
        idempotent=True,
    )


def key_record(row: Row) -> ApiKeyRecord:
    """A key as read from its ``api_keys`` row."""
    return ApiKeyRecord(
        key_id=str(row["key_id"]),
        user_id=row["user_id"],
        name=str(row["name"] or ""),
        created_at=utc(row["created_at"]),
        revoked_at=utc(row["revoked_at"]),
        last_used_at=utc(row["last_used_at"]),
        scopes=_scopes(row.get("scopes")),
        expires_at=utc(row.get("expires_at")),
    )


def _scopes(value: object) -> frozenset[str]:
    """A key's stored scopes; none stored (a key older than scopes) is the default set."""
    if not value or not isinstance(value, Iterable) or isinstance(value, str):  # a SortedSet
        return apikeys.DEFAULT_SCOPES
    return frozenset(str(s) for s in value)


async def create_key_for_login(
    settings: Settings,
    login: str,
    *,
    name: str,
    scopes: Iterable[str] = apikeys.DEFAULT_SCOPES,
    expires_at: datetime | None = None,
) -> str:
    """``safedelivr keys create --user LOGIN``: make the user if needed and a new key (the
    operator at the shell may grant any scope, ``operator`` included)."""
    db = await Database.connect(settings.cassandra, keyspace=settings.cassandra.keyspace)
    try:
        user_id = await ensure_user(db, login)
        return await create_key(db, user_id, name, scopes=scopes, expires_at=expires_at)
    finally:
        await db.close()
