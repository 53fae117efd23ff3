"""Cooldown: the least time between two mails of one user to one address, and the one
writer of ``recent_mail`` (when each address was last accepted for, per scope).

A recipient mailed within the user's cooldown is not sent to: the batch's 202 lists it with
the reason ``cooldown`` beside the suppressed ones (never silently dropped). The scope is the
whole mailbox (``""``), or with ``per_category`` each category of the batch (a batch without
categories counts as the empty one), so a receipt need not wait for a newsletter.

Recent mail is recorded when a batch is accepted, with a TTL of the cooldown, so rows clean
themselves up. Two batches accepted at the same instant may both pass (the check is a read,
not a lock per address): cooldown throttles repeats, it does not serialise requests.

The decisions are pure; :class:`RecentMail` does the I/O.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Final, Protocol

from shared.core.addresses import address_key
from shared.infra.db import Database

#: Addresses looked up per query.
LOOKUP_CHUNK: Final = 100
#: Writes in flight while recording a batch's recipients.
WRITE_WINDOW: Final = 64
REASON: Final = "cooldown"


def scopes_of(categories: Sequence[str], *, per_category: bool) -> tuple[str, ...]:
    """The scopes a batch's mail counts in (and is checked against)."""
    if not per_category:
        return ("",)
    return tuple(dict.fromkeys(c.lower() for c in categories)) or ("",)


def cooling(last: datetime | None, now: datetime, seconds: int) -> bool:
    """Whether an address last mailed at ``last`` is still inside the cooldown."""
    return seconds > 0 and last is not None and now - last < timedelta(seconds=seconds)


class RecentSends(Protocol):
    """What callers use of :class:`RecentMail` (the store, or its in-memory twin)."""

    async def cooling(
        self,
        user_id: uuid.UUID,
        emails: Iterable[str],
        scopes: Sequence[str],
        seconds: int,
        *,
        exclude: uuid.UUID | None = None,
        now: datetime | None = None,
    ) -> set[str]: ...

    async def record(
        self,
        user_id: uuid.UUID,
        emails: Iterable[str],
        scopes: Sequence[str],
        seconds: int,
        batch_id: uuid.UUID,
        at: datetime | None = None,
    ) -> None: ...


class RecentMail:
    def __init__(self, db: Database) -> None:
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
        """The addresses (lower case) mailed in one of ``scopes`` less than ``seconds`` ago
        by another batch than ``exclude``."""
        now = now or datetime.now(UTC)
        wanted = sorted({address_key(e) for e in emails})
        found: set[str] = set()

        async def part(chunk: list[str]) -> None:
            rows = await self.db.rows(
                "SELECT email, last_at, batch_id FROM recent_mail WHERE user_id = ? AND email IN ? "
                "AND scope IN ?",
                (user_id, chunk, list(scopes)),
            )
            found.update(
                r["email"]
                for r in rows
                if r["batch_id"] != exclude and cooling(_utc(r["last_at"]), now, seconds)
            )

        await asyncio.gather(
            *(part(wanted[i : i + LOOKUP_CHUNK]) for i in range(0, len(wanted), LOOKUP_CHUNK))
        )
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
        """Remember that ``emails`` were mailed now, for ``seconds`` (the row's TTL)."""
        at = at or datetime.now(UTC)
        insert = await self.db.prepare(
            "INSERT INTO recent_mail (user_id, email, scope, last_at, batch_id) "
            "VALUES (?, ?, ?, ?, ?) USING TTL ?"
        )
        window = asyncio.Semaphore(WRITE_WINDOW)

        async def one(email: str, scope: str) -> None:
            async with window:
                await self.db.execute(
                    insert, (user_id, email, scope, at, batch_id, seconds), idempotent=True
                )

        await asyncio.gather(*(one(address_key(e), s) for e in set(emails) for s in scopes))


def _utc(value: datetime | None) -> datetime | None:
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)
