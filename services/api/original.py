"""``/api/*``: the Go original's HTTP API, for its existing clients, over our use cases.

Same routes, field names and answer shapes (``services.api.original_form``), minus its
defects; README "The original's API" lists each difference. In short: real status codes
(it answered every JSON error with 200); ``api_key`` is one of our API keys (or a ``Bearer``
header), ``user_id`` optional but checked when given; a dashboard session works where it
did (limited per user as the dashboard's sends are, as keys are per key), and a POST on a
session must come from our own origin; a bad batch id is a 400, another
user's batch a 404 (as a missing one: no existence oracle); ``page`` pages the logs;
``/api/user`` is read-only and never shows a key.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl

from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from services.api import queries
from services.api.auth import admit_key, bearer_token, limit_user
from services.api.original_form import (
    Fields,
    batch_body,
    batch_row,
    first,
    has_essentials,
    is_multipart,
    log_row,
    stat_rows,
)
from services.api.sending import Sending
from services.api.sessions import current_user, own_origins, same_origin
from shared.core.digits import natural
from shared.delivery.batchstore import BatchHeader, BatchStore
from shared.delivery.recipients import RecipientStore
from shared.delivery.stats import Stats, zero_filled
from shared.infra.config import Settings
from shared.infra.http import ApiError, read_capped

#: The original's page size for batches and logs.
PAGE = 20
#: Pages of logs one request may skip to (20 rows each).
MAX_PAGE = 500


class Refused(Exception):
    """An answer in the original's error shape: ``{"error": message}`` with ``status``."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _handler(endpoint: Any) -> Any:
    """Render Refused and our own ApiErrors in the original's shape."""

    async def wrapped(request: Request) -> Response:
        try:
            response: Response = await endpoint(request)
        except Refused as exc:
            return _error(exc.status, exc.message, exc.headers)
        except ApiError as exc:
            return _error(exc.status, exc.message, exc.headers)
        return response

    return wrapped


async def _fields(request: Request, *, body: bool) -> Fields:
    """The query string's fields, then the body's (urlencoded or multipart; any other body
    is not read, as the original never parsed JSON), as Go's ``request.Form`` merges them;
    no files."""
    fields: dict[str, list[str]] = {}
    for name, value in request.query_params.multi_items():
        fields.setdefault(name, []).append(value)
    ctype = request.headers.get("content-type", "")
    urlencoded = ctype.split(";")[0].strip().lower() == "application/x-www-form-urlencoded"
    if body and (urlencoded or is_multipart(ctype)):
        settings: Settings = request.app.state.settings
        raw = await read_capped(request, settings.api.max_body_bytes)
        most = settings.api.max_recipients + 32
        try:
            pairs = (
                parse_qsl(raw.decode(), keep_blank_values=True, max_num_fields=most)
                if urlencoded
                else await _multipart(request, raw, most)
            )
        except (ValueError, MultiPartException) as exc:
            raise Refused(400, "Wrong parameters sent") from exc
        for name, value in pairs:
            fields.setdefault(name, []).append(value)
    return fields


async def _multipart(request: Request, raw: bytes, most: int) -> list[tuple[str, str]]:
    async def body() -> AsyncGenerator[bytes, None]:
        yield raw

    parser = MultiPartParser(request.headers, body(), max_files=0, max_fields=most)
    form = await parser.parse()
    return [(name, item) for name, item in form.multi_items() if isinstance(item, str)]


async def _caller(request: Request, fields: Fields, *, denied: str) -> uuid.UUID:
    """The user behind the request: a ``Bearer`` key, the ``api_key`` field (with
    ``user_id``, when given, matching its owner), or the dashboard session."""
    token = bearer_token(request) or first(fields, "api_key")
    if token:
        record = await admit_key(request, token)
        claimed = first(fields, "user_id")
        if record is None or (claimed and claimed != str(record.user_id)):
            raise Refused(403, denied)
        scope = "send" if request.method == "POST" else "read"
        if scope not in record.scopes:
            raise Refused(403, f"this API key lacks the {scope!r} scope")
        return record.user_id
    user = await current_user(request)
    if user is None:
        raise Refused(403, denied)
    if request.method == "POST" and not _from_our_origin(request):
        raise Refused(403, "Action Forbidden")
    await limit_user(request, user.user_id)  # as a key is limited, by admit_key
    return user.user_id


def _from_our_origin(request: Request) -> bool:
    """A cookie-authenticated POST must say it comes from our own pages (the original UI's
    form posts do; a cross-site form cannot)."""
    origin = request.headers.get("origin")
    site = request.headers.get("sec-fetch-site")
    if origin is None and site is None:
        return False
    return same_origin(origin, site, own_origins(request)) and site != "same-site"


