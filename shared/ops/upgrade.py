"""Moving data written before data model v2 to its layout (``safedelivr migrate``).

A v1 batch partition holds one row per recipient and no chunk rows; its stats are marks in
``stat_marks``. Upgrading a batch writes, from its recipient rows:

1. its stat rows: the batch's ``queued`` row, and each recipient's outcome row (its visible
   outcome at the write timestamp of its state, or of our give-up) with the engagement
   metrics its ``stat_marks`` recorded;
2. then one chunk row per chunk listing its recipients. The recipient rows stay, as the
   recipients' own rows: the merge of an empty chunk row with them is what they said alone.

Rows of the old ``outbox`` table move to the time-bucketed one (:func:`move_outbox`), and
time-bucketed rows written before the relay selected on ``published = false`` get that value
(:func:`flag_outbox`).

The chunk rows go last because they are what marks a batch as upgraded: a run that stops
part-way leaves the batch to the next run, which writes the same cells again (every write is
idempotent). Batches whose log ids are not the ones :func:`shared.delivery.recipients.log_id_for`
derives (none written by the API) keep the v1 layout, which readers still understand.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from shared.core import batch_ids
from shared.delivery import precedence
from shared.delivery.outbox import ABANDON_AFTER, Outbox
from shared.delivery.recipients import (
    CHUNK_ROW,
    SELECT,
    by_chunk,
    encode_recipients,
    log_id_for,
    substitutions_of,
    timeuuid_order,
)
from shared.delivery.stats import EVENT_METRICS, Stats, batch_day, bucket_of
from shared.infra.db import Database, Row

log = logging.getLogger(__name__)


@dataclass
class Report:
    upgraded: int = 0
    already: int = 0
    kept_v1: int = 0
    recipients: int = 0
    outbox_moved: int = 0
    outbox_flagged: int = 0


@dataclass(frozen=True, slots=True)
class _Entry:
    email: str
    name: str | None
    substitutions: dict[str, str]


def _derived(batch_id: uuid.UUID, row: Row) -> bool:
    """Whether a v1 row's log id is the one v2 derives from its address."""
    return row["email"] is not None and log_id_for(batch_id, row["email"]) == row["log_id"]


def _outcome(row: Row) -> tuple[str | None, int]:
    """A v1 recipient's outcome and the write timestamp its outcome row takes (pure)."""
    seen = precedence.visible(row)
    if seen.state not in ("success", "failed"):
        return None, 0
    if row.get("state") in ("success", "failed"):
        return seen.state, int(row.get(precedence.stamp_column("state")) or 0)
    return seen.state, precedence.give_up_stamp(row["batch_id"])


async def move_outbox(db: Database) -> int:
    """Move the rows of the old ``outbox`` table (batches an earlier release stored and had
    not yet seen confirmed) into the time-bucketed outbox, where the relay finds them."""
    moved = 0
    for row in await db.all_pages("SELECT namespace, shard, batch_id, user_id FROM outbox"):
        await Outbox(db, row["namespace"]).add(row["batch_id"], row["user_id"])
        await db.execute(
            "DELETE FROM outbox WHERE namespace = ? AND shard = ? AND batch_id = ?",
            (row["namespace"], row["shard"], row["batch_id"]),
            idempotent=True,
        )
        moved += 1
    return moved


async def flag_outbox(db: Database, now: datetime | None = None) -> int:
    """Give ``published = false`` to the time-bucketed outbox rows that have no value (written
    before the relay selected on it) in the minutes the relay still reads."""
    since = (now or datetime.now(UTC)) - ABANDON_AFTER - timedelta(minutes=1)
    flagged = 0
    for part in await db.all_pages("SELECT DISTINCT namespace, minute, shard FROM outbox_minutes"):
        if part["minute"].replace(tzinfo=UTC) < since:  # the driver's timestamps are naive UTC
            continue
        for row in await db.all_pages(
            "SELECT batch_id, published FROM outbox_minutes "
            "WHERE namespace = ? AND minute = ? AND shard = ?",
            (part["namespace"], part["minute"], part["shard"]),
        ):
            if row["published"] is None:
                # Only where still unset: a concurrent ``done`` must not be undone.
                await db.execute(
                    "UPDATE outbox_minutes SET published = false "
                    "WHERE namespace = ? AND minute = ? AND shard = ? AND batch_id = ? "
                    "IF published = null",
                    (part["namespace"], part["minute"], part["shard"], row["batch_id"]),
                )
                flagged += 1
    return flagged


