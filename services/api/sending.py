"""Accepting a batch: the one use case under ``POST /v1/batches``, the dashboard's send form
and the original's ``POST /api/batch``.

It works on plain data: a user id, the request body as decoded JSON-shaped values (each
interface builds that from its own wire format), and an optional Idempotency-Key. It
answers the 202 body as a dict, or raises :class:`~shared.infra.http.ApiError` (409, 413, 422,
429, 503) for the interface to render in its own shape.

A 202 means the batch, its chunks and their recipients are in Cassandra and either the
broker confirmed ``batch.<uuid>`` or the outbox row guarantees the relay will publish it
(``shared.delivery.acceptance``). Once a batch is accepted (stored with a key, committed without
one), nothing turns its answer into an error. Without a key a plain 503 means the batch is
never sent; ``acceptance_unknown`` (503, with the batch id) means the API could not learn
whether its commit applied.

It also cancels a scheduled batch (:meth:`Sending.cancel`), which gives back what
accepting it charged.
"""

from __future__ import annotations

import functools
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, ParamSpec

import orjson
from cassandra.query import Statement

from services.api import answers, cooldown, schema
from services.api.cooldown import RecentSends
from services.api.idempotency import Existing, IdempotencyKeys
from services.api.templated import TEMPLATE_FIELDS, Plan, TemplateBatches
from shared.accounts.domains import Domains, covers, domain_of
from shared.accounts.preferences import PreferenceRows, Preferences
from shared.accounts.ratelimit import QuotaLedger
from shared.audience.suppression_cache import SuppressionCache
from shared.audience.suppressions import SuppressionChecks
from shared.core import lanes
from shared.core.batch_ids import accepted_at
from shared.core.errors import DependencyUnavailable, TooLargeToStore
from shared.core.models import Message
from shared.delivery import validation
from shared.delivery.acceptance import Acceptance
from shared.delivery.batchstore import (
    Batches,
    BatchHeader,
    Content,
    NewBatch,
    content_of,
    most_stored,
    new_batch_id,
    too_large,
)
from shared.delivery.schedule_store import Schedules
from shared.infra.background import Background
from shared.infra.config import Settings
from shared.infra.gil import CpuLane
from shared.infra.http import ApiError, wire
from shared.infra.leases import SCHEDULER_WAKE, wake
from shared.infra.logs import bound
from shared.infra.metrics import ApiMetrics
from shared.infra.user_cache import UserCache
from shared.providers.limits import chunk_size
from shared.templates import template_use
from shared.templates.canary_store import Canaries, Rollout

log = logging.getLogger(__name__)

P = ParamSpec("P")

#: From these many recipients, or characters of html and text, encoding what a batch stores
#: is worth a worker thread (milliseconds and more: 10 MB takes some 10 ms).
_LARGE_RECIPIENTS = 100
_LARGE_TEXT = 64 * 1024


