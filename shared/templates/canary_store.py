"""Canary rollouts of templates: the one writer of ``canary_batches``, ``canary_rollouts``
and ``template_rollouts``.

A rollout is a template's canary since the time it was published. Each batch that carries
it is recorded with the batch's own write (:meth:`CanaryStore.statements`, one mutation with
the batch), so the judge (``services.consumers.canary_judge``) finds every batch that went
out under the rollout, and the rollout itself is on the namespace's to-do list until it
has a verdict. A verdict (promoted or rolled back, with why and the counts it was based on)
is kept per template: the audit trail that ``GET /v1/templates/{id}`` and the dashboard show.
The judge also keeps it on the template with the update that applies it
(:func:`verdict_text`), which is how a judge that died before auditing finds it again.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Protocol

import orjson
from cassandra.query import BoundStatement
from cassandra.util import uuid_from_time

from shared.infra.db import Database, utc
from shared.templates.canary import Counts

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Rollout:
    template_id: uuid.UUID
    since: datetime
    user_id: uuid.UUID
    canary_version: int
    live_version: int


@dataclass(frozen=True, slots=True)
class Outcome:
    """A rollout's verdict, as audited."""

    at: datetime
    canary_version: int
    live_version: int
    decision: str
    reason: str
    canary: Counts
    live: Counts


class Canaries(Protocol):
    """What callers use of :class:`CanaryStore` (the store, or its in-memory twin)."""

    async def statements(self, rollout: Rollout, batch_id: uuid.UUID) -> list[BoundStatement]: ...

    async def rollouts(self) -> list[Rollout]: ...

    async def batches(self, rollout: Rollout) -> list[uuid.UUID]: ...

    async def judged(self, rollout: Rollout, outcome: Outcome) -> None: ...

    async def forget(self, rollout: Rollout) -> None: ...

    async def history(self, template_id: uuid.UUID) -> list[Outcome]: ...


class CanaryStore:
    def __init__(self, db: Database, namespace: str) -> None:
        self.db = db
        self.namespace = namespace

    async def statements(self, rollout: Rollout, batch_id: uuid.UUID) -> list[BoundStatement]:
        """The writes that record ``batch_id`` as carrying ``rollout``'s canary."""
        batch = await self.db.prepare(
            "INSERT INTO canary_batches (template_id, since, batch_id) VALUES (?, ?, ?)"
        )
        listed = await self.db.prepare(
            "INSERT INTO canary_rollouts (namespace, template_id, since, user_id, "
            "canary_version, live_version) VALUES (?, ?, ?, ?, ?, ?)"
        )
        return [
            batch.bind((rollout.template_id, rollout.since, batch_id)),
            listed.bind(
                (
                    self.namespace,
                    rollout.template_id,
                    rollout.since,
                    rollout.user_id,
                    rollout.canary_version,
                    rollout.live_version,
                )
            ),
        ]

    async def rollouts(self) -> list[Rollout]:
        """The rollouts waiting for a verdict."""
        rows = await self.db.all_pages(
            "SELECT template_id, since, user_id, canary_version, live_version "
            "FROM canary_rollouts WHERE namespace = ?",
            (self.namespace,),
        )
        return [
            Rollout(
                r["template_id"],
                utc(r["since"]) or _EPOCH,
                r["user_id"],
                r["canary_version"],
                r["live_version"],
            )
            for r in rows
        ]

    async def batches(self, rollout: Rollout) -> list[uuid.UUID]:
        rows = await self.db.all_pages(
            "SELECT batch_id FROM canary_batches WHERE template_id = ? AND since = ?",
            (rollout.template_id, rollout.since),
        )
        return [r["batch_id"] for r in rows]

    async def judged(self, rollout: Rollout, outcome: Outcome) -> None:
        """Audit the verdict, then take the rollout off the to-do list (a judge dying in
        between judges it again: the audit row is written under the same time)."""
        await self.db.execute(
            "INSERT INTO template_rollouts (template_id, at, decided_at, user_id, canary_version, "
            "live_version, decision, reason, counts) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                rollout.template_id,
                _timeuuid(rollout.since),
                outcome.at,
                rollout.user_id,
                outcome.canary_version,
                outcome.live_version,
                outcome.decision,
                outcome.reason,
                orjson.dumps(
                    {"canary": _counts(outcome.canary), "live": _counts(outcome.live)}
                ).decode(),
            ),
            idempotent=True,
        )
        await self.forget(rollout)

    async def forget(self, rollout: Rollout) -> None:
        """Take a rollout off the to-do list (judged, or replaced by another publish)."""
        await self.db.execute(
            "DELETE FROM canary_rollouts WHERE namespace = ? AND template_id = ? AND since = ?",
            (self.namespace, rollout.template_id, rollout.since),
            idempotent=True,
        )

    async def history(self, template_id: uuid.UUID) -> list[Outcome]:
        """A template's rollout verdicts, newest first."""
        rows = await self.db.all_pages(
            "SELECT decided_at, canary_version, live_version, decision, reason, counts "
            "FROM template_rollouts WHERE template_id = ?",
            (template_id,),
        )
        out: list[Outcome] = []
        for r in rows:
            counts = orjson.loads(r["counts"] or "{}")
            out.append(
                Outcome(
                    at=utc(r["decided_at"]) or _EPOCH,
                    canary_version=r["canary_version"],
                    live_version=r["live_version"],
                    decision=r["decision"],
                    reason=r["reason"],
                    canary=Counts(**counts.get("canary", {})),
                    live=Counts(**counts.get("live", {})),
                )
            )
        return out


def verdict_text(rollout: Rollout, outcome: Outcome) -> str:
    """A verdict as the template keeps it beside the version it made live (pure)."""
    return orjson.dumps(
        {
            "since": rollout.since.isoformat(),
            "at": outcome.at.isoformat(),
            "decision": outcome.decision,
            "reason": outcome.reason,
            "canary": _counts(outcome.canary),
            "live": _counts(outcome.live),
        }
    ).decode()


def verdict_of(text: str | None, rollout: Rollout) -> Outcome | None:
    """The verdict ``text`` keeps, when it is ``rollout``'s (None: another rollout's, or
    none); times compared at Cassandra's millisecond precision (pure)."""
    if not text:
        return None
    kept = orjson.loads(text)
    since = datetime.fromisoformat(kept["since"])
    if _ms(since) != _ms(rollout.since):
        return None
    return Outcome(
        at=datetime.fromisoformat(kept["at"]),
        canary_version=rollout.canary_version,
        live_version=rollout.live_version,
        decision=kept["decision"],
        reason=kept["reason"],
        canary=Counts(**kept["canary"]),
        live=Counts(**kept["live"]),
    )


def _ms(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(microsecond=at.microsecond // 1000 * 1000)


def _counts(counts: Counts) -> dict[str, int]:
    return {
        "sent": counts.sent,
        "provider_failures": counts.provider_failures,
        "hard_bounces": counts.hard_bounces,
        "complaints": counts.complaints,
    }


def _timeuuid(at: datetime) -> uuid.UUID:
    """A time UUID for the rollout's start, the same every time (node and sequence fixed)."""
    made: uuid.UUID = uuid_from_time(at, node=0x010000000000, clock_seq=0)
    return made
