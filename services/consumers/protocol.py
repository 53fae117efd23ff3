"""The attempt protocol as pure decisions: what a delivery of a dispatch job does next.

A job names one attempt of one line (``shared.delivery.attempts``): attempt ``n`` of a chunk
(``<ns>.<batch_uuid>[.retry.<n>]``) or of one recipient's re-sends
(``log.<ns>.<log_uuid>[.retry.<n>]``). Given the line as stored, :func:`next_step` says what
to do; the consumer (``services.consumers.dispatch``) does it with one conditional write,
reads the line again if that write did not apply, and asks again, until the answer is to ack.

Every outcome is acted on by exactly one process because every state change is a compare-and
-set on the attempt, and the decision that follows an outcome is stored with it: a process
that dies after the change leaves the decision to whoever gets the job next, who carries it
out identically (:class:`FollowUp`). Checks (of a call's lease, of an ambiguous attempt's
evidence) are delayed copies of the job numbered by ``checks``; only the holder of the
current number continues the chain, so duplicates die out instead of multiplying.

:func:`resolve` decides an ambiguous attempt (the provider may or may not have accepted it)
from evidence only: the provider's webhooks (tags on recipient rows) and its query API.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from shared.core.lanes import Priority
from shared.delivery.attempts import Attempt, find
from shared.delivery.precedence import queued, visible
from shared.delivery.recipients import CHUNK, OWN, accepted_by_line
from shared.infra.db import Row


@dataclass(frozen=True, slots=True)
class Job:
    """One delivery's job, decoded from its routing key and body."""

    batch_id: uuid.UUID
    line: str
    chunk: int
    log_id: uuid.UUID | None
    attempt: int
    provider: str
    check: int | None = None
    """Set on a delayed check of the attempt: the check's sequence number."""
    lane: Priority = "transactional"
    """The lane a chunk's job travels in; its retries and checks stay in it."""
    origin: str | None = None
    """The message id of this delivery's message (the same on each redelivery of it;
    copies published apart have ids of their own)."""
    handed: frozenset[str] = frozenset()
    """The tags of the line's attempts that were handed over to another (the causes of its
    planned attempts, as read with the line): their acceptance is what failed, whether or not
    the recipient's row marks them superseded yet (the hand-off marks it after publishing)."""

    @property
    def own_line(self) -> bool:
        """Whether this is a recipient's re-send line (as opposed to a chunk's line)."""
        return self.log_id is not None


@dataclass(frozen=True, slots=True)
class Stray:
    """The job matches no attempt that should run (a leftover duplicate): ack it."""

    why: str


@dataclass(frozen=True, slots=True)
class Done:
    """Nothing left for this delivery to do: ack it."""


@dataclass(frozen=True, slots=True)
class Claim:
    """Create the attempt as ``calling`` by this delivery and call: one conditional write
    claims the attempt and starts its call (a separate claim would cost an LWT per chunk
    and protect nothing, since the call's lease starts before its preparation anyway)."""


@dataclass(frozen=True, slots=True)
class StartCall:
    """Move the attempt from ``state`` (``planned`` by a hand-off, or ``claimed`` by an older
    version, held by ``owner``) to ``calling`` by this delivery."""

    state: str
    owner: uuid.UUID | None


@dataclass(frozen=True, slots=True)
class Call:
    """This delivery holds ``calling`` and has not called yet: call the provider."""


@dataclass(frozen=True, slots=True)
class Record:
    """This delivery called and holds the answer: record it (its write had failed)."""


@dataclass(frozen=True, slots=True)
class Expire:
    """The call of ``owner`` outlived its lease (or its outcome is unknown): mark the attempt
    ``ambiguous`` and start resolving it."""

    owner: uuid.UUID | None
    checks: int


@dataclass(frozen=True, slots=True)
class WaitLease:
    """Another delivery is calling: check again when its lease ends (``checks`` → +1)."""

    checks: int
    at: datetime


@dataclass(frozen=True, slots=True)
class Resolve:
    """This delivery holds the ambiguous attempt's current check: look for evidence."""