@dataclass(frozen=True, slots=True)
class Sending:
    """What accepting a batch needs, built once per process by the app's lifespan."""

    settings: Settings
    acceptance: Acceptance
    batches: Batches
    suppressions: SuppressionChecks
    idempotency: IdempotencyKeys
    quota: QuotaLedger
    metrics: ApiMetrics
    background: Background
    domains: Domains | None = None
    """The users' verified domains; without it no domain is verified (fail closed)."""
    domain_cache: UserCache[frozenset[str]] | None = None
    """This process's copy of ``domains.verified`` (``shared.infra.user_cache``): read through it
    when given."""
    preferences: PreferenceRows | None = None
    """The users' tracking defaults and cooldown (without it: the defaults, no cooldown)."""
    recent: RecentSends | None = None
    """When each address was last mailed (cooldown)."""
    templates: TemplateBatches | None = None
    """Batches made from the users' templates (without it: refused)."""
    schedules: Schedules | None = None
    """Batches waiting for their ``send_at`` (without it: scheduling is refused)."""
    canaries: Canaries | None = None
    """Which batches carried a template's canary (for the rollout's judge)."""
    cpu: CpuLane = field(default_factory=CpuLane)
    """The API's thread for long pure-Python work (``shared.infra.gil``)."""
    suppression_cache: SuppressionCache | None = None
    """This process's copy of the users' suppression lists (without it: read per batch)."""
    tracking: bool = True
    """Whether this deployment's mail carries tracking and unsubscribe tokens (its
    consumers' tracker, ``SAFEDELIVR_TRACKING_*``): without it the bulk lane's default
    one-click unsubscribe does not apply, and the 202 says so."""

    async def accept(
        self,
        user_id: uuid.UUID,
        body: object,
        idem: str | None,
        *,
        batch_id: uuid.UUID | None = None,
    ) -> dict[str, Any]:
        """Honour the Idempotency-Key first, then validate, drop suppressed recipients, charge
        the daily quota and accept durably. Raises ApiError 409/413/422/429, and 503 when a
        dependency is down before the batch is decided.

        A key is looked up before anything is judged: a repeat with the same body gets the
        first answer (or the first request's batch, finished), whatever changed since (a
        recipient suppressed, a ``send_at`` now past, a template published); another body
        is a 409. Only a new key, or one taken over from a holder that died before storing
        anything, is judged.

        ``batch_id`` fixes the id the batch gets when this request is the first with its
        key (a caller that stored it beforehand; see :meth:`stored`); default a new one."""
        if idem is None:
            batch_id = new_batch_id(time.time())
            parsed, prefs, extra = await self._judged(user_id, body, accepted_at(batch_id))
            return await self._accept_once(user_id, batch_id, parsed, prefs, extra)
        owner = uuid.uuid4()
        claim = await self.idempotency.claim(
            user_id,
            idem,
            await _hashed(self.cpu, body),
            batch_id or new_batch_id(time.time()),
            owner,
        )
        if isinstance(claim, Existing):
            return await self._repeat(user_id, idem, claim, owner, body)
        return await self._accept_keyed(user_id, idem, claim.batch_id, owner, body, fresh=True)

    async def stored(self, user_id: uuid.UUID, batch_id: uuid.UUID) -> dict[str, Any] | None:
        """The 202 of the user's batch ``batch_id`` if it is stored (finishing its acceptance
        if that stopped part-way), else None. A caller that fixed a batch's id asks this
        before accepting it, so a batch stored once is not accepted a second time (after its
        key expired that would be a new acceptance: checked, charged and stored again)."""
        header = await self.batches.header(batch_id)
        if header is None or header.user_id != user_id or header.response is None:
            return None
        if header.status != "cancelled":
            await self.acceptance.finish(batch_id)
        answer: dict[str, Any] = orjson.loads(header.response)
        return answer

    async def _judged(
        self, user_id: uuid.UUID, body: object, at: datetime
    ) -> tuple[validation.BatchRequest, Preferences, Extra]:
        """Everything a request is judged by, as of ``at`` for its ``send_at`` (the first
        claim of its key): its fields, template, sender, the user's preferences and
        suppression list."""
        body, extra = await self._extra(user_id, body, at)
        if validation.is_large(body):
            parsed = await self.cpu.run(self._validated, body)
        else:
            parsed = self._validated(body)
        await self.check_sender(user_id, parsed.message.sender.email)
        prefs = await self.preferences.get(user_id) if self.preferences else Preferences()
        parsed = _invalid_as_422(validation.with_engagement, parsed, prefs, tracking=self.tracking)
        parsed = await self._drop_suppressed(user_id, parsed)
        return parsed, prefs, extra

    async def _extra(self, user_id: uuid.UUID, body: object, at: datetime) -> tuple[object, Extra]:
        """The body without ``send_at`` and with a template's content in place of its
        template fields, and what those asked for. ``send_at`` is judged as of ``at`` (a
        request taken over from a dead holder is judged as the first was); a time that has
        come by now means now."""
        if not isinstance(body, dict):
            return body, Extra()
        when: datetime | None = None
        if "send_at" in body:
            if self.schedules is None:
                raise ApiError(
                    422,
                    "invalid_fields",
                    "bad field",
                    fields={"send_at": "scheduling is not available"},
                )
            try:
                when = lanes.send_at(
                    body["send_at"], at, timedelta(days=self.settings.api.schedule_horizon_days)
                )
            except lanes.ScheduleError as exc:
                raise ApiError(
                    422,
                    "invalid_fields",
                    "the request has invalid fields",
                    fields={"send_at": str(exc)},
                ) from None
            if when is not None and when <= datetime.now(UTC):
                when = None
            body = {k: v for k, v in body.items() if k != "send_at"}
        plan: Plan | None = None
        if any(field in body for field in TEMPLATE_FIELDS):
            if self.templates is None:
                raise ApiError(
                    422,
                    "invalid_fields",
                    "bad field",
                    fields={"template_id": "templates are not available"},
                )
            body, plan = await self.templates.prepare(user_id, body)
        return body, Extra(plan, when)

    def _validated(self, body: object) -> validation.BatchRequest:
        """The body validated as ``schema.BatchIn``, with the rules a schema cannot state
        (its validators) and this deployment's limits."""
        try:
            return validation.parse_batch_request(
                body,
                max_recipients=self.settings.api.max_recipients,
                configured=self.settings.providers.chain_codes,
                bulk_threshold=self.settings.api.bulk_threshold,
            )
        except validation.InvalidRequest as exc:
            raise ApiError(422, exc.code, str(exc), fields=exc.fields) from exc

    async def _repeat(
        self, user_id: uuid.UUID, idem: str, claim: Existing, owner: uuid.UUID, body: object
    ) -> dict[str, Any]:
        """A request whose key was claimed before: the stored answer, or finish the batch."""
        if not claim.same_body:
            raise ApiError(
                409, "idempotency_conflict", "this Idempotency-Key was used with a different body"
            )
        if claim.response is not None:
            first: dict[str, Any] = orjson.loads(claim.response)
            return first
        # In progress, or its holder failed or died: whatever happened, a stored batch is the
        # answer (finishing its acceptance if it stopped part-way).
        header = await self.acceptance.finish(claim.batch_id)
        if header is not None and header.response is not None:
            await self._complete_quietly(user_id, idem, header.response)
            stored: dict[str, Any] = orjson.loads(header.response)
            return stored
        now = datetime.now(UTC)
        if not claim.expired(now) or not await self.idempotency.take_over(
            user_id, idem, claim, owner
        ):
            wait = (claim.lease_until - now).total_seconds() if claim.lease_until else 1.0
            raise ApiError(
                409,
                "idempotency_in_progress",
                "a request with this Idempotency-Key is still being processed; retry",
                headers={"Retry-After": str(max(1, math.ceil(wait)))},
            )
        return await self._accept_keyed(user_id, idem, claim.batch_id, owner, body, fresh=False)

    async def _accept_keyed(
        self,
        user_id: uuid.UUID,
        idem: str,
        batch_id: uuid.UUID,
        owner: uuid.UUID,
        body: object,
        *,
        fresh: bool,
    ) -> dict[str, Any]:
        """Judge and accept under a claimed key. A ``fresh`` claim (this request made it) is
        released when nothing can have been stored (the request was refused, or a dependency
        failed while judging it, or the quota or the cooldown refused the batch, or it was too
        large to store), so the client may correct it and retry with the same key at once. A
        claim taken over is never released: its first holder may have stored the batch after
        all (a write landing late), and the key must keep naming that batch rather than let a
        second one be made. After any other failure the claim stays: the client's retry finds
        the batch if it was stored, or takes the claim over once its lease ends."""
        try:
            parsed, prefs, extra = await self._judged(user_id, body, accepted_at(batch_id))
        except (ApiError, DependencyUnavailable):
            if fresh:
                await self._release_quietly(user_id, idem, owner)
            raise
        try:
            response = await self._accept_once(user_id, batch_id, parsed, prefs, extra, keyed=True)
        except ApiError as exc:
            if fresh and exc.status in (413, 422, 429):
                await self._release_quietly(user_id, idem, owner)
            raise
        await self._complete_quietly(user_id, idem, orjson.dumps(response))
        return response

    async def built(
        self,
        user_id: uuid.UUID,
        batch_id: uuid.UUID,
        parsed: validation.BatchRequest,
        extra: Extra,
        *,
        pending: bool,
    ) -> NewBatch:
        """The batch to store (:func:`build_batch`). Its cost is linear in the recipients
        and in the answer's rejected and skipped entries, which a client sets: a large batch
        is built off the event loop, as it was validated."""
        build = functools.partial(
            build_batch, self.settings, user_id, batch_id, parsed, extra=extra, pending=pending
        )
        entries = len(parsed.recipients) + len(parsed.rejected) + len(parsed.skipped)
        if entries > validation.LARGE_RECIPIENT_ENTRIES:
            return await self.cpu.run(build)
        return build()

    async def _accept_once(
        self,
        user_id: uuid.UUID,
        batch_id: uuid.UUID,
        parsed: validation.BatchRequest,
        prefs: Preferences,
        extra: Extra,
        *,
        keyed: bool = False,
    ) -> dict[str, Any]:
        """Leave out the recipients inside the cooldown, measure what the batch would store
        (413 when it is more than one batch may hold), charge the rest to the quota of the
        batch's day (429 when over), store, decide, publish.

        Without an Idempotency-Key the batch is stored ``pending`` and committed before the
        202 (``shared.delivery.acceptance``): a failure while storing cancels it (best effort: the
        relay cancels it later otherwise; nothing else ever commits it) and answers 503, and
        a 503 then means it is never sent. A commit whose outcome stays unknown until the
        request's budget is spent answers 503 ``acceptance_unknown`` with the batch id. With
        a key the batch is stored accepted, and the client's retry finishes it.
        """
        started = time.perf_counter()
        parsed = await self._drop_cooling(user_id, batch_id, parsed, prefs)
        batch = await self.built(user_id, batch_id, parsed, extra, pending=not keyed)
        content = await self._content(batch)
        count = parsed.mailed
        verdict, _ = await self.quota.consume(user_id, count, now=accepted_at(batch_id))
        if not verdict.allowed:
            raise ApiError(
                429,
                "quota_exceeded",
                f"this batch would pass the daily quota of {self.quota.daily_limit} recipients",
                headers={"Retry-After": str(verdict.retry_after)},
            )
        response: dict[str, Any] = orjson.loads(batch.response)
        with bound(batch_id=batch_id):
            try:
                await self.acceptance.store(batch, also=await self._also(batch), content=content)
            except DependencyUnavailable:
                await self._after_failed_store(batch, keyed=keyed)
                raise
            except TooLargeToStore as exc:
                # Refused before its header was written: it does not exist, and never will.
                # The cluster holds batches to less than this API was told it does.
                log.error("batch %s refused by Cassandra for its size: %s", batch_id, exc)
                await self._refund_quietly(batch)
                raise _too_large(
                    content.size, "the store refused a batch this large", None
                ) from exc
            if batch.pending:
                await self._commit(batch)
            # Accepted: from here on nothing may turn this into an error (the relay publishes
            # if the broker does not confirm now; the scheduler publishes a scheduled one).
            await self._record_recent(user_id, batch_id, parsed, prefs)
            if batch.send_at is None:
                if not await self.acceptance.publish(batch_id):
                    self.metrics.deferred_publishes.inc()
                else:
                    self.background.spawn(self.acceptance.published(batch_id))
            else:
                if batch.pending:
                    # Its outbox row stood for it until it was committed; the schedule row
                    # now does.
                    self.background.spawn(self.acceptance.published(batch_id))
                # An idle scheduler waits for its own next due time: one due within seconds
                # is read at once (a lost nudge costs its renewal period, 5 s at most).
                self.background.spawn(wake(self.acceptance.broker, SCHEDULER_WAKE))
        self.metrics.batches.inc()
        self.metrics.recipients.inc(count)
        self.metrics.accept_seconds.observe(time.perf_counter() - started)
        return response

    async def _content(self, batch: NewBatch) -> Content:
        """What the batch would store, encoded once (off the event loop when it may take
        milliseconds); 413 ``batch_too_large`` when it is more than one batch may hold, so
        nothing is charged or written for it."""
        message = batch.message
        text = len(message.html or "") + len(message.text or "")
        text += sum(len(a.content) for a in message.attachments)
        if len(batch.recipients) >= _LARGE_RECIPIENTS or text >= _LARGE_TEXT:
            content = await self.cpu.run(content_of, batch)
        else:
            content = content_of(batch)
        limit = self.settings.cassandra.max_mutation_bytes
        if too_large(content, limit):
            most = most_stored(limit)
            raise _too_large(content.size, f"one batch may store at most {most:,} bytes", most)
        return content

    async def _refund_quietly(self, batch: NewBatch) -> None:
        try:
            await self.quota.refund(batch.user_id, batch.batch_id, batch.mailed)
        except DependencyUnavailable:
            log.warning("batch %s: not stored, and its quota not given back", batch.batch_id)

    async def _commit(self, batch: NewBatch) -> None:
        """Decide a pending batch. Raises ApiError 503 ``acceptance_unknown`` when the
        outcome is still unknown at the request's deadline, and DependencyUnavailable (a
        plain 503: it is never sent) when it was cancelled."""
        budget = timedelta(seconds=self.settings.api.commit_budget)
        decision = await self.acceptance.commit(batch, until=accepted_at(batch.batch_id) + budget)
        if decision.accepted:
            return
        if decision.status is None:
            raise ApiError(
                503,
                "acceptance_unknown",
                f"batch {batch.batch_id} may or may not have been accepted: GET "
                f"/v1/batches/{batch.batch_id} tells (cancelled: it is never sent); do not send "
                "it again unless it is cancelled",
                batch_id=str(batch.batch_id),
            )
        # Cancelled first (the relay found it undecided past its time): never sent.
        await self._settle_quietly(batch)
        raise DependencyUnavailable("cassandra", f"batch {batch.batch_id} was not decided in time")

    async def _also(self, batch: NewBatch) -> list[Statement]:
        """The writes of other partitions that go in the batch's own request: its schedule
        row, and the rollout's record that it carried a canary."""
        also: list[Statement] = []
        if batch.send_at is not None and self.schedules is not None:
            also.append(await self.schedules.statement(batch.batch_id, batch.send_at))
        use = batch.message.template
        if use and use.canary and use.canary_since and self.canaries is not None:
            also += await self.canaries.statements(
                Rollout(use.id, use.canary_since, batch.user_id, use.canary.version, use.version),
                batch.batch_id,
            )
        return also

    async def _after_failed_store(self, batch: NewBatch, *, keyed: bool) -> None:
        """Undo what a failed store charged, when that can be known. With a key nothing is
        undone: the write may have landed (accepted: the relay sends it, and its charge is
        owed), and the client's retry finishes it; a retry that takes the key over because
        nothing landed is charged again, which the quota bears (it errs towards refusing,
        never towards allowing more). Without a key, cancel the batch (it may have landed,
        pending) and settle it; if that fails too, the relay does it once the request can no
        longer commit it, and nothing ever commits it."""
        if keyed:
            return
        try:
            if await self.batches.cancel(batch.batch_id) == "cancelled":
                await self.acceptance.settle(batch.user_id, batch.batch_id, batch.mailed)
        except DependencyUnavailable:
            log.warning(
                "batch %s: could not cancel it or refund its quota after a failure", batch.batch_id
            )

    async def _settle_quietly(self, batch: NewBatch) -> None:
        try:
            await self.acceptance.settle(batch.user_id, batch.batch_id, batch.mailed)
        except DependencyUnavailable:
            log.warning("batch %s: cancelled; the relay will settle it", batch.batch_id)

    async def cancel(self, header: BatchHeader) -> None:
        """Cancel a batch still waiting for its ``send_at`` (409 ``batch_started`` once it
        started) and settle what that owes: it counts nothing, and its recipients go back to
        the quota of its day. Whoever finds the batch cancelled settles it (repeating a
        settled one changes nothing), so a retry after a 503 completes a cancel that applied
        and failed after, and answers only once that is done."""
        status = header.status
        if status == "scheduled":
            status = await self.batches.cancel_scheduled(header.batch_id) or status
        if status != "cancelled":
            raise ApiError(
                409,
                "batch_started",
                f"the batch is {status}: only a scheduled batch can be cancelled",
            )
        await self.acceptance.settle(header.user_id, header.batch_id, header.mailed)

    async def _drop_suppressed(
        self, user_id: uuid.UUID, parsed: validation.BatchRequest
    ) -> validation.BatchRequest:
        """Remove addresses (to, cc, bcc) on the user's suppression list (and on the list's
        own, for a batch naming a list); no recipient left is a 422. The lists come from
        this process's cache when it has one (``shared.audience.suppression_cache``: a change made
        through another process may be seen up to its TTL late, and the consumers' check at
        send time is the one that keeps a suppressed address from being mailed)."""
        engagement = parsed.message.engagement
        lists = self.suppressions if self.suppression_cache is None else self.suppression_cache
        listed = await lists.suppressed(
            user_id, validation.addresses_of(parsed), engagement.list if engagement else None
        )
        return _invalid_as_422(validation.drop_suppressed, parsed, listed)

    async def _drop_cooling(
        self,
        user_id: uuid.UUID,
        batch_id: uuid.UUID,
        parsed: validation.BatchRequest,
        prefs: Preferences,
    ) -> validation.BatchRequest:
        """Remove addresses mailed less than the user's cooldown ago (by another batch: a
        retried request of this one finds its own rows); no recipient left is a 422."""
        if self.recent is None or prefs.cooldown_seconds <= 0:
            return parsed
        scopes = cooldown.scopes_of(
            parsed.message.categories, per_category=prefs.cooldown_per_category
        )
        found = await self.recent.cooling(
            user_id,
            validation.addresses_of(parsed),
            scopes,
            prefs.cooldown_seconds,
            exclude=batch_id,
        )
        listed = dict.fromkeys(found, cooldown.REASON)
        return _invalid_as_422(validation.drop_suppressed, parsed, listed)

    async def _record_recent(
        self,
        user_id: uuid.UUID,
        batch_id: uuid.UUID,
        parsed: validation.BatchRequest,
        prefs: Preferences,
    ) -> None:
        """Start the cooldown of every address this batch mails. Best effort: the batch is
        stored, and a cooldown missed once must not turn its 202 into an error."""
        if self.recent is None or prefs.cooldown_seconds <= 0:
            return
        scopes = cooldown.scopes_of(
            parsed.message.categories, per_category=prefs.cooldown_per_category
        )
        try:
            await self.recent.record(
                user_id, validation.addresses_of(parsed), scopes, prefs.cooldown_seconds, batch_id
            )
        except DependencyUnavailable:
            log.warning("batch %s: could not record its recipients for the cooldown", batch_id)

    async def check_sender(self, user_id: uuid.UUID, sender: str) -> None:
        """422 naming ``from`` unless its domain is one the user verified (or under one),
        when the deployment asks for verified domains."""
        if self.settings.api.sender_domains != "verified":
            return
        domain = domain_of(sender)
        if self.domain_cache is not None:
            verified = await self.domain_cache.get(user_id)
        else:
            verified = await self.domains.verified(user_id) if self.domains else frozenset()
        if not covers(verified, domain):
            raise ApiError(
                422,
                "invalid_fields",
                "the sender's domain is not verified",
                fields={
                    "from": f"{domain} is not a verified sending domain of yours: add it "
                    "(POST /v1/domains), publish its TXT record and verify it"
                },
            )

    async def _complete_quietly(self, user_id: uuid.UUID, idem: str, response: bytes) -> None:
        # The batch is stored: a failure here must not turn its 202 into an error. The key
        # stays in progress, and a retry finds the stored batch and its answer.
        try:
            await self.idempotency.complete(user_id, idem, response)
        except DependencyUnavailable:
            log.warning("could not record the answer of Idempotency-Key %r", idem)

    async def _release_quietly(self, user_id: uuid.UUID, idem: str, owner: uuid.UUID) -> None:
        try:
            await self.idempotency.release(user_id, idem, owner)
        except DependencyUnavailable:
            log.warning("could not release Idempotency-Key %r after a refused request", idem)


