"""``safedelivr stats reconcile --day D``: recompute a day's stats marks from the logs.

The logs (recipient rows, merged by ``shared.precedence``, and their counted timeline events)
are the source of truth; the stats ledger is derived from them. A day's marks belong to the
recipients of the batches accepted that day, so reconciling a day reads those batches,
rebuilds the marks every user should have, compares them with the stored marks, reports the
drift per user and metric, and with ``fix`` repairs the marks from the logs (never the
reverse): outcome marks are mirrored again from each recipient's state with that state's own
write timestamp, plus one microsecond (so later provider evidence still wins), missing marks
of the other metrics are added and extra ones removed.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from cassandra.util import max_uuid_from_time, min_uuid_from_time

from shared import precedence
from shared.db import Database
from shared.stats import METRICS, OUTCOMES, StatsStore, is_closed

Marks = dict[str, set[str]]

#: Timeline kinds that earn a mark of the same name.
_EVENT_METRICS = {
    "bounced": "bounced",
    "complained": "complained",
    "opened": "opened",
    "clicked": "clicked",
}


@dataclass(frozen=True, slots=True)
class Drift:
    user_id: uuid.UUID
    metric: str
    expected: int
    stored: int
    missing: tuple[str, ...]
    extra: tuple[str, ...]


def expected_marks(
    rows: Iterable[Mapping[str, Any]], events: Mapping[uuid.UUID, list[Mapping[str, Any]]]
) -> Marks:
    """The marks one batch's recipients earn on the batch's day (pure)."""
    marks: Marks = defaultdict(set)
    for row in rows:
        key = str(row["log_id"])
        marks["queued"].add(key)
        state = precedence.visible(row).state
        if state in OUTCOMES:
            marks[state].add(key)
        for ev in events.get(row["log_id"], []):
            metric = _EVENT_METRICS.get(ev["kind"])
            if metric and ev.get("counted") is not False:
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


async def day_batches(db: Database, user_id: uuid.UUID, day: date) -> list[uuid.UUID]:
    start = datetime.combine(day, datetime.min.time(), UTC)
    end = start + timedelta(days=1)
    rows = await db.all_pages(
        "SELECT batch_id FROM batches_by_user WHERE user_id = ? AND month = ? "
        "AND batch_id >= ? AND batch_id <= ?",
        (
            user_id,
            day.strftime("%Y-%m"),
            min_uuid_from_time(start.timestamp()),
            max_uuid_from_time(end.timestamp() - 1e-6),
        ),
    )
    return [r["batch_id"] for r in rows]


async def _batch(
    db: Database, batch_id: uuid.UUID
) -> tuple[list[dict[str, Any]], dict[uuid.UUID, list[Mapping[str, Any]]]]:
    rows = [
        r
        for r in await db.all_pages(
            "SELECT log_id, state, event, reason_detail, gave_up_reason, "
            "WRITETIME(state) AS stamp FROM batches WHERE batch_id = ?",
            (batch_id,),
        )
        if r["log_id"] is not None
    ]
    events: dict[uuid.UUID, list[Mapping[str, Any]]] = defaultdict(list)
    for ev in await db.all_pages(
        "SELECT log_id, kind, counted FROM log_events WHERE batch_id = ?", (batch_id,)
    ):
        events[ev["log_id"]].append(ev)
    return rows, events


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
        expected: Marks = defaultdict(set)
        batches = []
        for batch_id in await day_batches(db, user_id, day):
            rows, events = await _batch(db, batch_id)
            batches.append((batch_id, rows))
            for metric, keys in expected_marks(rows, events).items():
                expected[metric] |= keys
        stored = {m: await stats.keys(user_id, day, m) for m in METRICS}
        found = compare(user_id, expected, stored)
        drifts.extend(found)
        if fix and found:
            await _repair(db, stats, user_id, day, found, batches)
    return drifts


async def _repair(
    db: Database,
    stats: StatsStore,
    user_id: uuid.UUID,
    day: date,
    drifts: list[Drift],
    batches: list[tuple[uuid.UUID, list[dict[str, Any]]]],
) -> None:
    for batch_id, rows in batches:
        for row in rows:
            seen = precedence.visible(row)
            if seen.state not in OUTCOMES:
                continue
            stamp = row["stamp"] if row["state"] in OUTCOMES else precedence.give_up_stamp(batch_id)
            # One microsecond above the state's own write: it beats a lost (deleted) mark
            # of that write, and still loses to any later outcome (a later second, or a
            # higher-ranked kind in the same second, which is the same metric).
            await stats.outcome(user_id, batch_id, [row["log_id"]], seen.state, stamp + 1)
    batch_of = {str(r["log_id"]): b for b, rows in batches for r in rows}
    for d in drifts:
        if d.metric in OUTCOMES:
            continue
        for key in d.missing:
            await stats.mark(user_id, batch_of[key], d.metric, [uuid.UUID(key)])
        for key in d.extra:
            await db.execute(
                "DELETE FROM stat_marks WHERE user_id = ? AND day = ? AND metric = ? AND key = ?",
                (user_id, day, d.metric, key),
                idempotent=True,
            )
    if is_closed(day, datetime.now(UTC)):
        await stats.store_rollup(user_id, day, await stats.count_day(user_id, day))
