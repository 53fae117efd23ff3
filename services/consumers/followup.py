"""Carrying out a settled attempt's outcome and decision, and queueing delayed checks.

A chunk's follow-up jobs and checks keep the lane its job came in (``bulk.`` keys stay bulk).
Everything here is idempotent, because it runs again whenever the process that first ran it
died before its delivery was acked: recipients' rows carry fixed timestamps, a published
follow-up job is absorbed by the next attempt's claim, a give-up is the same write again.
"""

from __future__ import annotations

import logging
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from services.consumers import protocol
from services.consumers.faults import FaultPoints
from shared.core.addresses import address_key
from shared.core.models import ChunkJob, LogJob
from shared.delivery import recipient_answers
from shared.delivery.attempts import Attempt, tag
from shared.delivery.batchstore import Batches, BatchHeader
from shared.delivery.handoff import excluded_providers
from shared.delivery.recipients import Recipients, Selection
from shared.infra.broker import Broker
from shared.infra.db import Row
from shared.infra.metrics import DispatchMetrics
from shared.infra.settle import Poison
from shared.infra.topology import dispatch_key, log_key
from shared.ingest.ingest import Ingest
from shared.outbound import recipient_events
from shared.outbound.user_hooks import HookEvent, UserHooks

log = logging.getLogger(__name__)

#: Batch headers remembered per process (a header never changes once written, except its
#: status, which nothing here reads).
HEADER_CACHE = 1024
#: Bytes of message content (bodies and files) those headers may hold together: a batch's
#: files alone may be 9 MiB of base64, so 1,024 of them would be gigabytes. The newest header
#: is kept whatever its size.
HEADER_CACHE_BYTES = 64 * 1024 * 1024


def content_bytes(header: BatchHeader) -> int:
    """What a cached header holds of its message's content: bodies and files (base64)."""
    message = header.message
    size = len(message.html or "") + len(message.text or "")
    return size + sum(len(a.content) for a in message.attachments)


