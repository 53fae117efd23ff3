"""``/v1/batches``: submit a batch (``services.api.sending`` accepts it), list, inspect, and
read its logs."""

from __future__ import annotations

import logging
import re

import orjson
from starlette.requests import Request
from starlette.responses import Response

from services.api import schema
from services.api.auth import require_key
from services.api.operations import BATCH_ID, CURSOR, Param, operation
from services.api.sending import Sending
from shared.delivery.batchstore import Batches, BatchHeader, BatchStore
from shared.infra.config import Settings
from shared.infra.http import Answer, ApiError, read_json

from . import answers, queries

log = logging.getLogger(__name__)

_IDEMPOTENCY_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")


@operation(
    "create_batch",
    "Submit a batch: one message, many recipients",
    schema.Accepted,
    status=202,
    body=schema.BatchIn,
    params=(
        Param(
            "Idempotency-Key",
            "header",
            "1-255 visible ASCII characters. A retry with the same key and body gets the "
            "first answer and never a second batch; with another body, 409.",
        ),
    ),
    errors=(400, 409, 413, 415, 422),
    description="A 202 means the batch is stored and will be sent exactly once per "
    "recipient: retries of a request that timed out are safe with an Idempotency-Key.",
)
async def submit(request: Request) -> Response:
    key = await require_key(request, "send")
    settings: Settings = request.app.state.settings
    _, body = await read_json(request, settings.api.max_body_bytes)
    idem = request.headers.get("idempotency-key")
    if idem is not None and not _IDEMPOTENCY_KEY.fullmatch(idem):
        raise ApiError(400, "bad_idempotency_key", "Idempotency-Key must be 1-255 visible ASCII")
    sending: Sending = request.app.state.sending
    response = await sending.accept(key.user_id, body, idem)
    # The answer stored with the batch, rendered from ``schema.Accepted`` when it was accepted
    # (``sending.build_batch``): sent as it was, so a retry gets the first answer byte for byte
    # (one stored by an older release too), and nothing is validated again on the loop.
    return Response(orjson.dumps(response), status_code=202, media_type="application/json")


@operation(
    "list_batches",
    "Your batches, newest first",
    schema.BatchList,
    params=(Param("limit", "query", "1-500, default 20.", "integer"), CURSOR),
    errors=(400, 422),
)
async def list_batches(request: Request) -> Response:
    key = await require_key(request, "read")
    limit = queries.page_limit(request)
    page = await queries.list_for_user(
        request.app.state.batches, key.user_id, limit, request.query_params.get("cursor")
    )
    return Answer(answers.batch_list(page))


async def _own_batch(request: Request, scope: str) -> BatchHeader:
    """The header of the path's batch, when it is the key's user's (else 404)."""
    key = await require_key(request, scope)
    store: Batches = request.app.state.batches
    header = await store.header(queries.path_uuid(request, "batch_id"))
    if header is None or header.user_id != key.user_id:
        raise ApiError(404, "not_found", "no such batch")
    return header


@operation(
    "get_batch",
    "A batch with counts per state and event",
    schema.BatchView,
    params=(BATCH_ID,),
    errors=(404,),
)
async def get_batch(request: Request) -> Response:
    header = await _own_batch(request, "read")
    return Answer(answers.batch(await queries.overview(request.app.state.batches, header)))


@operation(
    "cancel_batch",
    "Cancel a scheduled batch before its time",
    schema.CancelledOut,
    params=(BATCH_ID,),
    errors=(404, 409),
    description="Only a batch still `scheduled` can be cancelled (409 once it started); "
    "cancelling it again answers the same. Its recipients are given back to the day's "
    "quota.",
)
async def cancel_batch(request: Request) -> Response:
    """Cancel a batch still waiting for its ``send_at``; its recipients go back to the
    quota of the day it was accepted (``Sending.cancel``)."""
    header = await _own_batch(request, "send")
    sending: Sending = request.app.state.sending
    await sending.cancel(header)
    return Answer(schema.CancelledOut(batch_id=str(header.batch_id), status="cancelled"))


@operation(
    "list_batch_logs",
    "Each recipient's state, provider attempts and timeline",
    schema.LogsPage,
    params=(
        BATCH_ID,
        Param("state", "query", "Only `queued`, `success` or `failed` recipients."),
        Param("limit", "query", "1-500, default 100.", "integer"),
        CURSOR,
    ),
    errors=(400, 404, 422),
)
async def batch_logs(request: Request) -> Response:
    header = await _own_batch(request, "read")
    batch_id = header.batch_id
    store: BatchStore = request.app.state.batches
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
    return Answer(answers.logs_page(page))
