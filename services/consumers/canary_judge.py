"""The canary judge: once a template's canary has run its window, compares what its
recipients came to with what the live version's came to, over the batches that carried the
rollout, and promotes the canary or rolls it back (``shared.templates.canary.decide``).

A verdict is applied to the template by a conditional update (a user's publish in the
meantime wins: the rollout is then simply dropped), audited in ``template_rollouts`` (shown
by ``GET /v1/templates/{id}`` and the dashboard), and a rollback raises an alert. Every
consumer process runs a judge; two judging the same rollout at once may count at different
moments, but only one conditional update applies, and only the judge whose update applied
audits its verdict and alerts. A rollout that cannot be judged (a bug, a row the code does
not expect) is logged and looked at again later; it never stops the others or the loop.

It does not poll every :data:`JUDGE_EVERY`: it looks again when the earliest rollout it read
is due (its window's end, or its recount), and reads the list at least every
:data:`LIST_EVERY` for new ones (:func:`next_wait`).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Final

from shared.core.errors import DependencyUnavailable
from shared.delivery.attempts import Attempts, chunk_line
from shared.delivery.batchstore import Batches
from shared.delivery.precedence import visible
from shared.delivery.recipients import Recipients
from shared.ops.alerts import Alert, Alerter
from shared.templates import template_use
from shared.templates.canary import Counts, Margins, Verdict, decide
from shared.templates.canary_store import (
    Canaries,
    Outcome,
    Rollout,
    verdict_of,
    verdict_text,
)
from shared.templates.templates import StoredTemplates

log = logging.getLogger(__name__)

#: Seconds between two looks at the rollouts waiting for a verdict.
JUDGE_EVERY: Final = 10.0
#: A rollout still short of recipients is counted again after this long (counting reads
#: every recipient of its batches).
RECOUNT_AFTER: Final = timedelta(minutes=1)
#: Seconds at most between two reads of the rollouts' list (for rollouts recorded since):
#: a rollout is first read within this long, or within its window if that is shorter.
LIST_EVERY: Final = 60.0


def next_wait(now: datetime, dues: Sequence[datetime], window: timedelta) -> float:
    """Seconds until the next pass (pure): the earliest time a rollout read is due to be
    looked at (its window's end, or its recount), and at most :data:`LIST_EVERY` (or the
    window, if shorter) so that a new rollout is read before its window ends; never less
    than :data:`JUDGE_EVERY`. A rollout is so judged within JUDGE_EVERY of its window's end,
    as when every pass came JUDGE_EVERY apart, and an idle judge reads the list once a
    minute, not six times (issue 34: a quiet idle)."""
    waits = [min(LIST_EVERY, window.total_seconds())]
    waits += [(due - now).total_seconds() for due in dues]
    return max(JUDGE_EVERY, min(waits))


def _now() -> datetime:
    return datetime.now(UTC)


def tell_nobody(template_id: uuid.UUID) -> None:
    """Nobody in this process keeps templates' rollouts to be told of a verdict."""


@dataclass(frozen=True, slots=True)
class Tally:
    canary: Counts
    live: Counts


def count(events: list[tuple[bool, str | None]]) -> Tally:
    """Each recipient's (in the canary?, latest event) counted per version (pure).

    A recipient counts as sent once a provider took it or refused it (any event but
    ``queued``); a provider-side failure is our ``failed`` or a provider's ``dropped``.
    """
    tallies = {True: [0, 0, 0, 0], False: [0, 0, 0, 0]}
    for canary, event in events:
        if event in (None, "queued"):
            continue
        t = tallies[canary]
        t[0] += 1
        if event in ("failed", "dropped"):
            t[1] += 1
        elif event == "bounced":
            t[2] += 1
        elif event == "complained":
            t[3] += 1
    return Tally(Counts(*tallies[True]), Counts(*tallies[False]))


