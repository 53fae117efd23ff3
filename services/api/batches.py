"""``/v1/batches``: submit a batch (durably, then publish), list, inspect, and read its logs.

A 202 means the batch and one ``queued`` row per recipient are in Cassandra and either the
broker confirmed ``batch.<uuid>`` or the outbox row guarantees the relay will publish it.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import orjson
from cassandra.util import uuid_from_time
from starlette.requests import Request
from starlette.responses import Response

from services.api.auth import recipient_quota, require_key
from shared import validation
from shared.batchstore import BatchStore, NewBatch
from shared.config import Settings
from shared.errors import DependencyUnavailable, PublishError
from shared.http import JSON, ApiError, read_json
from shared.idempotency import Claimed, IdempotencyStore
from shared.metrics import ApiMetrics
from shared.models import BatchJob, Recipient
from shared.outbox import Outbox
from shared.providers.limits import chunk_size
from shared.suppressions import SuppressionStore
from shared.topology import batch_key

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
    validation, suppressions, the Idempotency-Key (a repeat returns the first response),
    the daily quota and durable acceptance. Raises ApiError 409/422/429."""
    state = request.app.state
    settings: Settings = state.settings
    try:
        parsed = validation.parse_batch_request(body, max_recipients=settings.api.max_recipients)
    except validation.InvalidRequest as exc:
        raise ApiError(422, exc.code, str(exc), fields=exc.fields) from exc
    parsed = await _drop_suppressed(state.suppressions, user_id, parsed)

    batch_id = uuid_from_time(time.time())
    keys: IdempotencyStore = state.idempotency
    if idem is not None:
        claim = await keys.claim(user_id, idem, validation.body_hash(raw), batch_id)
        if not isinstance(claim, Claimed):
            first: dict[str, Any] = orjson.loads(_replay(claim.same_body, claim.response))
            return first
    try:
        response = await _accept_within_quota(request, user_id, batch_id, parsed)
    except BaseException:
        if idem is not None:
            await _release_quietly(keys, user_id, idem)
        raise
    if idem is not None:
        await keys.complete(user_id, idem, orjson.dumps(response))
    return response


async def _accept_within_quota(
    request: Request, user_id: uuid.UUID, batch_id: uuid.UUID, parsed: validation.BatchRequest
) -> dict[str, Any]:
    """Charge the recipients to today's quota (429 when over), accept, refund on failure."""
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
    try:
        return await _accept(request, user_id, batch_id, parsed)
    except BaseException:
        try:
            await quota.refund(user_id, count, day)
        except DependencyUnavailable:
            log.warning("could not refund %d recipients of quota to user %s", count, user_id)
        raise


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


def _replay(same_body: bool, response: bytes | None) -> bytes:
    if not same_body:
        raise ApiError(
            409, "idempotency_conflict", "this Idempotency-Key was used with a different body"
        )
    if response is None:
        raise ApiError(
            409,
            "idempotency_in_progress",
            "a request with this Idempotency-Key is still being processed; retry",
        )
    return response


async def _release_quietly(keys: IdempotencyStore, user_id: uuid.UUID, idem: str) -> None:
    try:
        await keys.release(user_id, idem)
    except DependencyUnavailable:
        log.warning("could not release Idempotency-Key %r after a failed request", idem)


async def _accept(
    request: Request, user_id: uuid.UUID, batch_id: uuid.UUID, parsed: validation.BatchRequest
) -> dict[str, Any]:
    state = request.app.state
    settings: Settings = state.settings
    store: BatchStore = state.batches
    metrics: ApiMetrics = state.metrics
    started = time.perf_counter()
    now = time.time()
    recipients = [
        Recipient(
            log_id=uuid_from_time(now),
            email=r.email,
            name=r.name,
            substitutions=dict(r.substitutions),
        )
        for r in parsed.recipients
    ]
    batch = NewBatch(
        batch_id=batch_id,
        user_id=user_id,
        message=parsed.message,
        recipients=recipients,
        chunk_size=chunk_size(
            settings.providers.chain_codes,
            copies=len(parsed.message.cc) + len(parsed.message.bcc),
        ),
    )
    outbox: Outbox = state.outbox
    await outbox.add(batch_id, user_id, datetime.now(UTC))
    await store.accept(batch)
    try:
        await state.resources.broker.publish(
            batch_key(batch_id), BatchJob(batch_id=batch_id).encode(), message_id=str(batch_id)
        )
    except PublishError as exc:
        # The batch is durable and its outbox row stays: the relay publishes it later.
        log.warning("batch %s stored but not yet published (%s); the relay will", batch_id, exc)
        metrics.deferred_publishes.inc()
    else:
        state.background.spawn(outbox.done(batch_id))
    metrics.batches.inc()
    metrics.recipients.inc(len(recipients))
    metrics.accept_seconds.observe(time.perf_counter() - started)
    return {
        "batch_id": str(batch_id),
        "accepted": len(recipients),
        "suppressed": list(parsed.suppressed),
        "rejected": [{"email": r.email, "reason": r.reason} for r in parsed.rejected],
    }


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