@dataclass(frozen=True, slots=True)
class EnsureCheck:
    """An ambiguous attempt found by a redelivery: make sure its current check is queued."""

    checks: int


@dataclass(frozen=True, slots=True)
class FollowUp:
    """Carry out the recorded outcome and decision of a settled attempt (idempotent)."""

    attempt: Attempt


Step = (
    Stray
    | Done
    | Claim
    | StartCall
    | Call
    | Record
    | Expire
    | WaitLease
    | Resolve
    | EnsureCheck
    | FollowUp
)


def next_step(
    job: Job,
    line: Sequence[Attempt],
    *,
    me: uuid.UUID,
    called: bool,
    now: datetime,
    lease: timedelta,
) -> Step:
    """What this delivery does next with ``job``, given the line as stored.

    Args:
        job: the job of this delivery.
        line: every attempt of the job's line, as read.
        me: this delivery's owner id (stable across its retries).
        called: whether this delivery already called the provider for this attempt.
        now: the current time.
        lease: how long a call may take before others presume its caller dead.
    """
    current = find(line, job.attempt)
    later = any(a.attempt > job.attempt for a in line)
    if current is None:
        return _unclaimed(job, line, later)
    if current.provider != job.provider:
        return Stray(f"attempt {job.attempt} belongs to {current.provider}")
    if later:
        return Done()  # the line moved on: this attempt's follow-up was carried out
    if current.state in ("planned", "claimed"):
        return StartCall(current.state, current.owner)
    if current.state == "calling":
        return _calling(job, current, me=me, called=called, now=now, lease=lease)
    if current.state == "ambiguous":
        if job.check == current.checks:
            return Resolve()
        if job.check is None or numbered_by(job, current):
            return EnsureCheck(current.checks)
        return Done()
    return FollowUp(current)


def numbered_by(job: Job, current: Attempt) -> bool:
    """Whether this delivery's message numbered the attempt's current check (so it, and no
    other copy, must see that check published)."""
    return job.origin is not None and current.checked_by == job.origin


def _unclaimed(job: Job, line: Sequence[Attempt], later: bool) -> Step:
    if job.check is not None or later:
        return Stray(f"attempt {job.attempt} was never claimed")
    if job.attempt == 0:
        # A chunk's first attempt is claimed by whoever gets its job; a re-send line starts
        # with an attempt a hand-off planned.
        return Stray("re-sends start as planned attempts") if job.own_line else Claim()
    # The decision that leads here is the latest attempt before this one, which is not always
    # ``attempt - 1``: failover skips attempt numbers past providers that refused the chunk
    # for good or are excluded from a re-send (their turns count against max_attempts).
    previous = max(
        (a for a in line if a.attempt < job.attempt), key=lambda a: a.attempt, default=None
    )
    if (
        previous is None
        or previous.decision != "retry"
        or previous.next_attempt != job.attempt
        or previous.next_provider != job.provider
    ):
        return Stray(f"no decision leads to attempt {job.attempt} via {job.provider}")
    return Claim()


def _calling(
    job: Job, current: Attempt, *, me: uuid.UUID, called: bool, now: datetime, lease: timedelta
) -> Step:
    if current.owner == me:
        # Our own call: either our LWT to ``calling`` applied though it reported a timeout
        # (call now), or we called and recording the answer failed (record it now).
        return Record() if called else Call()
    ends = current.started_at + lease
    queued = job.check is None and current.checks > 0  # a check of this call is queued
    stale = job.check is not None and job.check != current.checks
    if queued or stale:
        # Unless this delivery numbered that check: its publish may never have been confirmed.
        return EnsureCheck(current.checks) if numbered_by(job, current) else Done()
    if now >= ends:
        return Expire(current.owner, current.checks)
    return WaitLease(current.checks, ends)


def deferral_expired(row: Row, cause: str) -> bool:
    """Whether a recipient whose deferral deadline passed must be handed over: still queued,
    its latest event still the deferral, and the deferred attempt (``cause``) not handed over
    already (by an earlier check, or by a provider-side failure)."""
    return (
        visible(row).state == "queued"
        and row.get("event") == "deferred"
        and cause not in (row.get("superseded") or ())
    )


