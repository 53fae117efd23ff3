"""``/v1/dead-letters`` (operator keys only): list the dead letters the consumers archived,
replay one (published again once; a second replay is a 409) or delete it
(``shared.ops.deadletters``)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from services.api import schema
from services.api.auth import require_key
from services.api.operations import CURSOR, LETTER_ID, Param, operation
from services.api.queries import decode_cursor, encode_cursor, page_limit
from shared.infra.http import Answer, ApiError
from shared.ops.deadletters import DeadLetters, ReplayRefused, view

_REFUSALS = {"not_found": 404, "already_replayed": 409, "replaying": 409, "unroutable": 409}


def _letters(request: Request) -> DeadLetters:
    letters: DeadLetters = request.app.state.dead_letters
    return letters


@operation(
    "list_dead_letters",
    "Dead letters: work RabbitMQ parked, newest first (operator keys)",
    schema.DeadLetterList,
    params=(Param("limit", "query", "1-500, default 50.", "integer"), CURSOR),
    errors=(400, 422),
)
async def list_dead_letters(request: Request) -> Response:
    await require_key(request, "operator")
    limit = page_limit(request, default=50, maximum=500)
    cursor = decode_cursor(request.query_params.get("cursor"))
    after = str(cursor.get("after")) if cursor else None
    found = await _letters(request).store.page(limit + 1, after)
    # Up to 500 entries: built trusted (validated under tests).
    data = [schema.trusted(schema.DeadLetterView, view(letter)) for letter in found[:limit]]
    more = len(found) > limit
    return Answer(
        schema.DeadLetterList(
            data=data, next_cursor=encode_cursor({"after": data[-1].id}) if more else None
        )
    )


@operation(
    "replay_dead_letter",
    "Publish a dead letter again, once (operator keys)",
    schema.DeadLetterView,
    params=(LETTER_ID,),
    errors=(404, 409),
    description="409 `already_replayed` for a letter replayed before (nothing is "
    "published twice), `replaying` while another replay holds it, `unroutable` when no "
    "queue takes its routing key now (it stays).",
)
async def replay_dead_letter(request: Request) -> Response:
    await require_key(request, "operator")
    try:
        letter = await _letters(request).replay(request.path_params["letter_id"])
    except ReplayRefused as exc:
        raise ApiError(_REFUSALS[exc.code], exc.code, exc.message) from None
    return Answer(schema.DeadLetterView.model_validate(view(letter)))


@operation(
    "delete_dead_letter",
    "Delete a dead letter (operator keys)",
    None,
    status=204,
    params=(LETTER_ID,),
    errors=(404,),
)
async def delete_dead_letter(request: Request) -> Response:
    await require_key(request, "operator")
    if not await _letters(request).delete(request.path_params["letter_id"]):
        raise ApiError(404, "not_found", "no such dead letter")
    return Response(status_code=204)
