"""``/v1/suppressions``, ``/v1/stats`` and ``/v1/keys`` for API-key callers."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

from starlette.requests import Request
from starlette.responses import Response

from services.api import schema
from services.api.auth import require_key
from services.api.managing import Managing
from services.api.operations import CURSOR, LIST, Param, operation
from services.api.queries import decode_cursor, encode_cursor, page_limit
from services.api.schema import KeyIn, SuppressionIn, checked
from shared.accounts import accounts
from shared.audience.suppressions import Suppressions, made_by_recipient
from shared.delivery import validation
from shared.delivery.stats import MAX_RANGE_DAYS, Stats, zero_filled
from shared.infra.http import Answer, ApiError, read_json

#: Small JSON bodies only on these endpoints.
SMALL_BODY = 16 * 1024


@operation(
    "list_suppressions",
    "Addresses you never send to",
    schema.SuppressionList,
    params=(Param("limit", "query", "1-1000, default 100.", "integer"), CURSOR, LIST),
    errors=(400, 422),
)
async def list_suppressions(request: Request) -> Response:
    key = await require_key(request, "read")
    limit = page_limit(request, default=100, maximum=1000)
    cursor = decode_cursor(request.query_params.get("cursor"))
    after = str(cursor.get("after")) if cursor else None
    store: Suppressions = request.app.state.suppressions
    rows = await store.page(key.user_id, limit + 1, after, list_param(request))
    # Up to 1,000 entries: built trusted (validated under tests).
    data = [
        schema.trusted(
            schema.Suppression,
            {
                "email": r["email"],
                "reason": r["reason"],
                "source": r["source"],
                "event_id": r["event_id"] or None,
                "created_at": r["created_at"].replace(tzinfo=UTC).isoformat(),
                "by_recipient": made_by_recipient(r),
            },
        )
        for r in rows[:limit]
    ]
    more = len(rows) > limit
    return Answer(
        schema.SuppressionList(
            data=data, next_cursor=encode_cursor({"after": data[-1].email}) if more else None
        )
    )


@operation(
    "create_suppression",
    "Suppress an address",
    schema.Suppression,
    status=201,
    body=schema.SuppressionIn,
    errors=(400, 413, 415, 422),
)
async def add_suppression(request: Request) -> Response:
    key = await require_key(request, "send")
    _, body = await read_json(request, SMALL_BODY)
    wanted = checked(SuppressionIn, body)
    managing: Managing = request.app.state.managing
    done = await managing.suppress(key.user_id, wanted.email, wanted.reason, source="api")
    return Answer(
        schema.Suppression.model_validate({"email": done.email, "reason": done.reason}),
        status_code=201,
    )


@operation(
    "delete_suppression",
    "Send to an address again",
    None,
    status=204,
    params=(Param("email", "path", "The suppressed address.", required=True), LIST),
    errors=(404, 422),
    description="You may delete the addresses you added and bounces (a bounce that "
    "happens again suppresses the address again). An unsubscribe or a complaint is the "
    "recipient's own (`by_recipient` in the listing): deleting it is a 403 "
    "`suppressed_by_recipient` naming the address and why, unless the key holds the "
    "`operator` scope.",
)
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


@operation(
    "get_stats",
    "Delivery per day (UTC), zero-filled",
    schema.StatsPage,
    params=(
        Param("from", "query", "First day, YYYY-MM-DD (default: six days before `to`)."),
        Param("to", "query", "Last day, YYYY-MM-DD (default: today)."),
    ),
    errors=(422,),
)
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
    return Answer(schema.StatsPage.model_validate({"data": zero_filled(start, end, counts)}))


@operation(
    "list_keys",
    "Your API keys (never their secrets)",
    schema.KeyList,
)
async def list_keys(request: Request) -> Response:
    key = await require_key(request, "keys")
    managing: Managing = request.app.state.managing
    return Answer(
        schema.KeyList.model_validate(
            {"data": [accounts.key_view(r) for r in await managing.keys(key.user_id)]}
        )
    )


@operation(
    "current_key",
    "The key this request is made with (any key may ask; never its secret)",
    schema.KeyView,
)
async def current_key(request: Request) -> Response:
    # The SMTP submission service checks an AUTH password this way, as any client may.
    key = await require_key(request, None)
    return Answer(schema.KeyView.model_validate(accounts.key_view(key)))


@operation(
    "create_key",
    "Make an API key (shown once)",
    schema.KeyCreated,
    status=201,
    body=schema.KeyIn,
    errors=(400, 409, 413, 415, 422),
)
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
    return Answer(
        schema.KeyCreated.model_validate(
            {
                "key": made.plaintext,
                "name": made.name,
                "scopes": list(made.scopes),
                "expires_at": wanted.expires_at.isoformat() if wanted.expires_at else None,
                "note": "shown once; store it now",
            }
        ),
        status_code=201,
    )


@operation(
    "revoke_key",
    "Revoke an API key (refused everywhere within 1 s)",
    None,
    status=204,
    params=(Param("key_id", "path", "The key's id (`key_id` in the list).", required=True),),
    errors=(404,),
)
async def revoke_key(request: Request) -> Response:
    key = await require_key(request, "keys")
    managing: Managing = request.app.state.managing
    if not await managing.revoke_key(key.user_id, request.path_params["key_id"]):
        raise ApiError(404, "not_found", "no such key")
    return Response(status_code=204)
