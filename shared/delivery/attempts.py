"""Provider attempts: one record per provider call, in lines, changed only by lightweight
transactions.

A *line* is the sequence of attempts to get something accepted by a provider: a chunk of a
batch (``c<chunk>``), or one recipient re-sent after a provider-side failure
(``r<log_id>``). Attempt ``n`` of a line is the ``.retry.<n>`` of its routing key.

States (see ``services.consumers.protocol`` for who moves them)::

    planned ──▶ calling                     (a hand-off made it; a consumer takes it)
    (none)  ──▶ calling                     (a consumer claims it and starts its call)
    claimed ──▶ calling                     (written only by versions before 2026-11-29)
    calling ──▶ accepted | rejected | ambiguous
    ambiguous ─▶ resolved                   (by evidence: webhooks, the provider's query API)

``rejected`` and ``resolved`` carry the decision taken with them (``retry`` with the next
provider, attempt and delay; ``give_up``; ``done``), written in the same conditional update,
so a crash after it only means the decision is carried out again, identically. The write
that moves an attempt to ``calling`` also records the template version its call is made with
(``template_version``; ``shared.templates.template_use.version_at_send``). Every write is
an LWT (never mixed with plain writes on these rows); one whose outcome is unknown (a
timeout) is resolved by reading at SERIAL consistency.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from shared.infra.db import Database, Row, utc

#: States in which an attempt's provider call is over and its outcome known or resolved.
SETTLED = frozenset({"accepted", "rejected", "resolved"})

COLUMNS = (
    "attempt, chunk, provider, state, owner, cause, reason, created_at, calling_at, answers, "
    "finished_at, status_code, message_id, error, checks, checked_by, resolution, decision, "
    "verdict, next_provider, next_attempt, next_delay, template_version"
)


def chunk_line(chunk: int) -> str:
    """The line of a chunk's own attempts."""
    return f"c{chunk}"


def recipient_line(log_id: uuid.UUID) -> str:
    """The line of one recipient's re-sends."""
    return f"r{log_id}"


def tag(line: str, attempt: int) -> str:
    """How a recipient names an attempt that concerned it: ``c.<n>`` or ``r.<n>``.

    A recipient belongs to one chunk and has one re-send line, so the kind of line and the
    attempt number identify the attempt; the tag travels to the provider (SendGrid
    ``custom_args``, Mailgun ``v:`` variables) and comes back in its events.
    """
    return f"{line[0]}.{attempt}"


@dataclass(frozen=True, slots=True)
class Attempt:
    line: str
    attempt: int
    chunk: int
    provider: str
    state: str
    owner: uuid.UUID | None
    cause: str | None
    """Hand-offs: the attempt (tag) whose provider-side failure this attempt replaces."""
    reason: str | None
    """Why this attempt exists: the failure of the previous one, or the hand-off's reason."""
    created_at: datetime
    calling_at: datetime | None
    finished_at: datetime | None
    status_code: int | None
    message_id: str | None
    answers: str | None = field(default=None, kw_only=True)
    """The provider's answers recipient by recipient, when it gave them, as stored with the
    answer (``shared.delivery.recipient_answers``)."""
    error: str | None
    """``<kind>|<message>`` of a failed call (kind: transient, misconfigured, permanent)."""
    checks: int
    """Sequence number of the check (lease or resolution) this attempt waits for."""
    checked_by: str | None
    """The message id of the delivery that numbered the current check (so its redelivery,
    and no other copy, publishes that check again if its confirm never came)."""
    resolution: str | None
    decision: str | None
    """``retry``, ``give_up`` or ``done``, written with ``rejected`` or ``resolved``."""
    verdict: str | None
    """The decision in words (shown to users when recipients end ``failed``)."""
    next_provider: str | None
    next_attempt: int | None
    next_delay: int | None
    template_version: int | None = None
    """The template version the call was made with (``shared.templates.template_use``),
    recorded as it moved to ``calling``; None: not from a template, or recorded before
    versions were."""

    @property
    def tag(self) -> str:
        return tag(self.line, self.attempt)

    @property
    def started_at(self) -> datetime:
        """When the attempt began: its call (``calling_at``, written once), else its creation.
        Unlike ``finished_at``, which a resolution rewrites and which comes after the provider
        has already stamped what it did with the call, nothing the call led to precedes it."""
        return self.calling_at or self.created_at

    @property
    def settled(self) -> bool:
        return self.state in SETTLED


