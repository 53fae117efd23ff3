"""Dashboard sessions stored server-side in Cassandra, and the pure rules around them.

The browser holds only a random 256-bit session id in the ``sd_session`` cookie; Cassandra
keeps ``SHA-256(id)`` as the key (a table dump yields no usable cookie), the user id, the
session's CSRF synchroniser token and its timestamps. Nothing from GitHub (least of all its
access token) is stored in a session.

Expiry has two clocks, both configurable in :class:`~shared.infra.config.ApiSettings`:

* **idle** (``session_idle_ttl``, default 7 days): a session unused that long is gone. It
  slides: a read more than :func:`refresh_interval` after the last refresh rewrites the row
  with a fresh TTL (a conditional ``IF EXISTS`` update, so a refresh can never resurrect a
  session that logout deleted), which costs one write per session per hour at most;
* **absolute** (``session_max_age``, default 30 days): no refresh extends a session past it.

Every row carries a Cassandra TTL equal to its remaining life, so abandoned sessions need no
clean-up; ``expires_at`` is also checked on read, so an expired session is no session even
in the second before Cassandra drops it.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol
from urllib.parse import urlsplit

from shared.infra.db import Database, utc

#: The session cookie's name (tests set it directly to skip the OAuth dance).
SESSION_COOKIE = "sd_session"
#: Short-lived cookie binding an OAuth login in flight to this browser.
LOGIN_COOKIE = "sd_login"
#: Defaults when a store is built without settings (the same as ApiSettings').
DEFAULT_IDLE_TTL = 7 * 86_400
DEFAULT_MAX_AGE = 30 * 86_400
#: Longest session id we bother to look up (ours are 43 characters).
MAX_ID_LENGTH = 128


@dataclass(frozen=True, slots=True)
class Session:
    """A live session as stored (the id itself is not stored)."""

    user_id: uuid.UUID
    csrf_token: str
    created_at: datetime
    refreshed_at: datetime
    expires_at: datetime


def new_token() -> str:
    """A fresh 256-bit URL-safe random value (session ids, CSRF tokens, OAuth state)."""
    return secrets.token_urlsafe(32)


def session_hash(session_id: str) -> str:
    """The storage key of a session id."""
    return hashlib.sha256(session_id.encode()).hexdigest()


def expiry(created_at: datetime, now: datetime, *, idle_ttl: int, max_age: int) -> datetime:
    """When a session used at ``now`` expires: after the idle time, never past the max age."""
    return min(now + timedelta(seconds=idle_ttl), created_at + timedelta(seconds=max_age))


def refresh_interval(idle_ttl: int) -> timedelta:
    """How stale ``refreshed_at`` may get before a read slides the expiry forward."""
    return timedelta(seconds=min(3600, idle_ttl // 4))


def ttl_seconds(expires_at: datetime, now: datetime) -> int:
    """The Cassandra TTL for a row that must live until ``expires_at``.

    One second more than the remaining life: Cassandra counts a TTL from the whole second the
    write lands in, so without it a row could vanish up to a second early. ``expires_at``
    decides expiry exactly; the TTL only removes the row afterwards.
    """
    return max(1, math.ceil((expires_at - now).total_seconds())) + 1


def safe_next(candidate: str | None) -> str:
    """``candidate`` when it is a local path (``/x?y``), else ``/``: never an open redirect.

    Refused: absolute URLs (``https://evil.com``), scheme-relative ones (``//evil.com``),
    backslashes (browsers read ``/\\evil.com`` as ``//evil.com``), control characters and
    anything that does not start with a single ``/``.
    """
    if not candidate or len(candidate) > 2000 or not candidate.startswith("/"):
        return "/"
    if candidate.startswith("//") or "\\" in candidate:
        return "/"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in candidate):
        return "/"
    parts = urlsplit(candidate)
    if parts.scheme or parts.netloc:
        return "/"
    return candidate


class Sessions(Protocol):
    """What callers use of :class:`SessionStore` (the store, or its in-memory twin)."""

    async def create(
        self, user_id: uuid.UUID, *, replaces: str | None = None
    ) -> tuple[str, str]: ...

    async def get(self, session_id: str) -> Session | None: ...

    async def delete(self, session_id: str) -> None: ...


class SessionStore:
    """Create, read (sliding the idle expiry) and delete sessions."""

    def __init__(
        self, db: Database, *, idle_ttl: int = DEFAULT_IDLE_TTL, max_age: int = DEFAULT_MAX_AGE
    ) -> None:
        self._db = db
        self.idle_ttl = idle_ttl
        self.max_age = max_age

    async def create(self, user_id: uuid.UUID, *, replaces: str | None = None) -> tuple[str, str]:
        """Start a session for ``user_id``; return ``(session_id, csrf_token)``.

        ``replaces`` is the browser's previous session id, deleted so that login always
        rotates the id (no session fixation).
        """
        if replaces:
            await self.delete(replaces)
        session_id, csrf = new_token(), new_token()
        now = datetime.now(UTC)
        expires = expiry(now, now, idle_ttl=self.idle_ttl, max_age=self.max_age)
        await self._db.execute(
            "INSERT INTO sessions (session_hash, user_id, csrf_token, created_at, refreshed_at, "
            "expires_at) VALUES (?, ?, ?, ?, ?, ?) USING TTL ?",
            (session_hash(session_id), user_id, csrf, now, now, expires, ttl_seconds(expires, now)),
            idempotent=True,
        )
        return session_id, csrf

    async def get(self, session_id: str) -> Session | None:
        """The live session with this id, or None (unknown, deleted or expired)."""
        if not session_id or len(session_id) > MAX_ID_LENGTH:
            return None
        key = session_hash(session_id)
        row = await self._db.one("SELECT * FROM sessions WHERE session_hash = ?", (key,))
        if row is None or row["user_id"] is None:
            return None
        now = datetime.now(UTC)
        session = Session(
            user_id=row["user_id"],
            csrf_token=str(row["csrf_token"]),
            created_at=utc(row["created_at"]),
            refreshed_at=utc(row["refreshed_at"]),
            expires_at=utc(row["expires_at"]),
        )
        if session.expires_at <= now:
            return None
        if now - session.refreshed_at >= refresh_interval(self.idle_ttl):
            session = await self._refresh(key, session, now)
        return session

    async def delete(self, session_id: str) -> None:
        """End a session server-side (its cookie stops working at once)."""
        if session_id and len(session_id) <= MAX_ID_LENGTH:
            # A lightweight transaction like the refresh: a plain delete is not ordered with
            # Paxos writes, so a refresh that read the row first could commit after it and
            # bring the session back.
            await self._db.execute(
                "DELETE FROM sessions WHERE session_hash = ? IF EXISTS",
                (session_hash(session_id),),
            )

    async def _refresh(self, key: str, session: Session, now: datetime) -> Session:
        expires = expiry(session.created_at, now, idle_ttl=self.idle_ttl, max_age=self.max_age)
        if expires <= session.expires_at:
            return session
        await self._db.execute(
            "UPDATE sessions USING TTL ? SET user_id = ?, csrf_token = ?, created_at = ?, "
            "refreshed_at = ?, expires_at = ? WHERE session_hash = ? IF EXISTS",
            (
                ttl_seconds(expires, now),
                session.user_id,
                session.csrf_token,
                session.created_at,
                now,
                expires,
                key,
            ),
        )
        return Session(session.user_id, session.csrf_token, session.created_at, now, expires)
