"""The soak's verdict: what the clients were told, what is stored and what the providers
accepted, compared recipient by recipient (pure).

Every recipient address of a run is unique, and its local part chooses its fate in the
sandbox (``sandbox.events``): ``bounce…`` bounces at any provider, ``sgdrop…`` is dropped
by SendGrid and delivered by any other, ``sgmgdrop…`` is dropped by SendGrid and Mailgun
and delivered by any other (the walk down a chain of three), anything else is delivered.
From the sandbox's record of accepted requests per address and provider it follows how many
deliveries each recipient got; from the stored rows, what our readers show.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from shared.delivery import precedence

#: Address classes of a run and the state each must end in.
DELIVER, BOUNCE, SG_DROP, EARLY_DROP = "deliver", "bounce", "sgdrop", "sgmgdrop"
EXPECTED_STATE = {DELIVER: "success", BOUNCE: "failed", SG_DROP: "success", EARLY_DROP: "success"}
#: The sandbox providers (as ``/_control/sends`` names them) whose accepts of an address of
#: each class deliver nothing; None: every provider's.
DROPPED_BY: Final[Mapping[str, frozenset[str] | None]] = {
    DELIVER: frozenset(),
    BOUNCE: None,
    SG_DROP: frozenset({"sendgrid"}),
    EARLY_DROP: frozenset({"sendgrid", "mailgun"}),
}


def address_class(email: str) -> str:
    local = email.split("@", 1)[0]
    for cls in (BOUNCE, EARLY_DROP, SG_DROP):
        if local.startswith(cls):
            return cls
    return DELIVER


@dataclass(slots=True)
class Submission:
    """One client's batch: everything it was told while retrying with one Idempotency-Key."""

    key: str
    emails: tuple[str, ...]
    started: float
    """Wall-clock time of the first request (seconds since the epoch)."""
    batch_ids: set[str] = field(default_factory=set)
    answers: dict[str, int] = field(default_factory=dict)
    """Count of each answer (``202``, ``409``, ``503``, ``transport``, ...)."""
    unexpected: list[str] = field(default_factory=list)
    """Answers a correct server never gives a well-formed request (e.g. 400, 422)."""


@dataclass(frozen=True, slots=True)
class Recipient:
    """One stored recipient, as readers see it, with the time it became final (if it did)."""

    batch_id: str
    email: str
    state: str
    final_at: float | None


def deliveries(cls: str, accepted: Mapping[str, int]) -> tuple[int, int, int]:
    """``(deliveries, accepts that deliver nothing, the most of those at one provider)`` of
    one address, from the sandbox's accept counts per provider (any number of them): an
    address dropped by two providers is accepted once by each on its way, never twice by
    one."""
    dropped = DROPPED_BY[cls]
    wasted = [n for p, n in accepted.items() if dropped is None or p in dropped]
    return sum(accepted.values()) - sum(wasted), sum(wasted), max(wasted, default=0)


def verdict(
    submissions: Sequence[Submission],
    stored_batches: Iterable[str],
    recipients: Iterable[Recipient],
    accepted: Mapping[str, Mapping[str, int]],
    stats: Mapping[str, int],
    *,
    check_violations: int,
) -> dict[str, Any]:
    """The soak's result document; every count but ``accepted_recipients`` must be 0.

    ``accepted`` maps an address to its accept count per provider; ``stats`` is the sum of
    the stored daily stats (``queued``, ``success``, ``failed``) over the run's days.
    """
    known = {b: s for s in submissions for b in s.batch_ids}
    by_batch: dict[str, list[Recipient]] = {}
    for r in recipients:
        by_batch.setdefault(r.batch_id, []).append(r)
    out: dict[str, Any] = dict.fromkeys(
        (
            "accepted_recipients",
            "never_sent",
            "sent_twice",
            "delivered_but_failed",
            "wrong_outcome",
            "not_final",
            "missing_recipients",
            "stats_minus_outcomes",
            "clients_without_batch_id",
            "clients_with_two_batch_ids",
            "unexpected_answers",
            "batches_unknown_to_clients",
            "check_violations",
        ),
        0,
    )
    out["clients_without_batch_id"] = sum(not s.batch_ids for s in submissions)
    out["clients_with_two_batch_ids"] = sum(len(s.batch_ids) > 1 for s in submissions)
    out["unexpected_answers"] = sum(len(s.unexpected) for s in submissions)
    out["batches_unknown_to_clients"] = sum(b not in known for b in set(stored_batches))
    out["check_violations"] = check_violations
    delays: list[float] = []
    counts = {"queued": 0, "success": 0, "failed": 0}
    for batch_id, sub in known.items():
        rows = {r.email: r for r in by_batch.get(batch_id, [])}
        out["accepted_recipients"] += len(sub.emails)
        for email in sub.emails:
            cls = address_class(email)
            delivered, other, at_one = deliveries(cls, accepted.get(email.lower(), {}))
            sent = other if cls == BOUNCE else delivered
            out["never_sent"] += sent == 0
            out["sent_twice"] += sent > 1 or at_one > 1
            row = rows.get(email)
            if row is None:
                out["missing_recipients"] += 1
                continue
            counts["queued"] += 1
            if row.state in ("success", "failed"):
                counts[row.state] += 1
            out["delivered_but_failed"] += row.state == "failed" and delivered > 0
            out["not_final"] += row.state == "queued"
            out["wrong_outcome"] += row.state not in ("queued", EXPECTED_STATE[cls])
            if row.final_at is not None:
                delays.append(max(row.final_at - sub.started, 0.0))
    out["stats_minus_outcomes"] = sum(abs(stats.get(m, 0) - n) for m, n in counts.items())
    out["p50_seconds_to_final"] = _percentile(delays, 0.50)
    out["p99_seconds_to_final"] = _percentile(delays, 0.99)
    out["max_seconds_to_final"] = round(max(delays), 1) if delays else None
    return out


def _percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)], 1)


def final_at(row: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> float | None:
    """When a stored recipient reached the state readers see: the provider event that made
    it final, or our give-up (None while it is not final)."""
    seen = precedence.visible(row)
    if seen.state == "queued":
        return None
    kinds = ("delivered",) if seen.state == "success" else ("bounced", "dropped")
    times = [_epoch(ev["at"]) for ev in events if ev["kind"] in kinds]
    if times:
        return min(times)
    gave_up = row.get("gave_up_at")
    return _epoch(gave_up) if gave_up is not None else None


def _epoch(when: datetime) -> float:
    """Seconds since the epoch of a Cassandra timestamp (UTC, read back without a zone)."""
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def recipient(batch_id: uuid.UUID, row: Mapping[str, Any], events: Sequence[Any]) -> Recipient:
    return Recipient(
        str(batch_id), str(row["email"]), precedence.visible(row).state, final_at(row, events)
    )