def pending(
    rows: Sequence[Row], *, own_line: bool, tag: str, handed: frozenset[str] = frozenset()
) -> list[Row]:
    """The recipients an attempt (``tag``) is for and that no provider has accepted yet.

    A chunk's attempt is for its recipients that no attempt of the chunk got accepted (a
    recipient the chunk's provider accepted and then dropped is re-sent by its own line). A
    re-send attempt is for its one recipient, unless an attempt of the recipient's line is
    known accepted and was not handed over since (``superseded``): evidence of an earlier
    re-send that arrived late (after that attempt was resolved as not accepted) counts, so
    the recipient is not sent twice. Recipients already final (an outcome, or given up) are
    nobody's.
    """
    out = []
    for row in rows:
        if not queued(row):
            continue
        accepted = (
            _accepted_on_own_line(row, tag, handed) if own_line else accepted_by_line(row, CHUNK)
        )
        if not accepted:
            out.append(row)
    return out


def _accepted_on_own_line(row: Row, tag: str, handed: frozenset[str]) -> bool:
    """Whether attempt ``tag``, or another of its line not handed over since (``handed``, or
    marked superseded on the row), was accepted."""
    handed_over = handed.union(row.get("superseded") or ())
    return any(
        t == tag or (t.startswith(OWN + ".") and t not in handed_over)
        for t in row.get("evidence") or ()
    )


@dataclass(frozen=True, slots=True)
class ResolveSettings:
    """How long to look for evidence of an ambiguous attempt, and where."""

    interval: float
    """Seconds between looks."""
    query_after: float
    """Age (seconds since the call) after which the provider's query API is asked and its
    answer trusted: longer than the provider's indexing delay."""
    webhook_window: float
    """Age after which, without a query API (or with one that keeps failing), the absence of
    any webhook is taken to mean the provider never accepted the request."""
    windows: Mapping[str, float] = field(default_factory=dict)
    """A provider's own ``webhook_window``, by code: a provider that never sends events (an
    SMTP relay, ``providers.smtp_unknown_wait``) has nothing to wait an hour for."""

    def for_provider(self, code: str) -> ResolveSettings:
        """These settings for an attempt of provider ``code``."""
        window = self.windows.get(code)
        if window is None:
            return self
        # Its query API (if any) is asked by the end of its window at the latest.
        return replace(self, webhook_window=window, query_after=min(self.query_after, window))


@dataclass(frozen=True, slots=True)
class Wait:
    """Look again in ``delay`` seconds."""

    delay: float


@dataclass(frozen=True, slots=True)
class Conclude:
    """The provider accepted the request for ``accepted`` (addresses), not for ``rest``."""

    accepted: frozenset[str]
    rest: frozenset[str]


#: What the provider's query API said: the addresses it has for the attempt, "unsupported"
#: (no query API), "error" (it failed this time), or None (not asked yet).
Lookup = frozenset[str] | str | None


def query_due(age: float, settings: ResolveSettings) -> bool:
    """Whether it is time to ask the provider's query API."""
    return age >= settings.query_after


def resolve(
    pending: frozenset[str], *, age: float, lookup: Lookup, settings: ResolveSettings
) -> Wait | Conclude:
    """Decide an ambiguous attempt.

    Args:
        pending: addresses the attempt may have sent to that have no evidence yet (webhook
            evidence already settled the others).
        age: seconds since the call started.
        lookup: the provider's query API answer (see :data:`Lookup`).
        settings: the windows.
    """
    if not pending:
        return Conclude(frozenset(), frozenset())
    if isinstance(lookup, frozenset) and query_due(age, settings):
        found = pending & lookup
        return Conclude(found, pending - found)
    if age >= settings.webhook_window and lookup in ("unsupported", "error"):
        return Conclude(frozenset(), pending)
    # Next look: at the usual interval, or sooner when a window closes before that.
    horizon = settings.query_after if lookup is None else settings.webhook_window
    left = horizon - age
    return Wait(max(1.0, min(settings.interval, left)) if left > 0 else settings.interval)
