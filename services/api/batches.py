"""``/v1/batches``: submit a batch (durably, then publish), list, inspect, and read its logs.

A 202 means the batch, its chunks and their recipients are in Cassandra and either the
broker confirmed ``batch.<uuid>`` or the outbox row guarantees the relay will publish it
(``shared.acceptance``). Once a batch is stored, nothing turns its answer into an error.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import time
import uuid
from datetime import UTC, date, datetime
from typing import Any

import orjson
from cassandra.util import uuid_from_time
from starlette.requests import Request
from starlette.responses import Response

from services.api.auth import recipient_quota, require_key
from shared import validation
from shared.acceptance import Acceptance
from shared.batchstore import BatchStore, NewBatch
from shared.config import Settings
from shared.errors import DependencyUnavailable
from shared.http import JSON, ApiError, read_json
from shared.idempotency import Existing, IdempotencyStore
from shared.metrics import ApiMetrics
from shared.providers.limits import chunk_size
from shared.suppressions import SuppressionStore

from . import queries

log = logging.getLogger(__name__)

_IDEMPOTENCY_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")


async def submit(request: Request) -> Response:
    key = await require_key(request)
    settings: Settings = request.app.state.settings
    raw, body = await read_json(request, settings.api.max_body_bytes)
    idem = request.headers.get("idempotency-key")
    if idem is not None and not _IDEMPOTENCY_KEY.match(idem):
        raise ApiError(400, "bad_idempotency_key", "Idempotency-Key must be 1-255 visible ASCII")
    response = await accept_batch(request, key.user_id, body, raw, idem)
    return Response(orjson.dumps(response), status_code=202, media_type="application/json")


async def accept_batch(
    request: Request, user_id: uuid.UUID, body: object, raw: bytes, idem: str | None
) -> dict[str, Any]:
    """Everything after authentication, shared by ``POST /v1/batches`` and the dashboard:
    validation, suppressions, the Idempotency-Key (a repeat gets the first answer), the daily
    quota and durable acceptance. Raises ApiError 409/422/429, and 503 when a dependency is
    down before the batch is stored."""
    state = request.app.state
    settings: Settings = state.settings
    try:
        parsed = validation.parse_batch_request(body, max_recipients=settings.api.max_recipients)
    except validation.InvalidRequest as exc:
        raise ApiError(422, exc.code, str(exc), fields=exc.fields) from exc
    parsed = await _drop_suppressed(state.suppressions, user_id, parsed)
    if idem is None:
        return await _accept_once(request, user_id, uuid_from_time(time.time()), parsed)
    keys: IdempotencyStore = state.idempotency
    owner = uuid.uuid4()
    claim = await keys.claim(
        user_id, idem, validation.body_hash(raw), uuid_from_time(time.time()), owner
    )
    if isinstance(claim, Existing):
        return await _repeat(request, user_id, idem, claim, owner, parsed)
    return await _accept_keyed(request, user_id, idem, claim.batch_id, owner, parsed)


async def _repeat(
    request: Request,
    user_id: uuid.UUID,
    idem: str,
    claim: Existing,
    owner: uuid.UUID,
    parsed: validation.BatchRequest,
) -> dict[str, Any]:
    """A request whose key was claimed before: the stored answer, or finish the same batch."""
    state = request.app.state
    if not claim.same_body:
        raise ApiError(
            409, "idempotency_conflict", "this Idempotency-Key was used with a different body"
        )
    if claim.response is not None:
        first: dict[str, Any] = orjson.loads(claim.response)
        return first
    # In progress, or its holder failed or died: whatever happened, a stored batch is the
    # answer (finishing its acceptance if it stopped part-way).
    acceptance: Acceptance = state.acceptance
    header = await acceptance.finish(claim.batch_id)
    if header is not None and header.response is not None:
        await _complete_quietly(state.idempotency, user_id, idem, header.response)
        stored: dict[str, Any] = orjson.loads(header.response)
        return stored
    now = datetime.now(UTC)
    keys: IdempotencyStore = state.idempotency
    if not claim.expired(now) or not await keys.take_over(user_id, idem, claim, owner):
        wait = (claim.lease_until - now).total_seconds() if claim.lease_until else 1.0
        raise ApiError(
            409,
            "idempotency_in_progress",
            "a request with this Idempotency-Key is still being processed; retry",
            headers={"Retry-After": str(max(1, math.ceil(wait)))},
        )
    return await _accept_keyed(request, user_id, idem, claim.batch_id, owner, parsed)


async def _accept_keyed(
    request: Request,
    user_id: uuid.UUID,
    idem: str,
    batch_id: uuid.UUID,
    owner: uuid.UUID,
    parsed: validation.BatchRequest,
) -> dict[str, Any]:
    """Accept under a claimed key. The claim is released only when nothing can have been
    stored (the quota refused the batch); after any other failure it stays, so the client's
    retry finds the batch if it was stored, or takes the claim over once its lease ends."""
    keys: IdempotencyStore = request.app.state.idempotency
    try:
        response = await _accept_once(request, user_id, batch_id, parsed, keyed=True)
    except ApiError as exc:
        if exc.status == 429:
            await _release_quietly(keys, user_id, idem, owner)
        raise
    await _complete_quietly(keys, user_id, idem, orjson.dumps(response))
    return response


async def _accept_once(
    request: Request,
    user_id: uuid.UUID,
    batch_id: uuid.UUID,
    parsed: validation.BatchRequest,
    *,
    keyed: bool = False,
) -> dict[str, Any]:
    """Charge the recipients to today's quota (429 when over), store, publish.

    A failure while storing refunds the quota and answers 503. Without an Idempotency-Key
    the batch is also cancelled, best effort, in case the failed write lands later: the
    client was told it was not accepted. With a key the client's retry finishes it instead.
    """
    started = time.perf_counter()
    quota = recipient_quota(request)
    count = len(parsed.recipients)
    verdict, day = await quota.consume(user_id, count)
    if not verdict.allowed:
        raise ApiError(
            429,
            "quota_exceeded",
            f"this batch would pass the daily quota of {quota.daily_limit} recipients",
            headers={"Retry-After": str(verdict.retry_after)},
        )
    state = request.app.state
    batch = build_batch(state.settings, user_id, batch_id, parsed)
    try:
        await state.acceptance.store(batch)
    except DependencyUnavailable:
        await _after_failed_store(request, user_id, batch_id, count, day, cancel=not keyed)
        raise
    # Stored: from here on nothing may turn this into an error (the relay publishes if the
    # broker does not confirm now).
    if await state.acceptance.publish(batch_id):
        state.background.spawn(state.acceptance.outbox.done(batch_id))
    else:
        state.metrics.deferred_publishes.inc()
    metrics: ApiMetrics = state.metrics
    metrics.batches.inc()
    metrics.recipients.inc(count)
    metrics.accept_seconds.observe(time.perf_counter() - started)
    response: dict[str, Any] = orjson.loads(batch.response)
    return response


def build_batch(
    settings: Settings, user_id: uuid.UUID, batch_id: uuid.UUID, parsed: validation.BatchRequest
) -> NewBatch:
    """The batch a validated request stores under ``batch_id``, and the 202 it answers."""
    recipients = parsed.recipients
    response = {
        "batch_id": str(batch_id),
        "accepted": len(recipients),
        "suppressed": list(parsed.suppressed),
        "rejected": [{"email": r.email, "reason": r.reason} for r in parsed.rejected],
    }
    return NewBatch(
        batch_id=batch_id,
        user_id=user_id,
        message=parsed.message,
        recipients=recipients,
        chunk_size=chunk_size(
            settings.providers.chain_codes,
            copies=len(parsed.message.cc) + len(parsed.message.bcc),
        ),
        response=orjson.dumps(response),
    )


async def _after_failed_store(
    request: Request,
    user_id: uuid.UUID,
    batch_id: uuid.UUID,
    count: int,
    day: date,
    *,
    cancel: bool,
) -> None:
    state = request.app.state
    try:
        if cancel:
            await state.batches.cancel(batch_id, user_id)
        await recipient_quota(request).refund(user_id, count, day)
    except DependencyUnavailable:
        log.warning("batch %s: could not cancel it or refund its quota after a failure", batch_id)


async def _drop_suppressed(
    store: SuppressionStore, user_id: uuid.UUID, parsed: validation.BatchRequest
) -> validation.BatchRequest:
    """Remove addresses on the user's suppression list; none left is a 422."""
    listed = await store.suppressed(user_id, (r.email for r in parsed.recipients))
    if not listed:
        return parsed
    keep = tuple(r for r in parsed.recipients if r.email.lower() not in listed)
    suppressed = (
        *parsed.suppressed,
        *(r.email for r in parsed.recipients if r.email.lower() in listed),
    )
    if not keep:
        raise ApiError(
            422,
            "no_recipients",
            "every recipient is suppressed or rejected",
            fields={
                "to": f"no deliverable recipient: {len(suppressed)} suppressed, "
                f"{len(parsed.rejected)} rejected"
            },
        )
    return dataclasses.replace(parsed, recipients=keep, suppressed=suppressed)


