"""A contact list's CSV import, decided (pure): what becomes of each slice of rows, the
import's progress and report, and when an import whose process died reads as failed.

A slice is read from the file (:func:`services.api.contacts_csv.scan`), then sorted here against
what the stores answered about its addresses: suppressed for the user (any mail) and
unsubscribed from this list are not added but reported; an address already in the list is
updated (its fields replaced) and reported; a new address is added while the list has room.
The report keeps the first :data:`MAX_PROBLEMS` problems with their rows, and counts all.

An import is written back after every slice with a heartbeat; one in ``queued`` or
``running`` whose heartbeat is older than the stale limit lost its process (a restart, a
crash) and is shown as ``failed`` with that reason (:func:`shown`).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timedelta
from typing import Final, Literal

from services.api.contacts_csv import Contact, Rejected
from shared.core.addresses import address_key

#: Problems kept with their rows in an import's report (all are counted).
MAX_PROBLEMS: Final = 100
#: Why a stale import failed.
INTERRUPTED: Final = "interrupted: the import stopped making progress (the API restarted?)"

State = Literal["queued", "running", "done", "failed"]
ProblemKind = Literal[
    "invalid", "duplicate", "existing", "suppressed", "unsubscribed", "over_limit"
]


@dataclass(frozen=True, slots=True)
class Problem:
    row: int
    email: str
    """The cell as read (invalid ones too)."""
    kind: ProblemKind
    reason: str


@dataclass(frozen=True, slots=True)
class Progress:
    rows_read: int = 0
    added: int = 0
    updated: int = 0
    invalid: int = 0
    duplicates: int = 0
    suppressed: int = 0
    unsubscribed: int = 0
    over_limit: int = 0

    def __add__(self, other: Progress) -> Progress:
        return Progress(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))


@dataclass(frozen=True, slots=True)
class ImportJob:
    list_id: uuid.UUID
    import_id: uuid.UUID
    user_id: uuid.UUID
    state: State
    created_at: datetime
    heartbeat: datetime
    progress: Progress = Progress()
    problems: tuple[Problem, ...] = ()
    reason: str | None = None
    finished_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Sorted:
    """One slice, decided."""

    write: list[Contact] = field(default_factory=list)
    """Added or updated."""
    progress: Progress = Progress()
    problems: list[Problem] = field(default_factory=list)


def sort_slice(
    items: Sequence[Contact | Rejected],
    *,
    suppressed: Mapping[str, str],
    unsubscribed: Mapping[str, str],
    existing: set[str],
    room: int,
) -> Sorted:
    """What becomes of ``items`` (keys of the mappings and set: :func:`address_key`); at most
    ``room`` new addresses are added (the list's limit), the rest are ``over_limit``."""
    out = Sorted()
    counts = dict.fromkeys((f.name for f in fields(Progress)), 0)
    counts["rows_read"] = len(items)
    for item in items:
        problem = _problem(item, suppressed, unsubscribed, existing, room - counts["added"])
        if problem is None:
            counts["added"] += 1
        else:
            counts[_COUNTED[problem.kind]] += 1
            out.problems.append(problem)
        if isinstance(item, Contact) and (problem is None or problem.kind == "existing"):
            out.write.append(item)
    return replace(out, progress=Progress(**counts))


_COUNTED: Final[Mapping[ProblemKind, str]] = {
    "invalid": "invalid",
    "duplicate": "duplicates",
    "existing": "updated",
    "suppressed": "suppressed",
    "unsubscribed": "unsubscribed",
    "over_limit": "over_limit",
}


def _problem(
    item: Contact | Rejected,
    suppressed: Mapping[str, str],
    unsubscribed: Mapping[str, str],
    existing: set[str],
    room: int,
) -> Problem | None:
    if isinstance(item, Rejected):
        return Problem(item.row, item.value, item.kind, item.reason)
    key = address_key(item.email)
    if key in suppressed:
        return Problem(item.row, item.email, "suppressed", f"suppressed: {suppressed[key]}")
    if key in unsubscribed:
        return Problem(item.row, item.email, "unsubscribed", "unsubscribed from this list")
    if key in existing:
        return Problem(item.row, item.email, "existing", "already in the list: updated")
    if room <= 0:
        return Problem(item.row, item.email, "over_limit", "the list is full")
    return None


def advance(job: ImportJob, done: Sorted, at: datetime) -> ImportJob:
    """``job`` after one more slice: ``running``, counts added, problems kept up to the
    limit, heartbeat ``at``."""
    room = MAX_PROBLEMS - len(job.problems)
    return replace(
        job,
        state="running",
        heartbeat=at,
        progress=job.progress + done.progress,
        problems=job.problems + tuple(done.problems[: max(room, 0)]),
    )


def finish(job: ImportJob, at: datetime, reason: str | None = None) -> ImportJob:
    """``done``, or ``failed`` with ``reason``."""
    state: State = "failed" if reason else "done"
    return replace(job, state=state, reason=reason, heartbeat=at, finished_at=at)


def live(job: ImportJob, now: datetime, stale_after: timedelta) -> bool:
    """Whether ``job`` is still in progress in a living process."""
    return job.state in ("queued", "running") and now - job.heartbeat <= stale_after


def shown(job: ImportJob, now: datetime, stale_after: timedelta) -> ImportJob:
    """``job`` as it is to be shown: a stale one as failed, interrupted."""
    if job.state in ("queued", "running") and not live(job, now, stale_after):
        return replace(job, state="failed", reason=INTERRUPTED)
    return job