async def upgrade(db: Database, stats: Stats) -> Report:
    """Upgrade every v1 batch of the keyspace (idempotent; safe to run again)."""
    report = Report(outbox_moved=await move_outbox(db), outbox_flagged=await flag_outbox(db))
    marks: dict[tuple[uuid.UUID, date], dict[str, set[str]]] = {}
    for part in await db.all_pages("SELECT DISTINCT batch_id FROM batches", page_size=1000):
        batch_id = part["batch_id"]
        rows = await db.all_pages(
            f"SELECT user_id, {SELECT} FROM batches WHERE batch_id = ?",  # noqa: S608
            (batch_id,),
            page_size=5000,
        )
        user_id = next((r["user_id"] for r in rows if r.get("user_id")), None)
        recipients = [r for r in rows if r["log_id"] is not None]
        if any(r["log_id"] == CHUNK_ROW for r in recipients):
            report.already += 1
            continue
        if user_id is None or not recipients:
            continue
        if not all(_derived(batch_id, r) for r in recipients):
            report.kept_v1 += 1
            continue
        day = batch_day(batch_id)
        if (user_id, day) not in marks:
            marks[(user_id, day)] = await _engagement(db, user_id, day)
        await _stats(db, stats, user_id, batch_id, recipients, marks[(user_id, day)])
        await _chunks(db, batch_id, recipients)
        report.upgraded += 1
        report.recipients += len(recipients)
    return report


async def _engagement(db: Database, user_id: uuid.UUID, day: date) -> dict[str, set[str]]:
    """A v1 user-day's engagement marks: metric -> log ids."""
    out: dict[str, set[str]] = defaultdict(set)
    for r in await db.all_pages(
        "SELECT metric, key FROM stat_marks WHERE user_id = ? AND day = ? AND metric IN ?",
        (user_id, day, list(EVENT_METRICS)),
        page_size=5000,
    ):
        out[r["metric"]].add(r["key"])
    return out


async def _stats(
    db: Database,
    stats: Stats,
    user_id: uuid.UUID,
    batch_id: uuid.UUID,
    recipients: list[Row],
    marks: dict[str, set[str]],
) -> None:
    header_stamp = int(batch_ids.accepted_at(batch_id).timestamp() * 1_000_000)
    await stats.accepted(user_id, batch_id, len(recipients), header_stamp)
    now = datetime.now(UTC)
    by_bucket: dict[int, list[Any]] = defaultdict(list)
    for row in recipients:
        outcome, stamp = _outcome({**row, "batch_id": batch_id})
        earned = [m for m in EVENT_METRICS if str(row["log_id"]) in marks.get(m, ())]
        stmts = await stats.outcome_statements(
            user_id, batch_id, row["log_id"], outcome=outcome, stamp=stamp, metrics=earned, now=now
        )
        by_bucket[bucket_of(row["log_id"], stats.buckets)] += stmts
    for stmts in by_bucket.values():
        await db.batch(stmts)


async def _chunks(db: Database, batch_id: uuid.UUID, recipients: list[Row]) -> None:
    insert = await db.prepare(
        "INSERT INTO batches (batch_id, chunk, log_id, recipients) VALUES (?, ?, ?, ?) "
        "USING TIMESTAMP ?"
    )
    queued = precedence.queued_stamp(batch_id)
    stmts = []
    for chunk, rows in by_chunk(recipients).items():
        listed = [
            _Entry(r["email"], r.get("name"), substitutions_of(r.get("substitutions")))
            for r in sorted(rows, key=lambda r: timeuuid_order(r["log_id"]))
        ]
        stmts.append(insert.bind((batch_id, chunk, CHUNK_ROW, encode_recipients(listed), queued)))
    await db.batch(stmts)