async def _complete_quietly(
    keys: IdempotencyStore, user_id: uuid.UUID, idem: str, response: bytes
) -> None:
    # The batch is stored: a failure here must not turn its 202 into an error. The key stays
    # in progress, and a retry finds the stored batch and its answer.
    try:
        await keys.complete(user_id, idem, response)
    except DependencyUnavailable:
        log.warning("could not record the answer of Idempotency-Key %r", idem)


async def _release_quietly(
    keys: IdempotencyStore, user_id: uuid.UUID, idem: str, owner: uuid.UUID
) -> None:
    try:
        await keys.release(user_id, idem, owner)
    except DependencyUnavailable:
        log.warning("could not release Idempotency-Key %r after a refused request", idem)


async def list_batches(request: Request) -> Response:
    key = await require_key(request)
    limit = queries.page_limit(request)
    page = await queries.list_for_user(
        request.app.state.batches, key.user_id, limit, request.query_params.get("cursor")
    )
    return JSON(page)


async def get_batch(request: Request) -> Response:
    key = await require_key(request)
    batch_id = queries.path_uuid(request, "batch_id")
    store: BatchStore = request.app.state.batches
    header = await store.header(batch_id)
    if header is None or header.user_id != key.user_id:
        raise ApiError(404, "not_found", "no such batch")
    states, events, reasons = await queries.batch_counts(store, batch_id)
    return JSON(queries.batch_view(header, states, events, reasons))


async def batch_logs(request: Request) -> Response:
    key = await require_key(request)
    batch_id = queries.path_uuid(request, "batch_id")
    store: BatchStore = request.app.state.batches
    header = await store.header(batch_id)
    if header is None or header.user_id != key.user_id:
        raise ApiError(404, "not_found", "no such batch")
    state_filter = request.query_params.get("state")
    if state_filter is not None and state_filter not in ("queued", "success", "failed"):
        raise ApiError(
            422,
            "invalid_fields",
            "bad filter",
            fields={"state": "must be queued, success or failed"},
        )
    page = await queries.logs_page(
        store,
        request.app.state.attempts,
        batch_id,
        queries.page_limit(request, default=100),
        request.query_params.get("cursor"),
        state_filter,
    )
    return JSON(page)