async def post_batch(request: Request) -> Response:
    fields = await _fields(request, body=True)
    user_id = await _caller(request, fields, denied="Access denied")
    if not has_essentials(fields) or not fields.get("to"):
        raise Refused(400, "Wrong parameters sent")
    sending: Sending = request.app.state.sending
    try:
        accepted = await sending.accept(user_id, batch_body(fields), None)
    except ApiError as exc:
        if exc.status == 422:
            raise Refused(400, "Wrong parameters sent") from exc
        raise
    return JSONResponse({"status": "success", "batch_id": accepted["batch_id"]}, status_code=202)


async def _owned_header(request: Request, fields: Fields) -> BatchHeader:
    raw = request.path_params["batch_id"]
    if len(raw) < 36:
        raise Refused(400, "Invalid Batch ID")
    try:
        batch_id = uuid.UUID(raw)
    except ValueError:
        raise Refused(400, "Invalid Batch ID") from None
    user_id = await _caller(request, fields, denied="Not a valid api_key or user_id")
    store: BatchStore = request.app.state.batches
    # Our batch ids are time UUIDs; Cassandra refuses any other kind in their column.
    header = await store.header(batch_id) if batch_id.version == 1 else None
    if header is None or header.user_id != user_id:
        raise Refused(404, "Batch doesn't exists")
    return header


async def get_batch(request: Request) -> Response:
    fields = await _fields(request, body=False)
    header = await _owned_header(request, fields)
    store: BatchStore = request.app.state.batches
    view = await queries.overview(store, header)
    rows = await RecipientStore(store.db, store.stats).batch_rows(header.batch_id)
    to = [r["email"] for r in sorted(rows, key=lambda r: (r["chunk"], str(r["email"])))]
    return JSONResponse(batch_row(header, view.status, view.failure_reasons, to))


async def get_logs(request: Request) -> Response:
    fields = await _fields(request, body=False)
    header = await _owned_header(request, fields)
    page = natural(first(fields, "page") or "1")
    if page is None or not 1 <= page <= MAX_PAGE:
        raise Refused(400, f"page must be a whole number from 1 to {MAX_PAGE}")
    state = request.app.state
    cursor: str | None = None
    data: list[queries.RecipientLog] = []
    for number in range(1, int(page) + 1):
        result = await queries.logs_page(
            state.batches, state.attempts, header.batch_id, PAGE, cursor, None
        )
        if number == int(page):
            data = result.items
        cursor = result.next_cursor
        if cursor is None:
            break
    created = header.created_at.astimezone(UTC).isoformat()
    return JSONResponse(
        [log_row(entry, str(header.batch_id), str(header.user_id), created) for entry in data]
    )


async def get_batches(request: Request) -> Response:
    fields = await _fields(request, body=False)
    user_id = await _caller(request, fields, denied="Not a valid api_key or user_id")
    store: BatchStore = request.app.state.batches
    page = await queries.list_for_user(store, user_id, PAGE, None)
    headers = await asyncio.gather(*(store.header(item.batch_id) for item in page.items))
    rows = []
    for item, header in zip(page.items, headers, strict=True):
        if header is None:
            continue
        row = batch_row(header, item.status, {}, None, created_at=item.created_at)
        rows.append({**row, "recipients": item.recipients})
    return JSONResponse(rows)


async def get_stats(request: Request) -> Response:
    fields = await _fields(request, body=False)
    user_id = await _caller(request, fields, denied="Access Denied")
    stats: Stats = request.app.state.stats
    end = datetime.now(UTC).date()
    start = end - timedelta(days=6)
    counts = await stats.range(user_id, start, end)
    return JSONResponse(stat_rows(str(user_id), zero_filled(start, end, counts)))


async def get_user(request: Request) -> Response:
    user = await current_user(request)
    if user is None:
        raise Refused(403, "Please Login first")
    return JSONResponse(
        {
            "success": True,
            "email": user.email or "",
            "name": user.name or user.login,
            "avatar_url": user.avatar_url or "",
            "company": "",
            "location": "",
            "uuid": str(user.user_id),
            "login": user.login,
            # Keys are shown once, when made (dashboard or POST /v1/keys), never again.
            "api_key": None,
        }
    )


def original_routes() -> list[BaseRoute]:
    """Every route with and without its trailing ``/``, as the original matched them."""
    table = [
        ("/api/batch", post_batch, "POST"),
        ("/api/batches", get_batches, "GET"),
        ("/api/batch/{batch_id}", get_batch, "GET"),
        ("/api/batch/{batch_id}/logs", get_logs, "GET"),
        ("/api/stats", get_stats, "GET"),
        ("/api/user", get_user, "GET"),
    ]
    return [
        Route(path + slash, _handler(endpoint), methods=[method])
        for path, endpoint, method in table
        for slash in ("", "/")
    ]
