"""Each user's suppression list: addresses never sent to again (hard bounce, complaint,
unsubscribe, or added by hand), with the reason, the source event and the time."""

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
    ) -> None:
        await self.db.execute(
            "INSERT INTO suppressions (user_id, email, reason, source, event_id, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (user_id, address_key(email), reason, source, event_id or "", at or datetime.now(UTC)),
            idempotent=True,
        )

    async def remove(self, user_id: uuid.UUID, email: str) -> bool:
        row = await self.db.one(
            "SELECT email FROM suppressions WHERE user_id = ? AND email = ?",
            (user_id, address_key(email)),
        )
        if row is None:
            return False
        await self.db.execute(
            "DELETE FROM suppressions WHERE user_id = ? AND email = ?",
            (user_id, address_key(email)),
            idempotent=True,
        )
        return True

    async def suppressed(self, user_id: uuid.UUID, emails: Iterable[str]) -> dict[str, str]:
        """The subset of ``emails`` (compared lower-case) on the list, with their reasons."""
        wanted = sorted({address_key(e) for e in emails})
        found: dict[str, str] = {}
        for i in range(0, len(wanted), LOOKUP_CHUNK):
            part = wanted[i : i + LOOKUP_CHUNK]
            rows = await self.db.rows(
                "SELECT email, reason FROM suppressions WHERE user_id = ? AND email IN ?",
                (user_id, part),
            )
            found.update({r["email"]: r["reason"] for r in rows})
        return found

    async def page(self, user_id: uuid.UUID, limit: int, after: str | None) -> list[dict[str, Any]]:
        query = (
            "SELECT email, reason, source, event_id, created_at FROM suppressions WHERE user_id = ?"
        )
        params: tuple[Any, ...] = (user_id,)
        if after:
            query += " AND email > ?"
            params += (after,)
        return await self.db.rows(query + " LIMIT ?", (*params, limit))
