"""Recipient state: the one module that writes it, with the stats marks that mirror it.

Every write carries a timestamp from :mod:`shared.precedence`, so writes from the consumers
(a provider accepted a chunk; a call failed; we gave up; a hand-off to another provider) and
from the webhook intake (provider events) merge by last-write-wins however they interleave or
repeat. The outcome marks of :class:`~shared.stats.StatsStore` (``success``/``failed``) are
written with the same timestamp as the state they mirror, so the stats and the logs agree by
construction once both writes are in (callers are at-least-once and retry until they are).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime

from cassandra.query import BatchStatement, BatchType

from shared import precedence
from shared.db import Database, Row
from shared.stats import StatsStore

#: Columns every reader of recipient state needs (see :func:`shared.precedence.visible`).
STATE_COLUMNS = (
    "chunk, log_id, email, name, substitutions, state, event, providers, message_ids, "
    "reason_detail, last_update, gave_up_reason, gave_up_at, evidence, superseded"
)

#: Kinds of line a recipient's evidence tags name: its chunk's (``c``) or its own (``r``).
CHUNK, OWN = "c", "r"


def accepted_by_line(row: Row, kind: str) -> bool:
    """Whether a provider is known to have accepted this recipient through a line of ``kind``.

    Rows written before attempts were tagged carry no evidence: any event past ``queued``
    then counts as acceptance by the chunk.
    """
    evidence = row.get("evidence") or ()
    if any(t.startswith(kind + ".") for t in evidence):
        return True
    return kind == CHUNK and not evidence and (row.get("event") or "queued") != "queued"


class RecipientStore:
    """Writes (and the reads the writers need) of recipient rows in ``batches``."""

    def __init__(self, db: Database, stats: StatsStore | None = None) -> None:
        self.db = db
        self.stats = stats or StatsStore(db)

    async def batch_rows(self, batch_id: uuid.UUID) -> list[Row]:
        """Every recipient row of a batch (the header's row, without a recipient, left out)."""
        rows = await self.db.all_pages(
            f"SELECT {STATE_COLUMNS} FROM batches WHERE batch_id = ?",  # noqa: S608
            (batch_id,),
        )
        return [r for r in rows if r["log_id"] is not None]

    async def chunk_rows(self, batch_id: uuid.UUID, chunk: int) -> list[Row]:
        return await self.db.all_pages(
            f"SELECT {STATE_COLUMNS} FROM batches WHERE batch_id = ? AND chunk = ?",  # noqa: S608
            (batch_id, chunk),
        )

    async def one(self, batch_id: uuid.UUID, chunk: int, log_id: uuid.UUID) -> Row | None:
        return await self.db.one(
            f"SELECT {STATE_COLUMNS} FROM batches "  # noqa: S608
            "WHERE batch_id = ? AND chunk = ? AND log_id = ?",
            (batch_id, chunk, log_id),
        )

    async def accepted(
        self,
        batch_id: uuid.UUID,
        chunk: int,
        log_ids: Sequence[uuid.UUID],
        *,
        provider: str,
        tag: str,
        when: datetime,
        message_id: str | None,
    ) -> None:
        """A provider accepted attempt ``tag`` for these recipients (our record or its word)."""
        stamp = precedence.provider_stamp(batch_id, when, 0)
        sets = "evidence = evidence + ?, event = ?, last_update = ?, providers[?] = ?"
        values: list[object] = [{tag}, "sent", when, provider, "sent"]
        if message_id:
            sets += ", message_ids[?] = ?"
            values += [provider, message_id]
        await self._each(batch_id, chunk, log_ids, stamp, sets, values)

    async def call_failed(
        self,
        batch_id: uuid.UUID,
        chunk: int,
        log_ids: Sequence[uuid.UUID],
        *,
        provider: str,
        result: str,
        when: datetime,
    ) -> None:
        """A provider refused (or failed) a call for these recipients: the providers map only."""
        stamp = precedence.provider_stamp(batch_id, when, 0)
        await self._each(
            batch_id, chunk, log_ids, stamp, "providers[?] = ?", [provider, result[:300]]
        )

    async def give_up(
        self,
        batch_id: uuid.UUID,
        user_id: uuid.UUID,
        chunk: int,
        log_ids: Sequence[uuid.UUID],
        *,
        reason: str,
        when: datetime,
    ) -> None:
        """Every provider and retry failed: these recipients end ``failed`` unless a provider
        says otherwise, now or later (the give-up is outranked by any provider evidence)."""
        if not log_ids:
            return
        stamp = precedence.give_up_stamp(batch_id)
        await self._each(
            batch_id,
            chunk,
            log_ids,
            stamp,
            "gave_up_reason = ?, gave_up_at = ?",
            [reason[:1000], when],
        )
        await self.stats.outcome(user_id, batch_id, log_ids, "failed", stamp)

    async def supersede(
        self,
        batch_id: uuid.UUID,
        chunk: int,
        log_id: uuid.UUID,
        *,
        tag: str,
        provider: str,
        result: str,
        when: datetime,
    ) -> None:
        """Attempt ``tag`` was handed over to another provider: its later failures no longer
        decide this recipient's fate."""
        stamp = precedence.provider_stamp(batch_id, when, 0)
        await self._each(
            batch_id,
            chunk,
            [log_id],
            stamp,
            "superseded = superseded + ?, providers[?] = ?",
            [{tag}, provider, result[:300]],
        )

    async def reported(
        self,
        batch_id: uuid.UUID,
        user_id: uuid.UUID,
        chunk: int,
        log_id: uuid.UUID,
        *,
        provider: str,
        provider_result: str,
        message_id: str | None,
        stage_rank: int,
        rank: int,
        when: datetime,
        event: str | None,
        state: str | None,
        reason: str | None,
        evidence: str | None,
    ) -> None:
        """A provider reported on one recipient (a normalised webhook event).

        The provider's own map entries merge by the event's stage (``stage_rank``); the
        recipient-wide columns (event, state) by ``rank``, which lets a re-send's events win
        over the failure that caused it. An outcome (``state``) is mirrored in the stats.
        """
        stage = precedence.provider_stamp(batch_id, when, stage_rank)
        sets = "providers[?] = ?"
        values: list[object] = [provider, provider_result[:300]]
        if message_id:
            sets += ", message_ids[?] = ?"
            values += [provider, message_id]
        if evidence is not None:
            sets += ", evidence = evidence + ?"
            values.append({evidence})
        await self._each(batch_id, chunk, [log_id], stage, sets, values)
        if event is None:
            return
        stamp = precedence.provider_stamp(batch_id, when, rank)
        sets = "event = ?, last_update = ?"
        values = [event, when]
        if state is not None:
            sets += ", state = ?"
            values.append(state)
        if state == "failed" and reason:
            sets += ", reason_detail = ?"
            values.append(reason[:1000])
        await self._each(batch_id, chunk, [log_id], stamp, sets, values)
        if state in ("success", "failed"):
            await self.stats.outcome(user_id, batch_id, [log_id], state, stamp)

    async def _each(
        self,
        batch_id: uuid.UUID,
        chunk: int,
        log_ids: Iterable[uuid.UUID],
        stamp: int,
        sets: str,
        values: Sequence[object],
    ) -> None:
        """One single-partition batch: the same update of each recipient at ``stamp``."""
        stmt = await self.db.prepare(
            f"UPDATE batches USING TIMESTAMP ? SET {sets} "  # noqa: S608 - fixed columns
            "WHERE batch_id = ? AND chunk = ? AND log_id = ?"
        )
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        batch.is_idempotent = True  # fixed timestamps: a retry writes the same cells
        for log_id in log_ids:
            batch.add(stmt, (stamp, *values, batch_id, chunk, log_id))
        if len(batch):
            await self.db.execute(batch)
