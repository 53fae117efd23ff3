"""Accepting a batch: the one use case under ``POST /v1/batches``, the dashboard's send form
and the original's ``POST /api/batch``.

It works on plain data: a user id, the request body as decoded JSON-shaped values (each
interface builds that from its own wire format), and an optional Idempotency-Key. It
answers the 202 body as a dict, or raises :class:`~shared.http.ApiError` (409, 422, 429,
503) for the interface to render in its own shape.

A 202 means the batch, its chunks and their recipients are in Cassandra and either the
broker confirmed ``batch.<uuid>`` or the outbox row guarantees the relay will publish it
(``shared.acceptance``). Once a batch is stored, nothing turns its answer into an error.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any, ParamSpec

import orjson
from cassandra.query import Statement
from pydantic import ValidationError

from services.api.schema import BatchIn, field_errors
from services.api.templated import TEMPLATE_FIELDS, Plan, TemplateBatches
from shared import cooldown, lanes, template_use, validation
from shared.acceptance import Acceptance
from shared.background import Background
from shared.batchstore import BatchStore, NewBatch, new_batch_id
from shared.canary_store import CanaryStore, Rollout
from shared.config import Settings
from shared.cooldown import RecentMail
from shared.domains import DomainStore, covers, domain_of
from shared.errors import DependencyUnavailable
from shared.http import ApiError
from shared.idempotency import Existing, IdempotencyStore
from shared.logs import bound
from shared.metrics import ApiMetrics
from shared.models import Message
from shared.preferences import Preferences, PreferenceStore
from shared.providers.limits import chunk_size
from shared.ratelimit import RecipientQuota
from shared.schedule_store import ScheduleStore
from shared.suppressions import SuppressionStore

log = logging.getLogger(__name__)

P = ParamSpec("P")


@dataclass(frozen=True, slots=True)
class Sending:
    """What accepting a batch needs, built once per process by the app's lifespan."""

    settings: Settings
    acceptance: Acceptance
    batches: BatchStore
    suppressions: SuppressionStore
    idempotency: IdempotencyStore
    quota: RecipientQuota
    metrics: ApiMetrics
    background: Background
    domains: DomainStore | None = None
    """The users' verified domains; without it no domain is verified (fail closed)."""
    preferences: PreferenceStore | None = None
    """The users' tracking defaults and cooldown (without it: the defaults, no cooldown)."""
    recent: RecentMail | None = None
    """When each address was last mailed (cooldown)."""
    templates: TemplateBatches | None = None
    """Batches made from the users' templates (without it: refused)."""
    schedules: ScheduleStore | None = None
    """Batches waiting for their ``send_at`` (without it: scheduling is refused)."""
    canaries: CanaryStore | None = None
    """Which batches carried a template's canary (for the rollout's judge)."""

    async def accept(
        self,
        user_id: uuid.UUID,
        body: object,
        idem: str | None,
        *,
        batch_id: uuid.UUID | None = None,
    ) -> dict[str, Any]:
        """Validate, drop suppressed recipients, honour the Idempotency-Key (a repeat gets
        the first answer), charge the daily quota and accept durably. Raises ApiError
        409/422/429, and 503 when a dependency is down before the batch is stored.

        ``batch_id`` fixes the id the batch gets when this request is the first with its
        key (a caller that stored it beforehand; see :meth:`stored`); default a new one."""
        original = body
        body, extra = await self._extra(user_id, body)
        if validation.is_large(body):
            parsed = await asyncio.to_thread(self._validated, body)
        else:
            parsed = self._validated(body)
        await self.check_sender(user_id, parsed.message.sender.email)
        prefs = await self.preferences.get(user_id) if self.preferences else Preferences()
        parsed = _invalid_as_422(validation.with_engagement, parsed, prefs)
        parsed = await self._drop_suppressed(user_id, parsed)
        if idem is None:
            return await self._accept_once(user_id, new_batch_id(time.time()), parsed, prefs, extra)
        owner = uuid.uuid4()
        claim = await self.idempotency.claim(
            user_id,
            idem,
            validation.body_hash(original),
            batch_id or new_batch_id(time.time()),
            owner,
        )
        if isinstance(claim, Existing):
            return await self._repeat(user_id, idem, claim, owner, parsed, prefs, extra)
        return await self._accept_keyed(user_id, idem, claim.batch_id, owner, parsed, prefs, extra)

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

    async def _extra(self, user_id: uuid.UUID, body: object) -> tuple[object, Extra]:
        """The body without ``send_at`` and with a template's content in place of its
        template fields, and what those asked for."""
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
                    body["send_at"],
                    datetime.now(UTC),
                    timedelta(days=self.settings.api.schedule_horizon_days),
                )
            except lanes.ScheduleError as exc:
                raise ApiError(
                    422,
                    "invalid_fields",
                    "the request has invalid fields",
                    fields={"send_at": str(exc)},
                ) from None
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
        """The body checked against the schema (``schema.BatchIn``), then by the rules a
        schema cannot state. Field errors are worded by ``shared.validation`` whenever it
        finds the problem too (it walks the whole body and names every field)."""
        shape: dict[str, str] | None = None
        try:
            BatchIn.model_validate(body)
        except ValidationError as exc:
            shape = field_errors(exc)
        try:
            parsed = validation.parse_batch_request(
                body,
                max_recipients=self.settings.api.max_recipients,
                configured=self.settings.providers.chain_codes,
                bulk_threshold=self.settings.api.bulk_threshold,
            )
        except validation.InvalidRequest as exc:
            raise ApiError(422, exc.code, str(exc), fields=exc.fields) from exc
        if shape is not None:
            raise ApiError(422, "invalid_fields", "the request has invalid fields", fields=shape)
        return parsed

    async def _repeat(
        self,
        user_id: uuid.UUID,
        idem: str,
        claim: Existing,
        owner: uuid.UUID,
        parsed: validation.BatchRequest,
        prefs: Preferences,
        extra: Extra,
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
        return await self._accept_keyed(user_id, idem, claim.batch_id, owner, parsed, prefs, extra)

    async def _accept_keyed(
        self,
        user_id: uuid.UUID,
        idem: str,
        batch_id: uuid.UUID,
        owner: uuid.UUID,
        parsed: validation.BatchRequest,
        prefs: Preferences,
        extra: Extra,
    ) -> dict[str, Any]:
        """Accept under a claimed key. The claim is released only when nothing can have been
        stored (the quota refused the batch, or the cooldown left no recipient); after any
        other failure it stays, so the client's retry finds the batch if it was stored, or
        takes the claim over once its lease ends."""
        try:
            response = await self._accept_once(user_id, batch_id, parsed, prefs, extra, keyed=True)
        except ApiError as exc:
            if exc.status in (422, 429):
                await self._release_quietly(user_id, idem, owner)
            raise
        await self._complete_quietly(user_id, idem, orjson.dumps(response))
        return response

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
        """Leave out the recipients inside the cooldown, charge the rest to today's quota
        (429 when over), store, publish.

        A failure while storing refunds the quota and answers 503. Without an
        Idempotency-Key the batch is also cancelled, best effort, in case the failed write
        lands later: the client was told it was not accepted. With a key the client's retry
        finishes it instead.
        """
        started = time.perf_counter()
        parsed = await self._drop_cooling(user_id, batch_id, parsed, prefs)
        count = parsed.mailed
        verdict, day = await self.quota.consume(user_id, count)
        if not verdict.allowed:
            raise ApiError(
                429,
                "quota_exceeded",
                f"this batch would pass the daily quota of {self.quota.daily_limit} recipients",
                headers={"Retry-After": str(verdict.retry_after)},
            )
        batch = build_batch(self.settings, user_id, batch_id, parsed, extra=extra)
        response: dict[str, Any] = orjson.loads(batch.response)
        with bound(batch_id=batch_id):
            try:
                await self.acceptance.store(batch, also=await self._also(batch))
            except DependencyUnavailable:
                await self._after_failed_store(user_id, batch_id, count, day, cancel=not keyed)
                raise
            # Stored: from here on nothing may turn this into an error (the relay publishes
            # if the broker does not confirm now; the scheduler publishes a scheduled one).
            await self._record_recent(user_id, batch_id, parsed, prefs)
            if batch.send_at is None:
                if await self.acceptance.publish(batch_id):
                    self.background.spawn(self.acceptance.outbox.done(batch_id))
                else:
                    self.metrics.deferred_publishes.inc()
        self.metrics.batches.inc()
        self.metrics.recipients.inc(count)
        self.metrics.accept_seconds.observe(time.perf_counter() - started)
        return response

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

    async def _after_failed_store(
        self, user_id: uuid.UUID, batch_id: uuid.UUID, count: int, day: date, *, cancel: bool
    ) -> None:
        try:
            if cancel:
                await self.batches.cancel(batch_id, user_id)
            await self.quota.refund(user_id, count, day)
        except DependencyUnavailable:
            log.warning(
                "batch %s: could not cancel it or refund its quota after a failure", batch_id
            )

    async def _drop_suppressed(
        self, user_id: uuid.UUID, parsed: validation.BatchRequest
    ) -> validation.BatchRequest:
        """Remove addresses (to, cc, bcc) on the user's suppression list (and on the list's
        own, for a batch naming a list); no recipient left is a 422."""
        engagement = parsed.message.engagement
        listed = await self.suppressions.suppressed(
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
) -> dict[str, Any]:
    """The 202 body for a validated request stored under ``batch_id`` (pure)."""
    out: dict[str, Any] = {
        "batch_id": str(batch_id),
        "accepted": len(parsed.recipients),
        "suppressed": list(parsed.suppressed),
        "rejected": [{"email": r.email, "reason": r.reason} for r in parsed.rejected],
        "skipped": [{"email": r.email, "reason": r.reason} for r in parsed.skipped],
        "priority": parsed.message.lane,
    }
    if send_at is not None:
        out["status"] = "scheduled"
        out["send_at"] = send_at.isoformat()
    use = message.template if message is not None else None
    if use is not None:
        out["template"] = {
            "id": str(use.id),
            "version": use.version,
            "canary_version": use.canary.version if use.canary else None,
        }
    return out


def build_batch(
    settings: Settings,
    user_id: uuid.UUID,
    batch_id: uuid.UUID,
    parsed: validation.BatchRequest,
    *,
    extra: Extra = Extra(),
) -> NewBatch:
    """The batch a validated request stores under ``batch_id``, with the 202 it answers.
    A template's canary recipients come first, in chunks of their own (pure)."""
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
        response=orjson.dumps(answer(batch_id, parsed, message, extra.send_at)),
        split=split,
        send_at=extra.send_at,
    )
