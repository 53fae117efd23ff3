"""One provider call of an attempt this delivery holds as ``calling``, and recording its answer.

The answer is one of three: accepted, rejected (the provider cannot have taken the request:
refused, or never fully received it) or unknown (it may have: the process died, the
connection broke after the request was written, the answer never came). It is recorded with
one conditional write that also stores the decision that follows (``failover.decide``), and
that write is retried in place while Cassandra is unreachable: the answer exists only in this
process until it is stored. If someone else marked the call ``ambiguous`` meanwhile (this
process outlived its lease), the answer is still the truth and settles the attempt.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from services.consumers import failover, protocol
from services.consumers.campaign_hold import CampaignHold
from services.consumers.faults import FaultPoints
from services.consumers.followup import FollowUps
from services.consumers.provider_rates import ProviderLimiter
from services.consumers.running import Running
from services.consumers.screening import Screen
from shared.accounts.domains import domain_of
from shared.core.errors import (
    CapacityHeld,
    DependencyUnavailable,
    PermanentProviderError,
    ProviderError,
    ProviderMisconfigured,
    ProviderSkipped,
    TransientProviderError,
)
from shared.core.models import Chunk, Message, chain_for
from shared.delivery.attempts import Attempt, Attempts, find, tag
from shared.delivery.domain_capacity import CapacityGate
from shared.delivery.recipient_answers import (
    answered_unknown,
    answers_column,
    complete,
    refused_count,
)
from shared.delivery.recipients import Recipients
from shared.engagement.engagement import Tracker, personalize
from shared.infra.byte_budget import BudgetExhausted, ByteBudget
from shared.infra.db import Row
from shared.infra.gil import CpuLane
from shared.infra.logs import bound
from shared.infra.metrics import DispatchMetrics
from shared.infra.settle import MAX_OUTAGE_BACKOFF, MAX_OUTAGE_HOLD, Delivery
from shared.outbound import recipient_events
from shared.providers.base import Provider, Receipt
from shared.providers.provider_health import Tally
from shared.templates import template_use

log = logging.getLogger(__name__)

_ERROR_KINDS: dict[str, type[ProviderError]] = {
    "held": CapacityHeld,  # before its base classes
    "skipped": ProviderSkipped,
    "transient": TransientProviderError,
    "misconfigured": ProviderMisconfigured,
    "permanent": PermanentProviderError,
}


def encode_error(error: ProviderError) -> str:
    kind = next((k for k, cls in _ERROR_KINDS.items() if isinstance(error, cls)), "transient")
    return f"{kind}|{error.message}"


@dataclass(frozen=True, slots=True)
class Answer:
    """What the provider said: ``receipt`` when accepted, else ``error``."""

    receipt: Receipt | None = None
    error: ProviderError | None = None
    recipients: int = 0
    """How many recipients the call was for."""

    @property
    def unknown(self) -> bool:
        """Whether the call may have reached the provider without our knowing (for a receipt
        answering recipient by recipient: for some of them, ``error`` says how many)."""
        return self.error is not None and self.error.outcome_unknown


@dataclass(kw_only=True)
class Decisions:
    """What follows a failed attempt (``failover.decide``), decided with the chain and max
    attempts in force when it is made (the caller's and the resolver's alike)."""

    follow: FollowUps
    running: Callable[[], Running]
    """The live settings in force (``services.consumers.running``), read once per decision."""
    backoff: Sequence[int]
    """Seconds before each retry through the same provider (the env's, static)."""

    async def decide(
        self, job: protocol.Job, line: list[Attempt], error: ProviderError
    ) -> dict[str, Any]:
        """The decision after attempt ``job.attempt`` failed with ``error``, as columns."""
        running = self.running()
        refused = frozenset(a.provider for a in line if (a.error or "").startswith("permanent|"))
        # Providers skipped (paused, at their rate limit) or work held at its domain's
        # capacity were never called: those hops do not use up the chunk's attempts.
        skipped = sum(1 for a in line if (a.error or "").startswith(("skipped|", "held|")))
        skipped += isinstance(error, ProviderSkipped)
        # Nor do turns an earlier decision passed over (numbers with no attempt in the line).
        made = len({a.attempt for a in line if a.attempt <= job.attempt} | {job.attempt})
        skipped += job.attempt + 1 - made
        excluded = await self.follow.excluded(job)
        header = await self.follow.header(job.batch_id)
        verdict = failover.decide(
            chain=chain_for(header.message, running.chain),
            attempt=job.attempt,
            error=error,
            max_attempts=running.max_attempts + skipped,
            backoff=self.backoff,
            permanent_from=refused,
            excluded=excluded,
        )
        if isinstance(verdict, failover.Retry):
            return {
                "decision": "retry",
                "verdict": f"{error.provider} {error.message}"[:1000],
                "next_provider": verdict.provider,
                "next_attempt": verdict.attempt,
                "next_delay": round(verdict.delay),
            }
        return {"decision": "give_up", "verdict": verdict.reason[:1000]}


@dataclass(kw_only=True)
class Caller:
    """Calls the provider for an attempt a delivery holds as calling and records the
    answer (``services.consumers.dispatch`` builds it once per process)."""

    attempts: Attempts
    providers: Mapping[str, Provider]
    recipients: Recipients
    follow: FollowUps
    screen: Screen
    decisions: Decisions
    running: Callable[[], Running]
    """The live settings in force (``services.consumers.running``), read at each call."""
    limiter: ProviderLimiter
    capacity: CapacityGate
    tally: Tally
    campaigns: CampaignHold | None
    tracker: Tracker | None
    work: ByteBudget | None
    cpu: CpuLane
    metrics: DispatchMetrics
    fault_points: FaultPoints
    now: Callable[[], datetime]
    timeout: float
    """A provider call's timeout: the longest a chunk waits for room in :attr:`work`."""
    resolve_interval: float
    """Seconds from an unknown answer to the first look for evidence."""

    async def call(self, job: protocol.Job, delivery: Delivery, version: int | None = None) -> bool:
        """Call the provider for the attempt this delivery holds, with the copy of template
        version ``version`` (as the attempt recorded it), then record the answer."""
        header = await self.follow.header(job.batch_id)
        to_send, taken = await self._pending_with_room(job, header.message)
        try:
            message = template_use.message_at(header.message, job.chunk, version)
            use = header.message.template
            if use is not None and to_send:
                canary = use.canary is not None and version == use.canary.version
                # Which copy these recipients are sent, as fields of the record (the job's
                # batch, line, attempt and provider are bound by the dispatcher).
                with bound(template_id=use.id, template_version=version, canary=canary):
                    log.info(
                        "%s/%s attempt %d: template version %s (%s) to %d recipients",
                        job.batch_id,
                        job.line,
                        job.attempt,
                        version,
                        "canary" if canary else "live",
                        len(to_send),
                    )
            if to_send:
                # The last look at the suppression list (``services.consumers.screening``),
                # before "called" is set: a read that fails is retried, never sent unchecked.
                to_send, message = await self.screen(job, header, to_send, message)
            delivery.scratch["called"] = True
            if not to_send:
                answer = Answer(receipt=Receipt(job.provider, 0, None))  # nothing left to send
            else:
                tracker = self.tracker if header.message.engagement is not None else None
                build = (job, message, to_send, tracker)
                # A token per recipient and link, or a large chunk's models: CPU work (34 ms
                # for 1,000 recipients with 100 substitutions each), kept off the event loop.
                if tracker is not None or heavy(to_send):
                    chunk = await self.cpu.run(_chunk, *build)
                else:
                    chunk = _chunk(*build)
                await self.fault_points("before_call", job)
                held = (
                    await self.campaigns.check(header.user_id, header.message, job.provider)
                    if self.campaigns is not None
                    else None
                )
                sent = Answer(error=held) if held is not None else await self._send(job, chunk)
                answer = replace(sent, recipients=len(to_send))
                del chunk, build, to_send  # not held past the budget they took
        finally:
            if self.work is not None:
                self.work.give(taken)
        delivery.scratch["answer"] = answer
        await self.fault_points("answered", job)
        return await self.record(job, delivery)

    async def _pending(self, job: protocol.Job) -> list[Row]:
        rows = await self.follow.rows(job)
        return protocol.pending(
            rows, own_line=job.own_line, tag=tag(job.line, job.attempt), handed=job.handed
        )

    async def _pending_with_room(
        self, job: protocol.Job, message: Message
    ) -> tuple[list[Row], int]:
        """The recipients the call is for, and the bytes of the work budget taken for them.

        Building and sending a chunk holds its data a few times over (models, the provider's
        payload, its encoding): the process's work budget bounds how much of that it holds
        at once. Recipients that find no room are let go while their chunk waits, and read
        again once there is room, so a waiting chunk holds nothing. The wait is at most one
        call's length, so the attempt this delivery holds as calling cannot outlive its
        lease (2 calls + 5 s) by it; past it the chunk goes anyway, over budget. The
        message's files weigh too (:func:`weigh_files`): they are in every payload."""
        to_send = await self._pending(job)
        if self.work is None or not to_send:
            return to_send, 0
        if heavy(to_send, WEIGH_US):
            weight = await self.cpu.run(weigh, to_send)
        else:
            weight = weigh(to_send)
        weight += weigh_files(message)
        taken = self.work.try_take(weight)
        if taken is not None:
            return to_send, taken
        del to_send
        taken = await _room(self.work, weight, wait=self.timeout)
        try:
            return await self._pending(job), taken
        except BaseException:
            self.work.give(taken)
            raise

    async def _send(self, job: protocol.Job, chunk: Chunk) -> Answer:
        running = self.running()  # one set of rules for the admission and its release
        if job.provider in running.paused:
            # Not called: rejected like a refusal, so the decision moves the work on.
            return Answer(error=ProviderSkipped(job.provider, "paused by an operator"))
        domain = domain_of(chunk.message.sender.email)
        count = len(chunk.recipients)
        held = await self.capacity.admit(domain, count, self.now(), running.capacity)
        if held is not None:
            return Answer(error=CapacityHeld(job.provider, held.reason, retry_after=held.wait))
        # Dying here leaves the recipients counted, not sent.
        await self.fault_points("admitted", job)
        answer = await self._call(job, chunk, pinned=chunk.message.provider is not None)
        if answer.error is not None and not answer.unknown:
            # Not sent: not counted.
            await self.capacity.release(domain, count, self.now(), running.capacity)
        elif answer.receipt is not None:
            # Nor are the recipients it refused (their re-sends are admitted again).
            refused = refused_count(answer.receipt)
            await self.capacity.release(domain, refused, self.now(), running.capacity)
        return answer

    async def _call(self, job: protocol.Job, chunk: Chunk, *, pinned: bool) -> Answer:
        limiter = self.limiter

        async def gate() -> None:
            """The shared rate limit, asked once the request is built (as late as can be)."""
            limit = self.running().limits.get(job.provider) or 0.0
            wait = await limiter.acquire(job.provider, self.now(), limit)
            if wait is not None:
                then = "waiting for it (the batch pins it)" if pinned else "spilled over"
                raise ProviderSkipped(job.provider, f"at its rate limit: {then}", retry_after=wait)

        provider = self.providers.get(job.provider)
        if provider is None:
            error = ProviderMisconfigured(job.provider, "provider is not configured in the chain")
            return Answer(error=error)
        started = time.monotonic()
        task = asyncio.ensure_future(provider.send(chunk, gate))
        await self.fault_points("during_call", job)  # a process dying here leaves it in flight
        try:
            receipt = await task
        except ProviderSkipped as skipped:
            return Answer(error=skipped)  # not called: says nothing about its health
        except ProviderError as error:
            if error.status == 429 and error.retry_after:
                # The provider says how long it is full: every process holds off that long.
                await self.limiter.block(job.provider, self.now(), error.retry_after)
            # An invalid request says nothing about the provider's health; anything else does.
            self.tally.count(
                job.provider,
                self.now(),
                error=not isinstance(error, PermanentProviderError),
                seconds=time.monotonic() - started,
            )
            log.info(
                "%s/%s attempt %d via %s: %s",
                job.batch_id,
                job.line,
                job.attempt,
                job.provider,
                error,
            )
            return Answer(error=error)
        self.tally.count(job.provider, self.now(), error=False, seconds=time.monotonic() - started)
        receipt = complete(receipt, (r.email for r in chunk.recipients))
        return Answer(receipt=receipt, error=answered_unknown(receipt))

    async def record(self, job: protocol.Job, delivery: Delivery) -> bool:
        """Store this delivery's answer (retrying through outages); True when finished."""
        answer: Answer | None = delivery.scratch.get("answer")
        line = await self.attempts.line(job.batch_id, job.line, serial=True)
        current = find(line, job.attempt)
        if current is None:
            return False
        if answer is None:
            # Called, but the answer is gone (cannot happen within one delivery): unknown.
            answer = Answer(
                error=TransientProviderError(job.provider, "answer lost", outcome_unknown=True)
            )
        values = await self._values(job, line, current, answer)
        expect: dict[str, Any] = {"state": "calling", "owner": delivery.owner}
        if answer.unknown:
            # Whether a chain of checks already runs (see _values) must still hold as read.
            expect["checks"] = current.checks
        stored = await self._durably(
            lambda: self.attempts.transition(
                job.batch_id, job.line, job.attempt, expect=expect, values=values
            )
        )
        if stored:
            await self.fault_points("recorded", job)
            return await self._settled(job, replace(current, **values), answer, values)
        return await self._late(job, delivery, answer)

    async def _values(
        self, job: protocol.Job, line: list[Attempt], current: Attempt, answer: Answer
    ) -> dict[str, Any]:
        now = self.now()
        if answer.receipt is not None and not answer.unknown:
            return {
                "state": "accepted",
                "finished_at": now,
                "status_code": answer.receipt.status or None,
                "message_id": answer.receipt.message_id,
                "decision": "done",
                **answers_column(answer.receipt),
            }
        assert answer.error is not None  # noqa: S101 - an answer has one or the other
        if answer.unknown:
            unknown = {
                "state": "ambiguous",
                "finished_at": now,
                "error": encode_error(answer.error),
                **answers_column(answer.receipt),
            }
            if current.checks > 0:
                # A check of this call is already numbered (a delivery of the job waited for
                # our lease): it finds the attempt ambiguous and resolves it. We number none
                # of our own: this delivery may no longer hold its message (its connection
                # dropped, another copy acked it), and should it die before publishing,
                # nothing would publish that check again. Whether we must see the numbered
                # one published is :meth:`_settled`'s question.
                return unknown
            return {**unknown, "checks": 1, "checked_by": job.origin}
        return {
            "state": "rejected",
            "finished_at": now,
            "status_code": answer.error.status,
            "error": encode_error(answer.error),
            **await self.decisions.decide(job, line, answer.error),
        }

    async def _settled(
        self, job: protocol.Job, attempt: Attempt, answer: Answer, values: dict[str, Any]
    ) -> bool:
        if attempt.state == "ambiguous":
            self.metrics.ambiguous.labels(job.provider).inc()
            # Recipients the provider did answer for are settled by their answers now; the
            # checks resolve the others.
            await self.follow.apply_answers(job, attempt)
            if "checks" in values or protocol.numbered_by(job, attempt):
                # We numbered the first check (``values`` set it), or another delivery of our
                # message did while we called (it waited for our lease): a copy whose
                # connection dropped, so ours is the message it held, and should it die
                # before publishing its check, nothing would redeliver it to publish it
                # again. Seeing the check published is ours then; should both publish, the
                # copy whose LWT applies first holds the chain and the other dies out.
                await self.follow.check(job, attempt.checks, self.resolve_interval)
            return True
        if answer.receipt is not None and answer.receipt.status:
            self.metrics.chunks_sent.labels(job.provider).inc()
            self.metrics.recipients_sent.labels(job.provider).inc(answer.recipients)
        elif answer.error is not None:
            kind = encode_error(answer.error).partition("|")[0]
            self.metrics.attempts_failed.labels(job.provider, kind).inc()
        await self.follow.carry_out(job, attempt)
        return True

    async def _late(self, job: protocol.Job, delivery: Delivery, answer: Answer) -> bool:
        """Our record did not apply: someone presumed us dead and marked the call ambiguous.
        The answer we hold is still the truth; use it to resolve the attempt."""
        line = await self.attempts.line(job.batch_id, job.line, serial=True)
        current = find(line, job.attempt)
        if current is None or current.state != "ambiguous":
            return False  # settled by someone else
        if answer.unknown:
            # We know no more than they do, except the recipients the provider did answer
            # for: applied now, their tags keep them out of the resolution (lost if we die
            # before: then they are resolved like the rest).
            heard = answers_column(answer.receipt).get("answers")
            await self.follow.apply_answers(job, replace(current, answers=heard))
            return False
        if answer.receipt is not None:
            # The recipients it answered for first, as on the unknown path: their tags keep them
            # out of ``waiting``, so a refused one is never told "confirmed sent", and should
            # we die before the resolving write, what they stand for is already applied (the
            # resolver finds no one waiting otherwise, and their answers are not stored yet).
            heard = answers_column(answer.receipt).get("answers")
            if heard:
                await self.follow.apply_answers(job, replace(current, answers=heard))
            everyone = await self.follow.rows(job)
            waiting = self.follow.waiting(job, everyone, job.attempt)
            await self.follow.tell(
                job.batch_id,
                lambda: recipient_events.attempt_events(
                    current, job.batch_id, waiting, outcome="confirmed sent", evidence="api"
                ),
            )
            await self.recipients.accepted(
                job.batch_id,
                self.follow.select(job, everyone, waiting),
                provider=job.provider,
                tag=current.tag,
                when=current.started_at,
                message_id=answer.receipt.message_id,
            )
            values: dict[str, Any] = {
                "state": "resolved",
                "resolution": "accepted",
                "decision": "done",
                "message_id": answer.receipt.message_id,
                **answers_column(answer.receipt),
            }
        else:
            assert answer.error is not None  # noqa: S101
            values = {
                "state": "resolved",
                "resolution": "not_accepted",
                "error": encode_error(answer.error),
                **await self.decisions.decide(job, line, answer.error),
            }
        resolved = await self._durably(
            lambda: self.attempts.transition(
                job.batch_id, job.line, job.attempt, expect={"state": "ambiguous"}, values=values
            )
        )
        if resolved:
            await self.follow.carry_out(job, replace(current, **values))
        return resolved

    async def _durably(self, write: Any) -> bool:
        """Run a conditional write until Cassandra answers (the answer we hold is nowhere
        else); give up after the outage hold, leaving the attempt to be resolved as unknown."""
        delay, held = 0.2, 0.0
        while True:
            try:
                return bool(await write())
            except DependencyUnavailable:
                if held >= MAX_OUTAGE_HOLD:
                    raise
                await asyncio.sleep(delay)
                held += delay
                delay = min(delay * 2, MAX_OUTAGE_BACKOFF)


#: CPU of one trip to the CPU lane (``shared.infra.gil.CpuLane``) of its own, in µs: handing the
#: work to its thread, waking it, and the answer's way back to the event loop (79.5 µs
#: measured for work that does nothing).
LANE_TRIP_US = 80.0
#: How many trips' worth of CPU a piece of work must cost before it leaves the event loop:
#: below that the trip's own CPU is too large a share of what the loop is spared.
LANE_WORTH = 3
#: CPU per item of building a chunk (:func:`_chunk`), in µs; an item is a recipient or one of
#: its substitutions (:func:`count_items`). Measured near the bound it sets (200 items: 0.9 to 1.4
#: µs per item, from 67 recipients with two substitutions each to 200 without any).
BUILD_US = 1.2
#: CPU per item of weighing a chunk (:func:`weigh`), in µs. Measured near its bound (2,000
#: items: 0.09 to 0.27 µs per item), and 0.12 for make bench's chunk (100 recipients with two
#: substitutions each).
WEIGH_US = 0.12


def lane_bound(per_item_us: float) -> int:
    """The most items that work of ``per_item_us`` each may have and stay on the event loop
    (pure): 200 for building a chunk, 2,000 for weighing one."""
    return round(LANE_WORTH * LANE_TRIP_US / per_item_us)


def worth_the_lane(items: int, per_item_us: float) -> bool:
    """Whether work on ``items`` items at ``per_item_us`` each costs enough CPU to go to the CPU
    lane (more than :data:`LANE_WORTH` trips there) rather than be done on the event loop (pure)."""
    return items > lane_bound(per_item_us)


def count_items(rows: Sequence[Row], most: int | None = None) -> int:
    """A chunk's items: each recipient, and each of its substitutions (pure). Counting may
    stop once past ``most``."""
    count = 0
    for row in rows:
        count += 1 + len(row.get("substitutions") or ())
        if most is not None and count > most:
            break
    return count


def heavy(rows: Sequence[Row], per_item_us: float = BUILD_US) -> bool:
    """Whether building a chunk of ``rows`` (or the work ``per_item_us`` stands for) is CPU
    work to keep off the event loop."""
    return worth_the_lane(count_items(rows, lane_bound(per_item_us)), per_item_us)


def weigh(rows: Sequence[Row]) -> int:
    """The bytes of recipients' data in ``rows`` (addresses, names, substitutions): what a
    chunk of them takes from the work budget."""
    total = 0
    for row in rows:
        total += len(row["email"]) + len(row.get("name") or "")
        for key, value in (row.get("substitutions") or {}).items():
            total += len(key) + len(value)
    return total


def weigh_files(message: Message) -> int:
    """The bytes a chunk's payload holds of its message's files beyond the message itself:
    their base64 text in the body (SendGrid's JSON, Mailgun's form), and Mailgun's decoded
    copy of it while the multipart body is built (3/4 of it: counted whole)."""
    return 2 * sum(len(a.content) for a in message.attachments)


async def _room(budget: ByteBudget | None, size: int, *, wait: float) -> int:
    """``size`` bytes of ``budget`` (what was taken), or none once ``wait`` is over."""
    if budget is None:
        return 0
    try:
        return await budget.take(size, wait=wait)
    except BudgetExhausted:
        log.warning("work budget full for %.0f s: sending a chunk of %d bytes over it", wait, size)
        return 0


def _chunk(
    job: protocol.Job, message: Message, rows: Sequence[Row], tracker: Tracker | None
) -> Chunk:
    """The chunk the provider is sent: ``rows`` as recipients, personalized when the
    batch's message asks for engagement (``tracker``)."""
    # One validation of the whole chunk, its recipients as plain data (pydantic's core walks
    # them), rather than a model built per recipient: a third less CPU for 100 recipients.
    chunk = Chunk.model_validate(
        {
            "batch_id": job.batch_id,
            "index": job.chunk,
            "message": message,
            "recipients": [_recipient(r) for r in rows],
            "attempt": tag(job.line, job.attempt),
        }
    )
    return chunk if tracker is None else personalize(chunk, tracker)


def _recipient(row: Row) -> dict[str, Any]:
    return {
        "log_id": row["log_id"],
        "email": row["email"],
        "name": row.get("name"),
        "substitutions": row.get("substitutions") or {},
    }