@dataclass(kw_only=True)
class FollowUps:
    """A process's follow-ups (built once per process: its batch headers are cached)."""

    batches: Batches
    recipients: Recipients
    broker: Broker
    metrics: DispatchMetrics
    fault_points: FaultPoints
    user_hooks: UserHooks | None
    """Where each attempt's events go for the users' webhooks (None: nowhere)."""
    ingest: Ingest | None = None
    """Where a provider's answers recipient by recipient are applied, as its webhook events
    are (:meth:`apply_answers`; None: a process whose providers never give them)."""
    _headers: OrderedDict[uuid.UUID, BatchHeader] = field(
        default_factory=OrderedDict, init=False, repr=False
    )
    _header_bytes: int = field(default=0, init=False, repr=False)

    async def header(self, batch_id: uuid.UUID) -> BatchHeader:
        cached = self._headers.get(batch_id)
        if cached is not None:
            self._headers.move_to_end(batch_id)
            return cached
        header = await self.batches.header(batch_id)
        if header is None:
            raise Poison(f"batch {batch_id} does not exist")
        previous = self._headers.pop(batch_id, None)  # read meanwhile by another job
        if previous is not None:
            self._header_bytes -= content_bytes(previous)
        self._headers[batch_id] = header
        self._header_bytes += content_bytes(header)
        while len(self._headers) > 1 and (
            len(self._headers) > HEADER_CACHE or self._header_bytes > HEADER_CACHE_BYTES
        ):
            _, evicted = self._headers.popitem(last=False)
            self._header_bytes -= content_bytes(evicted)
        return header

    async def rows(self, job: protocol.Job) -> list[Row]:
        """The recipient rows a job's line is about: its chunk's, or its one recipient's."""
        if job.log_id is None:
            return await self.recipients.chunk_rows(job.batch_id, job.chunk)
        row = await self.recipients.one(job.batch_id, job.chunk, job.log_id, addresses=True)
        if row is None:
            raise Poison(f"no recipient {job.log_id} in batch {job.batch_id}")
        return [row]

    async def pending(self, job: protocol.Job, attempt: int) -> Selection:
        """The recipients attempt ``attempt`` of the job's line is for and no provider has
        accepted yet, as a write selects them."""
        rows = await self.rows(job)
        return self.select(job, rows, self.waiting(job, rows, attempt))

    @staticmethod
    def waiting(job: protocol.Job, rows: list[Row], attempt: int) -> list[Row]:
        return protocol.pending(
            rows, own_line=job.own_line, tag=tag(job.line, attempt), handed=job.handed
        )

    @staticmethod
    def select(job: protocol.Job, everyone: list[Row], chosen: list[Row]) -> Selection:
        """``chosen`` of the line's recipients, for a write: a re-send line's one recipient
        always by its own row, a chunk's by the chunk's row when it is all of them."""
        if job.own_line:
            return Selection(job.chunk, tuple(r["log_id"] for r in chosen))
        return Selection.of(job.chunk, everyone, chosen)

    async def excluded(self, job: protocol.Job) -> frozenset[str]:
        """Providers a re-send line must not use: those that failed its recipient on their
        side, as its row says now. A chunk's line may use any (nothing is read for it)."""
        if not job.own_line:
            return frozenset()
        # Read when asked, not taken from the rows the call was built from: a webhook may
        # have recorded a provider-side failure of this recipient during the call, and the
        # decision must not hand it to that provider. One row by its key, on a rare line.
        rows = await self.rows(job)
        return excluded_providers(rows[0]) if rows else frozenset()

    async def carry_out(self, job: protocol.Job, attempt: Attempt) -> None:
        """The effects of a settled attempt: its events on the user's webhooks, recipients'
        rows, then the follow-up job (the events first: a rerun after a crash finds the
        same recipients waiting and tells the same events again, never fewer)."""
        rows = await self.rows(job)
        # An attempt resolved after being ambiguous had its answers applied when it became
        # ambiguous (``Caller``) or, after a crash, by the redelivery that found it so
        # (``EnsureCheck``): applied again here they would count twice in providers' health
        # and domains' capacity.
        if attempt.state != "resolved" and await self.apply_answers(job, attempt, rows):
            rows = await self.rows(job)  # the answered recipients now carry their evidence
        waiting = self.waiting(job, rows, attempt.attempt)
        chosen = self.select(job, rows, waiting)
        outcome = recipient_events.outcome_of(attempt)
        if outcome is not None:
            await self.tell(
                job.batch_id,
                lambda: recipient_events.attempt_events(
                    attempt,
                    job.batch_id,
                    waiting,
                    outcome=outcome,
                    evidence=recipient_events.evidence_of(attempt),
                ),
            )
        if attempt.state == "accepted":
            await self.recipients.accepted(
                job.batch_id,
                chosen,
                provider=attempt.provider,
                tag=attempt.tag,
                when=attempt.started_at,
                message_id=attempt.message_id,
            )
            await self.fault_points("effects", job)
            return
        if attempt.decision == "done":
            return  # resolved as accepted: the evidence wrote the rows
        if chosen.log_ids:
            await self.recipients.call_failed(
                job.batch_id,
                chosen,
                provider=attempt.provider,
                result=_result(attempt),
                when=attempt.finished_at or attempt.created_at,
            )
        await self.fault_points("effects", job)
        if attempt.decision == "retry":
            await self._publish_next(job, attempt)
        elif attempt.decision == "give_up":
            header = await self.header(job.batch_id)
            await self.recipients.give_up(
                job.batch_id,
                header.user_id,
                chosen,
                reason=attempt.verdict or "every provider failed",
                when=attempt.finished_at or attempt.created_at,
            )
            self.metrics.recipients_failed.inc(len(chosen.log_ids))
        await self.fault_points("followed", job)

    async def apply_answers(
        self,
        job: protocol.Job,
        attempt: Attempt,
        rows: list[Row] | None = None,
        *,
        waiting_only: bool = False,
    ) -> bool:
        """Apply the answers recipient by recipient stored on ``attempt`` (if it has any) as
        the provider events they stand for (``shared.delivery.recipient_answers``); whether
        there were any. Idempotent: the events' ids are fixed, so a rerun after a crash
        rewrites the same cells, and an answered recipient is then no longer the attempt's
        to settle (its tag is on its row: it is neither re-sent nor resolved).
        ``waiting_only``: only the recipients still waiting for the attempt's evidence (those
        answers never applied, or applied and overtaken by nothing), so that one applied
        already does not count twice; whether any was applied then."""
        try:
            answers = recipient_answers.decode(attempt.answers)
        except recipient_answers.Unreadable as exc:
            raise Poison(f"attempt {attempt.tag} of batch {job.batch_id}: {exc}") from exc
        if answers is None:
            return False
        if self.ingest is None:
            raise RuntimeError("a provider answered recipient by recipient: an Ingest is needed")
        if rows is None:
            rows = await self.rows(job)
        events = recipient_answers.events(attempt, job.batch_id, rows, answers)
        if waiting_only:
            left = {address_key(str(r["email"])) for r in self.waiting(job, rows, attempt.attempt)}
            events = [e for e in events if e.email in left]
            if not events:
                return False
        if events:
            await self.ingest.apply_all(events)
        await self.fault_points("answers", job)
        return True

    async def tell(self, batch_id: uuid.UUID, events: Callable[[], list[HookEvent]]) -> None:
        """Queue ``events()`` for the batch's user's webhooks (persisted before returning;
        built only when the user has an endpoint that collects them)."""
        hooks = self.user_hooks
        if hooks is None:
            return
        header = await self.header(batch_id)
        if await hooks.listening(header.user_id):
            await hooks.emit(header.user_id, events())

    async def _publish_next(self, job: protocol.Job, attempt: Attempt) -> None:
        provider, number = attempt.next_provider, attempt.next_attempt
        assert provider is not None and number is not None  # noqa: S101 - a retry names both
        delay = attempt.next_delay or 0
        tier = self.broker.topology.delay_tier_for(delay) if delay else None
        if job.log_id is None:
            key = dispatch_key(provider, job.batch_id, number, job.lane)
            body = ChunkJob(batch_id=job.batch_id, chunk=job.chunk, attempt=number).encode()
            message_id = f"{job.batch_id}:{job.chunk}:{number}"
        else:
            key = log_key(provider, job.log_id, number)
            body = LogJob(
                batch_id=job.batch_id, chunk=job.chunk, log_id=job.log_id, attempt=number
            ).encode()
            message_id = f"{job.log_id}:{number}"
        await self.broker.publish(key, body, delay=tier, message_id=message_id)

    async def check(self, job: protocol.Job, checks: int, delay: float) -> None:
        """Queue check number ``checks`` of the job's attempt, ``delay`` seconds from now."""
        tier = self.broker.topology.delay_tier_for(delay)
        if job.log_id is None:
            key = dispatch_key(job.provider, job.batch_id, job.attempt, job.lane)
            body = ChunkJob(
                batch_id=job.batch_id, chunk=job.chunk, attempt=job.attempt, check=checks
            ).encode()
        else:
            key = log_key(job.provider, job.log_id, job.attempt)
            body = LogJob(
                batch_id=job.batch_id,
                chunk=job.chunk,
                log_id=job.log_id,
                attempt=job.attempt,
                check=checks,
            ).encode()
        # An id of its own (not only its number): the check's delivery may number the next
        # one, and the attempt then records this id as the one whose redelivery republishes.
        await self.broker.publish(
            key,
            body,
            delay=tier,
            message_id=f"{job.line}:{job.attempt}:check:{checks}:{uuid.uuid4().hex[:12]}",
        )


def _result(attempt: Attempt) -> str:
    """The providers-map entry of an attempt that did not get the recipients accepted."""
    if attempt.state == "resolved":
        return f"unknown: {attempt.verdict}"
    kind, _, message = (attempt.error or "").partition("|")
    if kind == "held":
        return f"held: {message}"
    return f"failed: {message or attempt.verdict or 'failed'}"
