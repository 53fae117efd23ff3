"""Resolving an ambiguous attempt by evidence: one look per check, by the check's holder.

Evidence is what the provider said about the attempt: its webhook events (which carry the
attempt's tag and leave it on recipients' rows, ``shared.delivery.recipients``) and, once its
indexing delay has passed, its query API (SendGrid Email Activity, Mailgun Events). Recipients with
evidence are recorded as accepted; the others go to the next provider as ``failover.decide``
says, but only once the evidence is conclusive (``protocol.resolve``): never a guess, and
never a give-up merely to avoid a possible duplicate.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from services.consumers import protocol
from services.consumers.calls import Decisions
from services.consumers.faults import FaultPoints
from services.consumers.followup import FollowUps
from shared.core.addresses import address_key
from shared.core.errors import ProviderError, TransientProviderError
from shared.delivery.attempts import Attempt, Attempts, find
from shared.delivery.recipients import Recipients
from shared.infra.metrics import DispatchMetrics
from shared.outbound import recipient_events
from shared.outbound.user_hooks import Evidence
from shared.providers.base import LookupQuery, Provider

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class Resolver:
    """Looks for an ambiguous attempt's evidence (``services.consumers.dispatch`` builds it
    once per process)."""

    attempts: Attempts
    providers: Mapping[str, Provider]
    recipients: Recipients
    follow: FollowUps
    decisions: Decisions
    metrics: DispatchMetrics
    fault_points: FaultPoints
    now: Callable[[], datetime]
    settings: protocol.ResolveSettings
    """When to look, and where (the env's, static)."""

    async def resolve(self, job: protocol.Job) -> bool:
        """Look once; conclude or schedule the next look. True when finished."""
        line = await self.attempts.line(job.batch_id, job.line)
        current = find(line, job.attempt)
        if current is None or current.state != "ambiguous" or current.checks != job.check:
            return False
        everyone = await self.follow.rows(job)
        # Answers the provider gave for some recipients are their evidence. The delivery
        # that recorded them applied them, unless it died first: its redelivery applies them
        # (``EnsureCheck``), but a check another delivery numbered may come before it. Apply
        # those still missing (none, as a rule: nothing counts twice).
        if await self.follow.apply_answers(job, current, everyone, waiting_only=True):
            everyone = await self.follow.rows(job)
        rows = self.follow.waiting(job, everyone, job.attempt)
        by_email = {address_key(r["email"]): r for r in rows}
        started = current.started_at
        age = (self.now() - started).total_seconds()
        settings = self.settings.for_provider(current.provider)
        lookup: protocol.Lookup = None
        if by_email and protocol.query_due(age, settings):
            lookup = await self._lookup(job, current, frozenset(by_email))
        verdict = protocol.resolve(frozenset(by_email), age=age, lookup=lookup, settings=settings)
        await self.fault_points("looked", job)
        if isinstance(verdict, protocol.Wait):
            return await self._wait(job, current, verdict.delay)
        if verdict.accepted:
            confirmed = [by_email[e] for e in sorted(verdict.accepted)]
            evidence: Evidence = "provider query" if isinstance(lookup, frozenset) else "webhook"
            await self.follow.tell(
                job.batch_id,
                lambda: recipient_events.attempt_events(
                    current, job.batch_id, confirmed, outcome="confirmed sent", evidence=evidence
                ),
            )
            await self.recipients.accepted(
                job.batch_id,
                self.follow.select(job, everyone, [by_email[e] for e in sorted(verdict.accepted)]),
                provider=current.provider,
                tag=current.tag,
                when=started,
                message_id=current.message_id,
            )
        values = await self._values(job, line, current, verdict, lookup)
        resolved = await self.attempts.transition(
            job.batch_id,
            job.line,
            job.attempt,
            expect={"state": "ambiguous", "checks": current.checks},
            values=values,
        )
        if not resolved:
            return False
        self.metrics.resolutions.labels(current.provider, values["resolution"]).inc()
        await self.fault_points("resolved", job)
        await self.follow.carry_out(job, replace(current, **values))
        return True

    async def _wait(self, job: protocol.Job, current: Attempt, delay: float) -> bool:
        checks = current.checks + 1
        taken = await self.attempts.transition(
            job.batch_id,
            job.line,
            job.attempt,
            expect={"state": "ambiguous", "checks": current.checks},
            values={"checks": checks, "checked_by": job.origin},
        )
        if taken:
            await self.follow.check(job, checks, delay)
        return taken

    async def _values(
        self,
        job: protocol.Job,
        line: list[Attempt],
        current: Attempt,
        verdict: protocol.Conclude,
        lookup: protocol.Lookup,
    ) -> dict[str, Any]:
        now = self.now()
        if not verdict.rest:
            return {
                "state": "resolved",
                "resolution": "accepted",
                "decision": "done",
                "finished_at": now,
            }
        source = (
            recipient_events.NO_QUERY
            if isinstance(lookup, frozenset)
            else recipient_events.NO_WEBHOOK
        )
        error = TransientProviderError(
            current.provider,
            f"no evidence from {source} that it accepted the request for "
            f"{len(verdict.rest)} recipient(s)",  # what follows is the decision's to say
        )
        return {
            "state": "resolved",
            "resolution": "partial" if verdict.accepted else "not_accepted",
            "finished_at": now,
            **await self.decisions.decide(job, line, error),
        }

    async def _lookup(
        self, job: protocol.Job, current: Attempt, emails: frozenset[str]
    ) -> protocol.Lookup:
        provider = self.providers.get(current.provider)
        if provider is None:
            return "unsupported"
        query = LookupQuery(
            batch_id=job.batch_id,
            chunk=job.chunk,
            tag=current.tag,
            since=current.started_at,
            emails=emails,
        )
        try:
            found = await provider.lookup(query)
        except ProviderError as exc:
            log.warning(
                "%s query API failed for %s/%s: %s",
                current.provider,
                job.batch_id,
                current.tag,
                exc,
            )
            self.metrics.lookups.labels(current.provider, "error").inc()
            return "error"
        if found is None:
            self.metrics.lookups.labels(current.provider, "unsupported").inc()
            return "unsupported"
        self.metrics.lookups.labels(current.provider, "answered").inc()
        return found
