"""``safedelivr stats reconcile --day D``: recompute a day's stats marks from the logs.

The logs (recipient rows and their event timelines) are the source of truth; the stats
ledger is derived from them. Reconciling a day rebuilds the marks every user should have on
that day, compares them with the stored marks, reports the drift per user and metric, and
with ``fix`` writes the missing marks, deletes the extra ones and refreshes the rollup.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from shared.batchstore import timeuuid_datetime
from shared.db import Database
from shared.stats import METRICS, StatsStore, day_of, is_closed

#: Outcomes of a batch are looked for this many days after it was accepted.
LOOKBACK_DAYS = 7

Marks = dict[str, set[str]]


@dataclass(frozen=True, slots=True)
class Drift:
    user_id: uuid.UUID
    metric: str
    expected: int
    stored: int
    missing: tuple[str, ...]
    extra: tuple[str, ...]


def expected_marks(
    day: date,
    batch_day: date,
    rows: Iterable[Mapping[str, Any]],
    events: Mapping[uuid.UUID, list[Mapping[str, Any]]],
) -> Marks:
    """The marks one batch's recipients earn on ``day`` (pure)."""
    marks: Marks = defaultdict(set)
    for row in rows:
        key = str(row["log_id"])
        if batch_day == day:
            marks["queued"].add(key)
        first: dict[str, date] = {}
        for ev in sorted(events.get(row["log_id"], []), key=lambda e: e["at"]):
            first.setdefault(ev["kind"], day_of(ev["at"].replace(tzinfo=UTC)))
        if row["state"] == "success" and first.get("delivered") == day:
            marks["success"].add(key)
        if (
            row["state"] == "failed"
            and row["last_update"] is not None
            and day_of(row["last_update"].replace(tzinfo=UTC)) == day
        ):
            marks["failed"].add(key)
        for kind, metric in (
            ("bounced", "bounced"),
            ("complained", "complained"),
            ("opened", "opened"),
            ("clicked", "clicked"),
        ):
            if first.get(kind) == day:
                marks[metric].add(key)
    return marks


def compare(user_id: uuid.UUID, expected: Marks, stored: Marks) -> list[Drift]:
    out = []
    for metric in METRICS:
        want, have = expected.get(metric, set()), stored.get(metric, set())
        if want != have:
            out.append(
                Drift(
                    user_id,
                    metric,
                    len(want),
                    len(have),
                    tuple(sorted(want - have)),
                    tuple(sorted(have - want)),
                )
            )
    return out


async def _user_batches(db: Database, user_id: uuid.UUID, day: date) -> list[uuid.UUID]:
    months = {(day - timedelta(days=i)).strftime("%Y-%m") for i in range(LOOKBACK_DAYS + 1)}
    found = []
    for month in sorted(months):
        rows = await db.all_pages(
            "SELECT batch_id FROM batches_by_user WHERE user_id = ? AND month = ?",
            (user_id, month),
        )
        for r in rows:
            created = timeuuid_datetime(r["batch_id"]).date()
            if day - timedelta(days=LOOKBACK_DAYS) <= created <= day:
                found.append(r["batch_id"])
    return found


async def user_expected(db: Database, user_id: uuid.UUID, day: date) -> Marks:
    total: Marks = defaultdict(set)
    for batch_id in await _user_batches(db, user_id, day):
        rows = [
            r
            for r in await db.all_pages(
                "SELECT log_id, state, last_update FROM batches WHERE batch_id = ?", (batch_id,)
            )
            if r["log_id"] is not None
        ]
        events: dict[uuid.UUID, list[Mapping[str, Any]]] = defaultdict(list)
        for ev in await db.all_pages(
            "SELECT log_id, at, kind FROM log_events WHERE batch_id = ?", (batch_id,)
        ):
            events[ev["log_id"]].append(ev)
        for metric, keys in expected_marks(
            day, timeuuid_datetime(batch_id).date(), rows, events
        ).items():
            total[metric] |= keys
    return total


async def reconcile_day(
    db: Database,
    day: date,
    *,
    fix: bool = False,
    users: Iterable[uuid.UUID] | None = None,
) -> list[Drift]:
    """Compare (and with ``fix`` repair) ``day`` for ``users``, or for every user if None."""
    stats = StatsStore(db)
    if users is None:
        scope = set(await stats.active_users(day))
        scope |= {r["user_id"] for r in await db.all_pages("SELECT user_id FROM users")}
    else:
        scope = set(users)
    drifts: list[Drift] = []
    for user_id in sorted(scope, key=str):
        expected = await user_expected(db, user_id, day)
        stored = {m: await stats.keys(user_id, day, m) for m in METRICS}
        found = compare(user_id, expected, stored)
        drifts.extend(found)
        if fix and found:
            await _repair(db, stats, user_id, day, found)
    return drifts


async def _repair(
    db: Database, stats: StatsStore, user_id: uuid.UUID, day: date, drifts: list[Drift]
) -> None:
    when = datetime.combine(day, datetime.min.time(), UTC)
    for d in drifts:
        await stats.mark(user_id, when, d.metric, d.missing)
        for key in d.extra:
            await db.execute(
                "DELETE FROM stat_marks WHERE user_id = ? AND day = ? AND metric = ? AND key = ?",
                (user_id, day, d.metric, key),
                idempotent=True,
            )
    if is_closed(day, datetime.now(UTC)):
        await stats.store_rollup(user_id, day, await stats.count_day(user_id, day))