def _too_large(size: int, limit: str, most: int | None) -> ApiError:
    """The 413 of a batch of ``size`` bytes too large to store, the ``limit`` it passed, and
    the most a batch may store (``error.limit``: ``batch_bytes``; no value when the cluster
    refused less than this API was told it holds)."""
    return ApiError(
        413,
        "batch_too_large",
        f"this batch would store {size:,} bytes (its message, and its recipients with their "
        f"substitutions): {limit}; send its recipients in several batches",
        limit=("batch_bytes", most),
    )


def _invalid_as_422(
    check: Callable[P, validation.BatchRequest], *args: P.args, **kwargs: P.kwargs
) -> validation.BatchRequest:
    """``check(...)``, its InvalidRequest answered as a 422."""
    try:
        return check(*args, **kwargs)
    except validation.InvalidRequest as exc:
        raise ApiError(422, exc.code, str(exc), fields=exc.fields) from exc


@dataclass(frozen=True, slots=True)
class Extra:
    """What a request asked for beyond its message: a template's plan, a ``send_at``."""

    plan: Plan | None = None
    send_at: datetime | None = None


def answer(
    batch_id: uuid.UUID,
    parsed: validation.BatchRequest,
    message: Message | None = None,
    send_at: datetime | None = None,
) -> schema.Accepted:
    """The 202 answer for a validated request stored under ``batch_id`` (pure)."""
    use = message.template if message is not None else None
    scheduled = (
        {"status": "scheduled", "send_at": send_at.isoformat()} if send_at is not None else {}
    )
    return schema.Accepted(
        batch_id=str(batch_id),
        accepted=len(parsed.recipients),
        suppressed=list(parsed.suppressed),
        rejected=[
            schema.trusted(schema.RejectedOut, {"email": r.email, "reason": r.reason})
            for r in parsed.rejected
        ],
        skipped=[
            schema.trusted(schema.RejectedOut, {"email": r.email, "reason": r.reason})
            for r in parsed.skipped
        ],
        priority=parsed.message.lane,
        # Only a scheduled batch's, a template batch's and a warned batch's answer has these.
        **scheduled,
        **({"template": answers.template(use)} if use is not None else {}),
        **({"warnings": list(parsed.warnings)} if parsed.warnings else {}),
    )