def from_row(line: str, r: Row) -> Attempt:
    """An attempt from its ``send_attempts`` row."""
    return Attempt(
        line=line,
        attempt=r["attempt"],
        chunk=r["chunk"] if r["chunk"] is not None else -1,
        provider=r["provider"],
        state=r["state"],
        owner=r["owner"],
        cause=r["cause"],
        reason=r["reason"],
        created_at=utc(r["created_at"]) or datetime.now(UTC),
        calling_at=utc(r["calling_at"]),
        finished_at=utc(r["finished_at"]),
        status_code=r["status_code"],
        message_id=r["message_id"],
        answers=r.get("answers"),
        error=r["error"],
        checks=r["checks"] or 0,
        checked_by=r.get("checked_by"),
        resolution=r["resolution"],
        decision=r["decision"],
        verdict=r["verdict"],
        next_provider=r["next_provider"],
        next_attempt=r["next_attempt"],
        next_delay=r["next_delay"],
        template_version=r.get("template_version"),
    )


class Attempts(Protocol):
    """What callers use of :class:`AttemptStore` (the store, or its in-memory twin)."""

    async def line(
        self, batch_id: uuid.UUID, line: str, *, serial: bool = False
    ) -> list[Attempt]: ...

    async def lines(self, batch_id: uuid.UUID) -> dict[str, list[Attempt]]: ...

    async def create(
        self,
        batch_id: uuid.UUID,
        line: str,
        attempt: int,
        *,
        chunk: int,
        provider: str,
        state: str,
        owner: uuid.UUID | None = None,
        cause: str | None = None,
        reason: str | None = None,
        calling_at: datetime | None = None,
        template_version: int | None = None,
    ) -> bool: ...

    async def transition(
        self,
        batch_id: uuid.UUID,
        line: str,
        attempt: int,
        *,
        expect: Mapping[str, Any],
        values: Mapping[str, Any],
    ) -> bool: ...


class AttemptStore:
    """Reads and conditional writes of ``send_attempts``; the only writer of that table."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def line(self, batch_id: uuid.UUID, line: str, *, serial: bool = False) -> list[Attempt]:
        """Every attempt of a line, oldest first; ``serial`` completes LWTs in progress."""
        rows = await self.db.rows(
            f"SELECT {COLUMNS} FROM send_attempts WHERE batch_id = ? AND line = ?",  # noqa: S608
            (batch_id, line),
            serial=serial,
        )
        return [from_row(line, r) for r in rows]

    async def lines(self, batch_id: uuid.UUID) -> dict[str, list[Attempt]]:
        """Every line of a batch (for views and checks)."""
        rows = await self.db.all_pages(
            f"SELECT line, {COLUMNS} FROM send_attempts WHERE batch_id = ?",  # noqa: S608
            (batch_id,),
        )
        out: dict[str, list[Attempt]] = {}
        for r in rows:
            out.setdefault(r["line"], []).append(from_row(r["line"], r))
        return out

    async def create(
        self,
        batch_id: uuid.UUID,
        line: str,
        attempt: int,
        *,
        chunk: int,
        provider: str,
        state: str,
        owner: uuid.UUID | None = None,
        cause: str | None = None,
        reason: str | None = None,
        calling_at: datetime | None = None,
        template_version: int | None = None,
    ) -> bool:
        """Insert attempt ``attempt`` in ``state`` (``calling``, with ``owner``,
        ``calling_at`` and the ``template_version`` its call is made with, or ``planned``)
        unless it exists.

        Returns whether this call created it. Raises DependencyUnavailable when the outcome
        is unknown; the caller re-reads the line at SERIAL consistency.
        """
        # No version, no cell: a null written is a tombstone.
        extra = ", template_version" if template_version is not None else ""
        row = await self.db.one(
            "INSERT INTO send_attempts (batch_id, line, attempt, chunk, provider, state, owner, "  # noqa: S608 - column names are ours
            f"cause, reason, created_at, calling_at, checks{extra}) "
            f"VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0{', ?' if extra else ''}) IF NOT EXISTS",
            (
                batch_id,
                line,
                attempt,
                chunk,
                provider,
                state,
                owner,
                cause,
                reason,
                datetime.now(UTC),
                calling_at,
                *((template_version,) if extra else ()),
            ),
        )
        return bool(row and row["[applied]"])

    async def transition(
        self,
        batch_id: uuid.UUID,
        line: str,
        attempt: int,
        *,
        expect: Mapping[str, Any],
        values: Mapping[str, Any],
    ) -> bool:
        """``UPDATE ... SET values IF expect`` on one attempt; whether it applied.

        Raises DependencyUnavailable when the outcome is unknown; the caller re-reads the
        line at SERIAL consistency and acts on what it finds.
        """
        sets = ", ".join(f"{column} = ?" for column in values)
        conditions = " AND ".join(f"{column} = ?" for column in expect)
        row = await self.db.one(
            f"UPDATE send_attempts SET {sets} "  # noqa: S608 - column names are ours
            f"WHERE batch_id = ? AND line = ? AND attempt = ? IF {conditions}",
            (*values.values(), batch_id, line, attempt, *expect.values()),
        )
        return bool(row and row["[applied]"])


def find(line: Sequence[Attempt], attempt: int) -> Attempt | None:
    """Attempt ``attempt`` of a line, if recorded."""
    return next((a for a in line if a.attempt == attempt), None)
