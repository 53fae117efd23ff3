"""``safedelivr check``: every violation of the delivery invariants found in stored data.

The promise is that nothing accepted is lost, nothing is sent twice and the stats agree with
the logs. Each of these leaves a trace an operator can look for:

* ``not_final``: a recipient still ``queued`` long after its batch was accepted (longer than
  every window the consumers wait for evidence), with what its attempts last said;
* ``sent_twice``: a recipient that providers accepted through two attempts of which neither
  was handed over (``superseded``) to the other: its evidence names both;
* ``delivered_but_failed``: a provider reported it ``delivered`` yet readers see ``failed``;
* ``stats``: a recipient whose outcome row disagrees with its state, or a bucket rollup that
  claims to be current yet disagrees with its outcome rows (see ``reconcile``).

The judgement over one batch's rows is pure (:func:`batch_violations`); :func:`check_day`
reads a day's batches and adds the stats drift of the same users.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any

from shared.core import batch_ids
from shared.delivery import precedence
from shared.delivery.attempts import Attempts, AttemptStore
from shared.delivery.recipients import RecipientStore
from shared.delivery.stats import DEFAULT_BUCKETS, StatsStore, batch_day
from shared.infra.db import Database
from shared.ops.reconcile import day_batches, reconcile_day

#: Violation kinds, in the order they are reported.
KINDS = ("not_final", "sent_twice", "delivered_but_failed", "stats")


@dataclass(frozen=True, slots=True)
class Violation:
    kind: str
    user_id: uuid.UUID
    batch_id: uuid.UUID | None
    subject: str
    """The recipient's address, or the stats metric."""
    detail: str

    def line(self) -> str:
        where = f"batch={self.batch_id} " if self.batch_id else ""
        return f"{self.kind} user={self.user_id} {where}{self.subject}: {self.detail}"


def outcome_violations(
    user_id: uuid.UUID,
    batch_id: uuid.UUID,
    rows: Iterable[Mapping[str, Any]],
    outcomes: Mapping[uuid.UUID, str | None],
) -> list[Violation]:
    """Recipients whose outcome row (``outcomes``, by log id) is not their state (pure)."""
    out = []
    for row in rows:
        state = precedence.visible(row).state
        want = state if state in ("success", "failed") else None
        have = outcomes.get(row["log_id"])
        if have != want:
            out.append(
                Violation(
                    "stats",
                    user_id,
                    batch_id,
                    str(row.get("email")),
                    f"outcome row says {have or 'nothing'}, the log says {state}",
                )
            )
    return out


def batch_violations(
    user_id: uuid.UUID,
    batch_id: uuid.UUID,
    rows: Iterable[Mapping[str, Any]],
    delivered: set[uuid.UUID],
    last_attempts: Mapping[str, str],
    *,
    now: datetime,
    settle_after: timedelta,
) -> list[Violation]:
    """The recipient-level violations of one batch (pure).

    ``delivered`` holds the recipients with a ``delivered`` event in their timeline;
    ``last_attempts`` maps a line (``c<chunk>``, ``r<log_id>``) to a description of its
    newest attempt, shown with a recipient that is not final.
    """
    out: list[Violation] = []
    settled = now - batch_ids.accepted_at(batch_id) >= settle_after
    for row in rows:
        seen = precedence.visible(row)
        email = str(row.get("email"))
        sent_by = set(row.get("evidence") or ()) - set(row.get("superseded") or ())
        if len(sent_by) > 1:
            out.append(
                Violation(
                    "sent_twice",
                    user_id,
                    batch_id,
                    email,
                    f"accepted through attempts {', '.join(sorted(sent_by))}",
                )
            )
        if seen.state == "failed" and row["log_id"] in delivered:
            out.append(
                Violation(
                    "delivered_but_failed",
                    user_id,
                    batch_id,
                    email,
                    f"a provider reported it delivered; shown failed ({seen.reason})",
                )
            )
        if seen.state == "queued" and settled:
            chunk_line = last_attempts.get(f"c{row.get('chunk')}", "no attempt")
            own = last_attempts.get(f"r{row['log_id']}")
            detail = f"queued since {batch_ids.accepted_at(batch_id):%Y-%m-%d %H:%M:%S}Z; "
            detail += f"chunk: {chunk_line}" + (f"; re-send: {own}" if own else "")
            out.append(Violation("not_final", user_id, batch_id, email, detail))
    return out


async def _batch(
    stats: StatsStore,
    attempts: Attempts,
    user_id: uuid.UUID,
    batch_id: uuid.UUID,
    **judge: Any,
) -> list[Violation]:
    db = stats.db
    rows = await RecipientStore(db, stats).batch_rows(batch_id)
    outcomes = {
        r["log_id"]: r["outcome"]
        for r in await db.all_pages(
            "SELECT log_id, outcome FROM stat_rows WHERE user_id = ? AND day = ? "
            "AND bucket IN ? AND batch_id = ?",
            (user_id, batch_day(batch_id), list(range(stats.buckets)), batch_id),
        )
    }
    found = outcome_violations(user_id, batch_id, rows, outcomes)
    delivered = {
        ev["log_id"]
        for ev in await db.all_pages(
            "SELECT log_id, kind FROM log_events WHERE batch_id = ?", (batch_id,)
        )
        if ev["kind"] == "delivered"
    }
    found += batch_violations(user_id, batch_id, rows, delivered, {}, **judge)
    if not any(v.kind == "not_final" for v in found):
        return found
    # Only a stuck recipient needs its attempts, to say where it is stuck.
    last = {
        line: f"attempt {a[-1].attempt} via {a[-1].provider} {a[-1].state}"
        for line, a in (await attempts.lines(batch_id)).items()
        if a
    }
    return [
        *outcome_violations(user_id, batch_id, rows, outcomes),
        *batch_violations(user_id, batch_id, rows, delivered, last, **judge),
    ]


async def check_day(
    db: Database,
    day: date,
    *,
    now: datetime,
    settle_after: timedelta,
    users: Sequence[uuid.UUID] | None = None,
    buckets: int = DEFAULT_BUCKETS,
) -> list[Violation]:
    """Every violation among the batches accepted on ``day`` (for ``users``, or everyone)."""
    stats = StatsStore(db, buckets)
    scope = list(users) if users is not None else await stats.active_users(day)
    attempts = AttemptStore(db)
    out: list[Violation] = []
    for user_id in sorted(scope, key=str):
        for batch_id in await day_batches(db, user_id, day):
            out += await _batch(
                stats, attempts, user_id, batch_id, now=now, settle_after=settle_after
            )
    for drift in await reconcile_day(db, day, users=scope, buckets=buckets):
        out.append(
            Violation(
                "stats",
                drift.user_id,
                None,
                f"bucket {drift.bucket}",
                f"rollup {drift.stored}, outcome rows {drift.counted}",
            )
        )
    return sorted(out, key=lambda v: KINDS.index(v.kind))