def build_batch(
    settings: Settings,
    user_id: uuid.UUID,
    batch_id: uuid.UUID,
    parsed: validation.BatchRequest,
    *,
    extra: Extra = Extra(),
    pending: bool = False,
) -> NewBatch:
    """The batch a validated request stores under ``batch_id``, with the 202 it answers
    (``pending``: to be committed before that). A template's canary recipients come first,
    in chunks of their own (pure)."""
    message, recipients, split = parsed.message, parsed.recipients, 0
    size = chunk_size(settings.providers.chain_codes, copies=len(message.cc) + len(message.bcc))
    plan = extra.plan
    if plan is not None:
        if plan.canary is not None:
            order, split = template_use.canary_first(
                plan.template_id, [r.email for r in recipients], plan.percent
            )
            recipients = tuple(recipients[i] for i in order)
        use = template_use.use_of(plan.template_id, plan.live, plan.canary, split, size, plan.since)
        message = message.model_copy(update={"template": use})
        split = split if use.canary is not None else 0
    return NewBatch(
        batch_id=batch_id,
        user_id=user_id,
        message=message,
        recipients=recipients,
        chunk_size=size,
        response=wire(answer(batch_id, parsed, message, extra.send_at)),
        split=split,
        send_at=extra.send_at,
        pending=pending,
    )


async def _hashed(cpu: CpuLane, body: object) -> bytes:
    """:func:`validation.body_hash`, off the event loop for a large body (it encodes it)."""
    if validation.is_large(body):
        return await cpu.run(validation.body_hash, body)
    return validation.body_hash(body)
