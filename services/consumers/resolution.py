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
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from services.consumers import protocol
from shared.core.addresses import address_key
from shared.core.errors import ProviderError, TransientProviderError
from shared.delivery.attempts import Attempt, find
from shared.outbound import recipient_events
from shared.outbound.user_hooks import Evidence
from shared.providers.base import LookupQuery

if TYPE_CHECKING:
    from services.consumers.dispatch import Dispatcher

log = logging.getLogger(__name__)


class Resolver:
    def __init__(self, dispatcher: Dispatcher) -> None:
        self.d = dispatcher

    @property
    def settings(self) -> protocol.ResolveSettings:
        s = self.d.settings
        return protocol.ResolveSettings(
            interval=s.resolve_interval, query_after=s.query_after, webhook_window=s.webhook_window
        )

    async def resolve(self, job: protocol.Job) -> bool:
        """Look once; conclude or schedule the next look. True when finished."""
        d = self.d
        line = await d.attempts.line(job.batch_id, job.line)
        current = find(line, job.attempt)
        if current is None or current.state != "ambiguous" or current.checks != job.check:
            return False
        everyone = await d.follow.rows(job)
        rows = d.follow.waiting(job, everyone, job.attempt)
        by_email = {address_key(r["email"]): r for r in rows}
        started = current.calling_at or current.created_at
        age = (d.now() - started).total_seconds()
        lookup: protocol.Lookup = None
        if by_email and protocol.query_due(age, self.settings):
            lookup = await self._lookup(job, current, frozenset(by_email))
        verdict = protocol.resolve(
            frozenset(by_email), age=age, lookup=lookup, settings=self.settings
        )
        await d.fault_points("looked", job)
        if isinstance(verdict, protocol.Wait):
            return await self._wait(job, current, verdict.delay)
        if verdict.accepted:
            confirmed = [by_email[e] for e in sorted(verdict.accepted)]
            evidence: Evidence = "provider query" if isinstance(lookup, frozenset) else "webhook"
            await d.follow.tell(
                job.batch_id,
                lambda: recipient_events.attempt_events(
                    current, job.batch_id, confirmed, outcome="confirmed sent", evidence=evidence
                ),
            )
            await d.recipients.accepted(
                job.batch_id,
                d.follow.select(job, everyone, [by_email[e] for e in sorted(verdict.accepted)]),
                provider=current.provider,
                tag=current.tag,
                when=started,
                message_id=current.message_id,
            )
        values = await self._values(job, line, current, verdict, lookup)
        resolved = await d.attempts.transition(
            job.batch_id,
            job.line,
            job.attempt,
            expect={"state": "ambiguous", "checks": current.checks},
            values=values,
        )
        if not resolved:
            return False
        d.metrics.resolutions.labels(current.provider, values["resolution"]).inc()
        await d.fault_points("resolved", job)
        await d.follow.carry_out(job, replace(current, **values))
        return True

    async def _wait(self, job: protocol.Job, current: Attempt, delay: float) -> bool:
        checks = current.checks + 1
        taken = await self.d.attempts.transition(
            job.batch_id,
            job.line,
            job.attempt,
            expect={"state": "ambiguous", "checks": current.checks},
            values={"checks": checks, "checked_by": job.origin},
        )
        if taken:
            await self.d.follow.check(job, checks, delay)
        return taken

    async def _values(
        self,
        job: protocol.Job,
        line: list[Attempt],
        current: Attempt,
        verdict: protocol.Conclude,
        lookup: protocol.Lookup,
    ) -> dict[str, Any]:
        now = self.d.now()
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
            **await self.d.caller.decision(job, line, error),
        }

    async def _lookup(
        self, job: protocol.Job, current: Attempt, emails: frozenset[str]
    ) -> protocol.Lookup:
        provider = self.d.providers.get(current.provider)
        if provider is None:
            return "unsupported"
        query = LookupQuery(
            batch_id=job.batch_id,
            chunk=job.chunk,
            tag=current.tag,
            since=current.calling_at or current.created_at,
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
            self.d.metrics.lookups.labels(current.provider, "error").inc()
            return "error"
        if found is None:
            self.d.metrics.lookups.labels(current.provider, "unsupported").inc()
            return "unsupported"
        self.d.metrics.lookups.labels(current.provider, "answered").inc()
        return found
