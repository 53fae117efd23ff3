"""The soak's verdict: what the clients were told, what is stored and what the providers
accepted, compared recipient by recipient (pure).

Every recipient address of a run is unique, and its local part chooses its fate in the
sandbox (``sandbox.events``): ``bounce…`` bounces at either provider, ``sgdrop…``
is dropped by SendGrid and delivered by Mailgun, anything else is delivered. From the
sandbox's record of accepted requests per address it follows how many deliveries each
recipient got; from the stored rows, what our readers show.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from shared.delivery import precedence

#: Address classes of a run and the state each must end in.
DELIVER, BOUNCE, SG_DROP = "deliver", "bounce", "sgdrop"
EXPECTED_STATE = {DELIVER: "success", BOUNCE: "failed", SG_DROP: "success"}


def address_class(email: str) -> str:
    local = email.split("@", 1)[0]
    if local.startswith("bounce"):
        return BOUNCE
    if local.startswith("sgdrop"):
        return SG_DROP
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


def deliveries(cls: str, accepted: Mapping[str, int]) -> tuple[int, int]:
    """``(deliveries, accepts that deliver nothing)`` of one address, from the sandbox's
    accept counts per provider."""
    sg, mg = accepted.get("sendgrid", 0), accepted.get("mailgun", 0)
    if cls == SG_DROP:
        return mg, sg
    if cls == BOUNCE:
        return 0, sg + mg
    return sg + mg, 0


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
            delivered, other = deliveries(cls, accepted.get(email.lower(), {}))
            sent = other if cls == BOUNCE else delivered
            out["never_sent"] += sent == 0
            out["sent_twice"] += sent > 1 or other > 1
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
