"""Each user's suppression list: addresses never sent to again (hard bounce, complaint,
unsubscribe, or added by hand), with the reason, the source event and the time; and the
suppressions of one list or campaign (``scope``: an unsubscribe from mail that named a list
stops only mail naming that list). The one writer of ``suppressions`` and
``list_suppressions``."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from shared.addresses import address_key
from shared.db import Database

#: Addresses looked up per query when checking a batch's recipients.
LOOKUP_CHUNK = 100


class SuppressionStore:
    def __init__(self, db: Database) -> None:
        self.db = db

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
    ) -> None:
        values = (address_key(email), reason, source, event_id or "", at or datetime.now(UTC))
        if scope is None:
            await self.db.execute(
                "INSERT INTO suppressions (user_id, email, reason, source, event_id, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (user_id, *values),
                idempotent=True,
            )
            return
        await self.db.execute(
            "INSERT INTO list_suppressions (user_id, scope, email, reason, source, event_id, "
            "created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (user_id, scope, *values),
            idempotent=True,
        )

    async def remove(self, user_id: uuid.UUID, email: str, scope: str | None = None) -> bool:
        table, where, key = _where(user_id, scope)
        params = (*key, address_key(email))
        row = await self.db.one(
            f"SELECT email FROM {table} WHERE {where} AND email = ?",  # noqa: S608 - fixed names
            params,
        )
        if row is None:
            return False
        await self.db.execute(
            f"DELETE FROM {table} WHERE {where} AND email = ?",  # noqa: S608 - fixed names
            params,
            idempotent=True,
        )
        return True

    async def suppressed(
        self, user_id: uuid.UUID, emails: Iterable[str], scope: str | None = None
    ) -> dict[str, str]:
        """The subset of ``emails`` (compared lower-case) on the list, or on the list of
        ``scope``, with their reasons."""
        wanted = sorted({address_key(e) for e in emails})
        found: dict[str, str] = {}
        for i in range(0, len(wanted), LOOKUP_CHUNK):
            part = wanted[i : i + LOOKUP_CHUNK]
            rows = await self.db.rows(
                "SELECT email, reason FROM suppressions WHERE user_id = ? AND email IN ?",
                (user_id, part),
            )
            found.update({r["email"]: r["reason"] for r in rows})
            if scope is not None:
                rows = await self.db.rows(
                    "SELECT email, reason FROM list_suppressions WHERE user_id = ? "
                    "AND scope = ? AND email IN ?",
                    (user_id, scope, part),
                )
                found.update(
                    {
                        r["email"]: f"{r['reason']} ({scope})"
                        for r in rows
                        if r["email"] not in found
                    }
                )
        return found

    async def page(
        self, user_id: uuid.UUID, limit: int, after: str | None, scope: str | None = None
    ) -> list[dict[str, Any]]:
        table, where, key = _where(user_id, scope)
        query = f"SELECT email, reason, source, event_id, created_at FROM {table} WHERE {where}"  # noqa: S608
        params: tuple[Any, ...] = key
        if after:
            query += " AND email > ?"
            params += (after,)
        return await self.db.rows(query + " LIMIT ?", (*params, limit))


def _where(user_id: uuid.UUID, scope: str | None) -> tuple[str, str, tuple[Any, ...]]:
    """The table, partition condition and its values of the whole list or one list's."""
    if scope is None:
        return "suppressions", "user_id = ?", (user_id,)
    return "list_suppressions", "user_id = ? AND scope = ?", (user_id, scope)
