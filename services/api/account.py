"""``/v1/suppressions``, ``/v1/stats`` and ``/v1/keys`` for API-key callers."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

from starlette.requests import Request
from starlette.responses import Response

from services.api.auth import require_key
from services.api.managing import Managing
from services.api.queries import decode_cursor, encode_cursor, page_limit
from services.api.schema import KeyIn, SuppressionIn, checked
from shared.accounts import accounts
from shared.audience.suppressions import Suppressions, made_by_recipient
from shared.delivery import validation
from shared.delivery.stats import MAX_RANGE_DAYS, Stats, zero_filled
from shared.infra.http import JSON, ApiError, read_json

#: Small JSON bodies only on these endpoints.
SMALL_BODY = 16 * 1024


async def list_suppressions(request: Request) -> Response:
    key = await require_key(request, "read")
    limit = page_limit(request, default=100, maximum=1000)
    cursor = decode_cursor(request.query_params.get("cursor"))
    after = str(cursor.get("after")) if cursor else None
    store: Suppressions = request.app.state.suppressions
    rows = await store.page(key.user_id, limit + 1, after, list_param(request))
    data = [
        {
            "email": r["email"],
            "reason": r["reason"],
            "source": r["source"],
            "event_id": r["event_id"] or None,
            "created_at": r["created_at"].replace(tzinfo=UTC).isoformat(),
            "by_recipient": made_by_recipient(r),
        }
        for r in rows[:limit]
    ]
    more = len(rows) > limit
    return JSON(
        {"data": data, "next_cursor": encode_cursor({"after": data[-1]["email"]}) if more else None}
    )


async def add_suppression(request: Request) -> Response:
    key = await require_key(request, "send")
    _, body = await read_json(request, SMALL_BODY)
    wanted = checked(SuppressionIn, body)
    managing: Managing = request.app.state.managing
    done = await managing.suppress(key.user_id, wanted.email, wanted.reason, source="api")
    return JSON({"email": done.email, "reason": done.reason}, status_code=201)


async def delete_suppression(request: Request) -> Response:
    key = await require_key(request, "send")
    managing: Managing = request.app.state.managing
    scope = list_param(request)
    operator = "operator" in key.scopes  # the one who may lift a recipient's own
    if not await managing.unsuppress(
        key.user_id, request.path_params["email"], scope, operator=operator
    ):
        raise ApiError(404, "not_found", "that address is not suppressed")
    return Response(status_code=204)


def list_param(request: Request) -> str | None:
    """The ``list`` query parameter (a list or campaign name), checked; None when absent."""
    raw = request.query_params.get("list")
    if raw is None:
        return None
    if not validation.list_name(raw):
        raise ApiError(
            422, "invalid_fields", "bad list", fields={"list": validation.LIST_NAME_RULE}
        )
    return raw


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
    key = await require_key(request, "read")
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
    stats: Stats = request.app.state.stats
    counts = await stats.range(key.user_id, start, end)
    return JSON({"data": zero_filled(start, end, counts)})


async def list_keys(request: Request) -> Response:
    key = await require_key(request, "keys")
    managing: Managing = request.app.state.managing
    return JSON({"data": [accounts.key_view(r) for r in await managing.keys(key.user_id)]})


async def create_key(request: Request) -> Response:
    key = await require_key(request, "keys")
    _, body = await read_json(request, SMALL_BODY)
    wanted = checked(KeyIn, body)
    managing: Managing = request.app.state.managing
    made = await managing.create_key(
        key.user_id,
        wanted.name,
        default="api",
        holder=key.scopes,
        scopes=wanted.scopes,
        expires_at=wanted.expires_at,
    )
    return JSON(
        {
            "key": made.plaintext,
            "name": made.name,
            "scopes": list(made.scopes),
            "expires_at": wanted.expires_at.isoformat() if wanted.expires_at else None,
            "note": "shown once; store it now",
        },
        status_code=201,
    )


async def revoke_key(request: Request) -> Response:
    key = await require_key(request, "keys")
    managing: Managing = request.app.state.managing
    if not await managing.revoke_key(key.user_id, request.path_params["key_id"]):
        raise ApiError(404, "not_found", "no such key")
    return Response(status_code=204)