@dataclass
class CanaryJudge:
    store: Canaries
    templates: StoredTemplates
    batches: Batches
    recipients: Recipients
    margins: Margins
    window: timedelta
    deadline: timedelta
    alerter: Alerter | None = None
    clock: Callable[[], datetime] = _now
    recount_after: timedelta = RECOUNT_AFTER
    concluded: Callable[[uuid.UUID], None] = tell_nobody
    """Told each template whose rollout this judge concluded (this process's senders read
    its rollout again at once: ``services.consumers.template_rollouts``)."""
    attempts: Attempts | None = None
    """Where the version each chunk's calls were made with is read (None: each chunk is
    counted with the version the batch meant for it)."""
    _next: dict[tuple[uuid.UUID, datetime], datetime] = field(default_factory=dict)
    dues: list[datetime] = field(default_factory=list)
    """When each rollout the last pass read and left waiting is due to be looked at again."""

    def next_in(self) -> float:
        """Seconds until the next pass is due (see :func:`next_wait`)."""
        return next_wait(self.clock(), self.dues, self.window)

    async def run(self) -> None:
        while True:
            wait = JUDGE_EVERY
            try:
                await self.pass_once()
                wait = self.next_in()
            except DependencyUnavailable as exc:
                log.warning("canary judge pass stopped: %s", exc)
            except Exception:
                # A bug in one pass must not end the loop: every rollout would wait forever.
                log.exception("canary judge pass failed")
            await asyncio.sleep(wait)

    async def pass_once(self) -> list[Verdict]:
        """Judge every rollout whose window has passed; the verdicts reached (waits too)."""
        now = self.clock()
        verdicts: list[Verdict] = []
        rollouts = await self.store.rollouts()
        waiting = {(r.template_id, r.since) for r in rollouts}
        self._next = {k: v for k, v in self._next.items() if k in waiting}
        self.dues = []
        for rollout in rollouts:
            key = (rollout.template_id, rollout.since)
            due = max(rollout.since + self.window, self._next.get(key, now))
            if now < due:
                self.dues.append(due)
                continue
            try:
                verdict = await self.judge(rollout, now)
            except DependencyUnavailable:
                raise
            except Exception:
                log.exception("template %s: the canary could not be judged", rollout.template_id)
                self._next[key] = now + self.recount_after
                self.dues.append(self._next[key])
                continue
            if verdict.decision == "wait":
                self._next[key] = now + self.recount_after
                self.dues.append(self._next[key])
            verdicts.append(verdict)
        return verdicts

    async def judge(self, rollout: Rollout, now: datetime) -> Verdict:
        template = await self.templates.get(rollout.user_id, rollout.template_id)
        if template is None:
            await self.store.forget(rollout)
            return Verdict("wait", "the template was deleted")
        if template.canary_since != rollout.since:
            applied = verdict_of(template.verdict, rollout)
            if applied is None:
                await self.store.forget(rollout)  # replaced by another publish
                return Verdict("wait", "the rollout was replaced")
            # Concluded by a judge that stopped before auditing it: finish its work.
            await self._record(rollout, applied)
            return Verdict("rollback" if applied.decision == "rollback" else "promote",
                           applied.reason)  # fmt: skip
        tally = await self.tally(rollout)
        verdict = decide(
            tally.canary,
            tally.live,
            self.margins,
            deadline_passed=now >= rollout.since + self.deadline,
        )
        if verdict.decision == "wait":
            return verdict
        live = rollout.canary_version if verdict.decision == "promote" else rollout.live_version
        outcome = Outcome(
            now,
            rollout.canary_version,
            rollout.live_version,
            verdict.decision,
            verdict.reason,
            tally.canary,
            tally.live,
        )
        if not await self.templates.conclude(
            template, rollout.since, live, verdict_text(rollout, outcome)
        ):
            # Another judge concluded it (and audits it), or the user published meanwhile:
            # this verdict did not happen, so it is not audited; the next pass drops it.
            return Verdict("wait", "the rollout was concluded or replaced meanwhile")
        self.concluded(rollout.template_id)
        log.info(
            "template %s: canary v%d %s (%s)",
            rollout.template_id,
            rollout.canary_version,
            "promoted" if verdict.decision == "promote" else "rolled back",
            verdict.reason,
        )
        await self._record(rollout, outcome)
        return verdict

    async def _record(self, rollout: Rollout, outcome: Outcome) -> None:
        """Alert a rollback, audit the verdict and take the rollout off the list, in that
        order: a judge dying part-way leaves the rest to the next pass (an alert may then
        go twice, never not at all)."""
        if outcome.decision == "rollback":
            await self._alert(rollout, outcome.reason)
        await self.store.judged(rollout, outcome)

    async def tally(self, rollout: Rollout) -> Tally:
        """Every recipient of the rollout's batches, counted per version."""
        events: list[tuple[bool, str | None]] = []
        for batch_id in await self.store.batches(rollout):
            header = await self.batches.header(batch_id)
            if header is None:
                continue
            for chunk in range(header.chunk_count):
                meant = template_use.version_for(header.message, chunk)
                sent: dict[int, int | None] = {}
                if self.attempts is not None:
                    line = await self.attempts.line(batch_id, chunk_line(chunk))
                    sent = {a.attempt: a.template_version for a in line}
                rows = await self.recipients.chunk_rows(batch_id, chunk)
                for r in rows:
                    # The version the recipient was sent, as its chunk's calls recorded it
                    # (its own re-sends are few, and not read here).
                    got = template_use.version_sent(r.get("evidence") or (), sent, {}, meant)
                    events.append((got == rollout.canary_version, visible(r).event))
        return count(events)

    async def _alert(self, rollout: Rollout, reason: str) -> None:
        if self.alerter is None:
            return
        text = (
            f"template {rollout.template_id}: canary version {rollout.canary_version} was "
            f"rolled back to version {rollout.live_version}: {reason}"
        )
        try:
            await self.alerter.send(Alert("canary_rollback", str(rollout.template_id), text))
        except DependencyUnavailable as exc:
            log.warning("the rollback alert was not sent: %s", exc)
