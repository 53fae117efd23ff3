"""Provider attempts of each chunk, and the recipient-row updates they cause.

An attempt row is claimed with a lightweight transaction *before* the provider is called, so
a redelivered or duplicated job can tell "already accepted" (``sent``), "outcome unknown"
(``sending``: the process died mid-call) and "failed" apart and never sends blindly twice.
Recipient updates are single-partition batches written with an explicit timestamp so that a
later webhook event (written with its own, later, timestamp) always wins.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from cassandra.query import UNSET_VALUE, BatchStatement, BatchType

from shared.db import Database


@dataclass(frozen=True, slots=True)
class Attempt:
    attempt: int
    provider: str
    state: str
    """``sending`` (claimed, outcome unknown), ``sent`` or ``failed``."""
    started_at: datetime
    error: str | None
    message_id: str | None


#: Rank of our own give-up write: it outranks any provider event stamped in the same second.
GIVE_UP_RANK = 50


def micros(when: datetime, rank: int = 0) -> int:
    """A write timestamp on the same scale webhook events use: whole seconds plus a rank.

    Providers stamp events in whole seconds; writing ours at second resolution too lets a
    ``delivered`` from the same second (higher rank) win over our ``sent``.
    """
    return int(when.timestamp()) * 1_000_000 + rank


class AttemptStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def attempts(self, batch_id: uuid.UUID, chunk: int) -> list[Attempt]:
        rows = await self.db.rows(
            "SELECT attempt, provider, state, started_at, error, message_id FROM chunk_attempts "
            "WHERE batch_id = ? AND chunk = ?",
            (batch_id, chunk),
        )
        return [
            Attempt(
                r["attempt"],
                r["provider"],
                r["state"],
                r["started_at"].replace(tzinfo=UTC),
                r["error"],
                r["message_id"],
            )
            for r in rows
        ]

    async def claim(self, batch_id: uuid.UUID, chunk: int, attempt: int, provider: str) -> bool:
        """Record attempt ``attempt`` as ``sending``; False when it was already recorded."""
        row = await self.db.one(
            "INSERT INTO chunk_attempts (batch_id, chunk, attempt, provider, state, attempt_id, "
            "started_at) VALUES (?, ?, ?, ?, 'sending', ?, ?) IF NOT EXISTS",
            (batch_id, chunk, attempt, provider, uuid.uuid4(), datetime.now(UTC)),
        )
        return bool(row and row["[applied]"])

    async def finish(
        self,
        batch_id: uuid.UUID,
        chunk: int,
        attempt: int,
        *,
        state: str,
        status_code: int | None,
        message_id: str | None = None,
        error: str | None = None,
    ) -> None:
        await self.db.execute(
            "UPDATE chunk_attempts SET state = ?, finished_at = ?, status_code = ?, "
            "message_id = ?, error = ? WHERE batch_id = ? AND chunk = ? AND attempt = ?",
            (
                state,
                datetime.now(UTC),
                *(UNSET_VALUE if v is None else v for v in (status_code, message_id, error)),
                batch_id,
                chunk,
                attempt,
            ),
            idempotent=True,
        )

    async def update_recipients(
        self,
        batch_id: uuid.UUID,
        chunk: int,
        log_ids: Iterable[uuid.UUID],
        *,
        provider: str,
        provider_result: str,
        at: datetime,
        event: str | None = None,
        state: str | None = None,
        message_id: str | None = None,
        reason: str | None = None,
        rank: int = 0,
    ) -> None:
        """Write one chunk's recipient rows as a single-partition batch at timestamp ``at``."""
        sets = ["providers[?] = ?", "last_update = ?"]
        values: list[object] = [provider, provider_result, at]
        if event is not None:
            sets.append("event = ?")
            values.append(event)
        if state is not None:
            sets.append("state = ?")
            values.append(state)
        if message_id is not None:
            sets.append("message_ids[?] = ?")
            values.extend([provider, message_id])
        if reason is not None:
            sets.append("reason_detail = ?")
            values.append(reason)
        stmt = await self.db.prepare(
            f"UPDATE batches USING TIMESTAMP ? SET {', '.join(sets)} "  # noqa: S608 - fixed columns
            "WHERE batch_id = ? AND chunk = ? AND log_id = ?"
        )
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        ts = micros(at, rank)
        for log_id in log_ids:
            batch.add(stmt, (ts, *values, batch_id, chunk, log_id))
        await self.db.execute(batch)
