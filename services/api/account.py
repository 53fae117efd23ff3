"""``/v1/suppressions``, ``/v1/stats`` and ``/v1/keys`` for API-key callers."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

from starlette.requests import Request
from starlette.responses import Response

from services.api.auth import require_key
from services.api.queries import decode_cursor, encode_cursor, page_limit
from shared import accounts
from shared.addresses import AddressError, address_key, normalize_email
from shared.http import JSON, ApiError, read_json
from shared.stats import MAX_RANGE_DAYS, StatsStore, zero_filled
from shared.suppressions import SuppressionStore

#: Small JSON bodies only on these endpoints.
SMALL_BODY = 16 * 1024


async def list_suppressions(request: Request) -> Response:
    key = await require_key(request)
    limit = page_limit(request, default=100, maximum=1000)
    cursor = decode_cursor(request.query_params.get("cursor"))
    after = str(cursor.get("after")) if cursor else None
    store: SuppressionStore = request.app.state.suppressions
    rows = await store.page(key.user_id, limit + 1, after)
    data = [
        {
            "email": r["email"],
            "reason": r["reason"],
            "source": r["source"],
            "event_id": r["event_id"] or None,
            "created_at": r["created_at"].replace(tzinfo=UTC).isoformat(),
        }
        for r in rows[:limit]
    ]
    more = len(rows) > limit
    return JSON(
        {"data": data, "next_cursor": encode_cursor({"after": data[-1]["email"]}) if more else None}
    )


async def add_suppression(request: Request) -> Response:
    key = await require_key(request)
    _, body = await read_json(request, SMALL_BODY)
    if not isinstance(body, dict) or not isinstance(body.get("email"), str):
        raise ApiError(422, "invalid_fields", "an email is required", fields={"email": "required"})
    reason = body.get("reason", "manual")
    if not isinstance(reason, str) or not 1 <= len(reason) <= 200:
        raise ApiError(422, "invalid_fields", "bad reason", fields={"reason": "1-200 chars"})
    try:
        email = normalize_email(body["email"])
    except AddressError as exc:
        raise ApiError(422, "invalid_fields", "bad address", fields={"email": exc.reason}) from exc
    await request.app.state.suppressions.add(key.user_id, email, reason=reason, source="api")
    return JSON({"email": address_key(email), "reason": reason}, status_code=201)


async def delete_suppression(request: Request) -> Response:
    key = await require_key(request)
    email = request.path_params["email"]
    if not await request.app.state.suppressions.remove(key.user_id, email):
        raise ApiError(404, "not_found", "that address is not suppressed")
    return Response(status_code=204)


def _date_param(request: Request, name: str, default: date) -> date:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        return date.fromisoformat(raw)
    except ValueError:
        raise ApiError(
            422, "invalid_fields", f"bad {name}", fields={name: "must be a date YYYY-MM-DD"}
        ) from None


async def get_stats(request: Request) -> Response:
    key = await require_key(request)
    today = datetime.now(UTC).date()
    end = _date_param(request, "to", today)
    start = _date_param(request, "from", end - timedelta(days=6))
    if start > end:
        raise ApiError(422, "invalid_fields", "from is after to", fields={"from": "after to"})
    if (end - start).days >= MAX_RANGE_DAYS:
        raise ApiError(
            422,
            "invalid_fields",
            "range too long",
            fields={"from": f"at most {MAX_RANGE_DAYS} days"},
        )
    stats: StatsStore = request.app.state.stats
    counts = await stats.range(key.user_id, start, end)
    return JSON({"data": zero_filled(start, end, counts)})


async def list_keys(request: Request) -> Response:
    key = await require_key(request)
    records = await accounts.list_keys(request.app.state.resources.db, key.user_id)
    return JSON({"data": [accounts.key_view(r) for r in records]})


async def create_key(request: Request) -> Response:
    key = await require_key(request)
    _, body = await read_json(request, SMALL_BODY)
    name = body.get("name", "api") if isinstance(body, dict) else None
    if not isinstance(name, str) or not 1 <= len(name) <= 100:
        raise ApiError(422, "invalid_fields", "bad name", fields={"name": "1-100 characters"})
    plaintext = await accounts.create_key(request.app.state.resources.db, key.user_id, name)
    return JSON(
        {"key": plaintext, "name": name, "note": "shown once; store it now"}, status_code=201
    )


async def revoke_key(request: Request) -> Response:
    key = await require_key(request)
    key_id = request.path_params["key_id"]
    if not await accounts.revoke_key(request.app.state.resources.db, key.user_id, key_id):
        raise ApiError(404, "not_found", "no such key")
    return Response(status_code=204)
