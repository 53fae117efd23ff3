"""Dashboard page handlers: server-rendered HTML over the same stores and read models as ``/v1``.

Every handler is wrapped by :func:`page`, which turns the ways a page can fail into HTML
rather than the API's JSON envelope: not logged in → 302 to ``/login``; an
:class:`~shared.infra.http.ApiError` → an error page with its status; a dependency down → a 503
page with ``Retry-After``; anything else → a logged 500 page without a stack trace. It also
sets the security headers (CSP without inline script or style, no framing, no caching).

State changes are POSTed forms carrying the session's CSRF token (checked by
:func:`services.api.sessions.verify_csrf`) and answered with a 303 redirect (or, for a form
with errors, the form again with status 422 and the errors beside their fields).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from services.api import cooldown, openapi, queries
from services.api.auth import limit_user
from services.api.dashboard import views
from services.api.domains import SendingDomains
from services.api.managing import Managing
from services.api.sending import Sending
from services.api.session_store import safe_next
from services.api.sessions import (
    LoginRequired,
    SessionUser,
    clear_session_cookie,
    current_user,
    is_operator,
    login_required_response,
    require_user,
    verify_csrf,
)
from shared.accounts import accounts, apikeys
from shared.audience.suppressions import Suppressions
from shared.core.addresses import address_key
from shared.core.errors import DependencyUnavailable
from shared.delivery.batchstore import Batches, BatchHeader, BatchStore
from shared.delivery.stats import Stats, zero_filled
from shared.infra.config import Settings
from shared.infra.db import Database
from shared.infra.http import ApiError, read_capped
from shared.outbound.hook_store import HookStore

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"

#: Body cap of the small forms (keys, suppressions, logout); the send form uses the API's.
SMALL_FORM = 16 * 1024
#: Days on the overview chart.
OVERVIEW_DAYS = 7
#: Rows per page.
BATCHES_PER_PAGE = 20
LOGS_PER_PAGE = 50
SUPPRESSIONS_PER_PAGE = 50
#: Recipient summary states a batch page can filter on.
STATES = ("queued", "success", "failed")

_IDEMPOTENCY_KEY = re.compile(r"^[A-Za-z0-9-]{1,100}$")
_CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; "
    "object-src 'none'"
)
_HEADERS = {
    "Content-Security-Policy": _CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
_NAV = (
    ("/", "Overview", "overview"),
    ("/batches", "Batches", "batches"),
    ("/send", "Send", "send"),
    ("/keys", "API keys", "keys"),
    ("/suppressions", "Suppressions", "suppressions"),
    ("/lists", "Lists", "lists"),
    ("/campaigns", "Campaigns", "campaigns"),
    ("/domains", "Domains", "domains"),
    ("/webhooks", "Webhooks", "webhooks"),
    ("/templates", "Templates", "templates"),
    ("/v1/docs", "API", "docs"),
)

Handler = Callable[[Request], Awaitable[Response]]


# --------------------------------------------------------------------------- templates


def _asset_versions() -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()[:10]
        for p in STATIC.iterdir()
        if p.is_file()
    }


@functools.cache
def create_templates() -> Jinja2Templates:
    """The dashboard's Jinja2 environment: autoescaped, strict about undefined names. One per
    process, made at the first call: nothing in it belongs to one app, and its pages then
    compile once however many apps a process makes (the test suite makes hundreds, 0.2 s of
    CPU each)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    versions = _asset_versions()
    env.globals["asset"] = lambda name: f"/static/{name}?v={versions.get(name, '0')}"
    env.globals["nav"] = _NAV
    env.globals["initials"] = views.initials
    env.filters["number"] = lambda n: f"{int(n):,}"
    return Jinja2Templates(env=env)


def compile_pages(templates: Jinja2Templates) -> None:
    """Compile every page of ``templates`` now (5-20 ms each: done before serving, in a
    worker thread, rather than on the event loop at each page's first request)."""
    for path in sorted(TEMPLATES.glob("*.html")):
        templates.env.get_template(path.name)


def _templates(request: Request) -> Jinja2Templates:
    state = request.app.state
    templates: Jinja2Templates | None = getattr(state, "templates", None)
    if templates is None:
        templates = state.templates = create_templates()
    return templates


def render(
    request: Request,
    name: str,
    context: Mapping[str, Any] | None = None,
    *,
    status: int = 200,
    headers: Mapping[str, str] | None = None,
) -> Response:
    user = getattr(request.state, "user", None)
    settings: Settings | None = getattr(request.app.state, "settings", None)
    base: dict[str, Any] = {
        "user": user,
        "operator": settings is not None and is_operator(settings, user),
        "active": None,
        "notice": None,
        "title": "",
    }
    base.update(context or {})
    return _templates(request).TemplateResponse(
        request, name, base, status_code=status, headers=dict(headers or {})
    )


# --------------------------------------------------------------------------- errors


_ERROR_TITLES = {
    400: "Bad request",
    403: "Not allowed",
    404: "Not found",
    409: "Conflict",
    413: "Too large",
    415: "Unsupported form",
    422: "Invalid request",
    429: "Slow down",
    500: "Something went wrong",
    503: "Temporarily unavailable",
}


def error_page(
    request: Request, status: int, message: str, *, headers: Mapping[str, str] | None = None
) -> Response:
    return render(
        request,
        "error.html",
        {"title": _ERROR_TITLES.get(status, "Error"), "status": status, "message": message},
        status=status,
        headers=headers,
    )


def page(handler: Handler) -> Handler:
    """Wrap a page handler: HTML error pages, login redirects and security headers."""

    @functools.wraps(handler)
    async def wrapped(request: Request) -> Response:
        try:
            response = await handler(request)
        except LoginRequired as exc:
            response = await login_required_response(request, exc)
        except ApiError as exc:
            response = error_page(request, exc.status, exc.message, headers=exc.headers)
        except DependencyUnavailable as exc:
            log.warning("%s %s: %s", request.method, request.url.path, exc)
            response = error_page(
                request,
                503,
                "A service Safedelivr depends on is not answering right now, so this request "
                "could not be completed. Please try again in a few seconds.",
                headers={"Retry-After": "5"},
            )
        except Exception:
            log.exception("dashboard page %s %s failed", request.method, request.url.path)
            response = error_page(request, 500, "The error has been logged.")
        for name, value in _HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    return wrapped


def _managing(request: Request) -> Managing:
    managing: Managing = request.app.state.managing
    return managing


async def page_user(request: Request) -> SessionUser:
    """The logged-in user (the login page for anyone else), kept for the page's header."""
    user = await require_user(request)
    request.state.user = user
    return user


def _state(request: Request) -> Any:
    return request.app.state


def _db(request: Request) -> Database:
    db: Database = request.app.state.resources.db
    return db


def see_other(path: str, **params: str | int) -> RedirectResponse:
    query = urlencode({k: str(v) for k, v in params.items()})
    return RedirectResponse(f"{path}?{query}" if query else path, status_code=303)


async def read_form(request: Request, limit: int = SMALL_FORM) -> dict[str, str]:
    """An urlencoded form body, read under ``limit`` (413 beyond it, while it streams in)."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/x-www-form-urlencoded":
        raise ApiError(415, "unsupported_media_type", "submit the form from the dashboard page")
    raw = await read_capped(request, limit)
    try:
        return views.parse_form(raw)
    except ValueError:
        raise ApiError(400, "bad_form", "the form could not be read") from None


async def checked_form(
    request: Request, user: SessionUser, limit: int = SMALL_FORM
) -> dict[str, str]:
    """A form :func:`read_form` reads, once its CSRF token is the user's."""
    form = await read_form(request, limit)
    await verify_csrf(request, user, form.get("csrf_token"))
    return form


# --------------------------------------------------------------------------- login, overview


@page
async def login(request: Request) -> Response:
    """The login page; a logged-in visitor goes straight on to ``next``."""
    next_path = request.query_params.get("next")
    user = await current_user(request)
    if user is not None:
        return RedirectResponse(safe_next(next_path), status_code=302)
    return render(
        request,
        "login.html",
        {
            "title": "Log in",
            "login_href": views.login_url(next_path),
            # Whether a login failed, never the query's text: a link could put any words on
            # our page ("your account is suspended, call ...").
            "error": "error" in request.query_params,
        },
    )


@page
async def api_docs(request: Request) -> Response:
    """The API reference, rendered here from ``/v1/openapi.json`` (no script, no CDN)."""
    user = await current_user(request)
    request.state.user = user
    context = {
        "title": "API reference",
        "active": "docs",
        **openapi.reference(openapi.openapi_doc(request)),
    }
    return render(request, "api_docs.html", context)


@page
async def overview(request: Request) -> Response:
    """Greeting, the last seven days of delivery per day, rates and the latest batches."""
    user = await page_user(request)
    state = _state(request)
    stats: Stats = state.stats
    end = datetime.now(UTC).date()
    start = end - timedelta(days=OVERVIEW_DAYS - 1)
    counts = await stats.range(user.user_id, start, end)
    recent = await queries.list_for_user(state.batches, user.user_id, 5, None)
    hooks = await HookStore(state.resources.db).endpoints(user.user_id)
    return render(
        request,
        "overview.html",
        {
            "title": "Overview",
            "active": "overview",
            "o": views.overview(zero_filled(start, end, counts)),
            "recent": views.batch_rows(recent.items),
            "disabled_hooks": [e for e in hooks if not e.enabled and e.disabled_at],
        },
    )


# --------------------------------------------------------------------------- batches


@page
async def batch_list(request: Request) -> Response:
    """The user's batches, newest first, one page per cursor."""
    user = await page_user(request)
    limit = queries.page_limit(request, default=BATCHES_PER_PAGE, maximum=100)
    cursor = request.query_params.get("cursor")
    result = await queries.list_for_user(_state(request).batches, user.user_id, limit, cursor)
    return render(
        request,
        "batches.html",
        {
            "title": "Batches",
            "active": "batches",
            "rows": views.batch_rows(result.items),
            "next_cursor": result.next_cursor,
            "paged": bool(cursor),
        },
    )


async def _owned_header(request: Request, user: SessionUser) -> BatchHeader:
    batch_id = queries.path_uuid(request, "batch_id")
    store: Batches = _state(request).batches
    header = await store.header(batch_id)
    if header is None or header.user_id != user.user_id:
        raise ApiError(404, "not_found", "There is no such batch in your account.")
    return header


@page
async def batch_detail(request: Request) -> Response:
    """One batch: status, counts per state, and its recipients with their timelines."""
    user = await page_user(request)
    header = await _owned_header(request, user)
    state = _state(request)
    store: BatchStore = state.batches
    detail = views.batch_detail(await queries.overview(store, header))
    state_filter = request.query_params.get("state") or None
    if state_filter is not None and state_filter not in STATES:
        raise ApiError(404, "not_found", "There is no such recipient state.")
    cursor = request.query_params.get("cursor")
    logs = await queries.logs_page(
        store, state.attempts, header.batch_id, LOGS_PER_PAGE, cursor, state_filter
    )
    return render(
        request,
        "batch.html",
        {
            "title": f"Batch {detail.subject}",
            "active": "batches",
            "b": detail,
            "logs": views.log_rows(logs.items, header.created_at),
            "next_cursor": logs.next_cursor,
            "paged": bool(cursor),
            "state_filter": state_filter,
            "states": STATES,
            "notice": "The batch was cancelled: none of it is sent, and its recipients "
            "are back in the day's quota."
            if request.query_params.get("cancelled") == "1" and header.status == "cancelled"
            else views.accepted_notice(request.query_params),
        },
    )


@page
async def cancel_batch(request: Request) -> Response:
    """Cancel a batch still waiting for its ``send_at`` (as ``POST /v1/batches/{id}/cancel``:
    409 once it started)."""
    user = await page_user(request)
    await checked_form(request, user)
    header = await _owned_header(request, user)
    sending: Sending = request.app.state.sending
    await sending.cancel(header)
    return see_other(f"/batches/{header.batch_id}", cancelled=1)


# --------------------------------------------------------------------------- send


def _send_form(
    request: Request,
    values: Mapping[str, str],
    *,
    errors: Mapping[str, list[str]] | None = None,
    status: int = 200,
    headers: Mapping[str, str] | None = None,
) -> Response:
    return render(
        request,
        "send.html",
        {
            "title": "Send",
            "active": "send",
            "values": {k: values.get(k, "") for k in ("from", "to", "subject", "text", "html")},
            "bulk": values.get("bulk") in ("on", "true", "1"),
            "idempotency_key": values.get("idempotency_key") or uuid.uuid4().hex,
            "errors": dict(errors or {}),
        },
        status=status,
        headers=headers,
    )


async def accept_body(
    request: Request, user_id: uuid.UUID, body: dict[str, Any], idem: str | None
) -> dict[str, Any]:
    """Accept a batch body exactly as ``POST /v1/batches`` does after authentication."""
    sending: Sending = request.app.state.sending
    return await sending.accept(user_id, body, idem)


@page
async def send(request: Request) -> Response:
    """The compose form; POST accepts the batch and redirects to its page."""
    user = await page_user(request)
    if request.method != "POST":
        return _send_form(request, {})
    settings: Settings = request.app.state.settings
    form = await checked_form(request, user, settings.api.max_body_bytes)
    body = views.compose_body(form)
    raw_key = form.get("idempotency_key") or ""
    idem = f"dashboard-{raw_key}" if _IDEMPOTENCY_KEY.match(raw_key) else None
    try:
        # Counted once the form is read and its CSRF token checked: a cross-site page cannot
        # spend the user's budget, and a refused form keeps what they typed.
        await limit_user(request, user.user_id)
        result = await accept_body(request, user.user_id, body, idem)
    except ApiError as exc:
        if exc.status not in (409, 422, 429):
            raise
        wait = (exc.headers or {}).get("Retry-After")
        errors = views.send_errors(exc.code, exc.message, exc.fields, body["to"], wait=wait)
        if exc.code == "idempotency_conflict":  # the form changed since: a new batch
            form = {**form, "idempotency_key": ""}
        return _send_form(request, form, errors=errors, status=exc.status, headers=exc.headers)
    except DependencyUnavailable as exc:
        # Keep what the user typed (and the same idempotency key: a retry cannot duplicate).
        log.warning("send form: %s", exc)
        errors = views.send_errors("unavailable", str(exc), None, body["to"])
        return _send_form(request, form, errors=errors, status=503, headers={"Retry-After": "5"})
    return see_other(
        f"/batches/{result['batch_id']}",
        sent=1,
        accepted=result["accepted"],
        rejected=len(result["rejected"]),
        suppressed=len(result["suppressed"]),
        cooling=sum(1 for s in result.get("skipped") or () if s["reason"] == cooldown.REASON),
    )


# --------------------------------------------------------------------------- keys


async def _keys_page(
    request: Request, user: SessionUser, *, status: int = 200, **extra: Any
) -> Response:
    records = await _managing(request).keys(user.user_id)
    rows = views.key_rows(accounts.key_view(r) for r in records)
    revoked = extra.pop("revoked", None)
    context: dict[str, Any] = {
        "title": "API keys",
        "active": "keys",
        "keys": rows,
        "errors": {},
        "name": "",
        "lifetimes": views.KEY_LIFETIMES,
        "notice": views.revoked_notice(rows, revoked),
    }
    context.update(extra)
    return render(request, "keys.html", context, status=status)


@page
async def keys(request: Request) -> Response:
    """List keys; POST creates one and shows it once."""
    user = await page_user(request)
    if request.method != "POST":
        return await _keys_page(request, user, revoked=request.query_params.get("revoked"))
    form = await checked_form(request, user)
    scopes, expires_at = views.key_form(form, datetime.now(UTC))
    try:
        made = await _managing(request).create_key(
            user.user_id,
            form.get("name"),
            default="dashboard",
            holder=apikeys.DEFAULT_SCOPES,  # operator keys come from the CLI only
            scopes=scopes,
            expires_at=expires_at,
        )
    except ApiError as exc:
        if exc.status == 409:
            errors = {"name": [exc.message]}
        else:
            errors = views.form_errors(exc.fields or {}, form_fields={"name", "scopes"})
        return await _keys_page(request, user, name=form.get("name", ""), errors=errors, status=422)
    return render(
        request,
        "key_created.html",
        {
            "title": "New API key",
            "active": "keys",
            "key": made.plaintext,
            "name": made.name,
            "api_url": request.app.state.settings.api.public_url.rstrip("/"),
        },
        status=201,
    )


@page
async def end_sessions(request: Request) -> Response:
    """Log out everywhere: every session of this user, this one included, stops working."""
    user = await page_user(request)
    await checked_form(request, user)
    await accounts.end_sessions(request.app.state.resources.db, user.user_id)
    response = see_other("/")
    clear_session_cookie(response, request.app.state.settings)
    return response


@page
async def revoke_key(request: Request) -> Response:
    user = await page_user(request)
    await checked_form(request, user)
    key_id = request.path_params["key_id"]
    if not await _managing(request).revoke_key(user.user_id, key_id):
        raise ApiError(404, "not_found", "There is no such key in your account.")
    return see_other("/keys", revoked=key_id)


# --------------------------------------------------------------------------- suppressions


async def _suppressions_page(
    request: Request, user: SessionUser, *, status: int = 200, **extra: Any
) -> Response:
    cursor = queries.decode_cursor(request.query_params.get("cursor"))
    after = str(cursor.get("after")) if cursor else None
    store: Suppressions = _state(request).suppressions
    rows = await store.page(user.user_id, SUPPRESSIONS_PER_PAGE + 1, after)
    shown = views.suppression_rows(rows[:SUPPRESSIONS_PER_PAGE])
    more = len(rows) > SUPPRESSIONS_PER_PAGE
    context: dict[str, Any] = {
        "title": "Suppressions",
        "active": "suppressions",
        "rows": shown,
        "next_cursor": queries.encode_cursor({"after": shown[-1].email}) if more else None,
        "paged": after is not None,
        "errors": {},
        "values": {"email": "", "reason": ""},
        "problem": None,
    }
    context.update(extra)
    return render(request, "suppressions.html", context, status=status)


@page
async def suppressions(request: Request) -> Response:
    """The suppression list; POST adds an address (as ``POST /v1/suppressions`` does)."""
    user = await page_user(request)
    if request.method != "POST":
        notice = views.suppression_notice(request.query_params)
        return await _suppressions_page(request, user, notice=notice)
    form = await checked_form(request, user)
    values = {"email": form.get("email", "").strip(), "reason": form.get("reason", "").strip()}
    try:
        done = await _managing(request).suppress(
            user.user_id, values["email"], values["reason"], source="dashboard"
        )
    except ApiError as exc:
        errors = views.form_errors(exc.fields or {}, form_fields={"email", "reason"})
        return await _suppressions_page(request, user, status=422, errors=errors, values=values)
    return see_other("/suppressions", added=done.email)


@page
async def remove_suppression(request: Request) -> Response:
    user = await page_user(request)
    form = await checked_form(request, user)
    email = form.get("email", "").strip()
    try:
        removed = await _managing(request).unsuppress(user.user_id, email)
    except ApiError as exc:
        if exc.status != 403:
            raise
        return await _suppressions_page(request, user, status=403, problem=f"{exc.message}.")
    if removed:
        return see_other("/suppressions", removed=address_key(email))
    return see_other("/suppressions", absent=address_key(email))


# --------------------------------------------------------------------------- domains


async def _domains_page(
    request: Request, user: SessionUser, *, status: int = 200, **extra: Any
) -> Response:
    use = SendingDomains.of(request)
    found = await use.store.all(user.user_id)
    others = await use.others(user.user_id, found)
    context: dict[str, Any] = {
        "title": "Sending domains",
        "active": "domains",
        "rows": views.domain_rows(found, use.rules, others),
        "errors": {},
        "values": {"domain": ""},
        "problem": None,
        "settings": request.app.state.settings.api,
    }
    context.update(extra)
    return render(request, "domains.html", context, status=status)


@page
async def domains_page(request: Request) -> Response:
    """The user's sending domains; POST adds one (as ``POST /v1/domains`` does)."""
    user = await page_user(request)
    if request.method != "POST":
        notice = views.domain_notice(request.query_params)
        return await _domains_page(request, user, notice=notice)
    form = await checked_form(request, user)
    values = {"domain": form.get("domain", "").strip()}
    try:
        added = await SendingDomains.of(request).add(user.user_id, values["domain"])
    except ApiError as exc:
        fields = exc.fields or {"domain": exc.message}
        errors = views.form_errors(fields, form_fields={"domain"})
        return await _domains_page(request, user, status=exc.status, errors=errors, values=values)
    return see_other("/domains", added=added.domain)


@page
async def verify_domain(request: Request) -> Response:
    """Look the domain's TXT record up now; the page says what is missing if it is not there."""
    user = await page_user(request)
    form = await checked_form(request, user)
    try:
        done = await SendingDomains.of(request).verify(user.user_id, form.get("domain", ""))
    except ApiError as exc:
        if exc.status != 422:
            raise
        return await _domains_page(request, user, status=422, problem=exc.message)
    return see_other("/domains", verified=done.domain)


@page
async def remove_domain(request: Request) -> Response:
    user = await page_user(request)
    form = await checked_form(request, user)
    name = form.get("domain", "")
    await SendingDomains.of(request).remove(user.user_id, name)
    return see_other("/domains", removed=name)


# --------------------------------------------------------------------------- routes


def dashboard_routes() -> list[BaseRoute]:
    """The dashboard's pages and its static files (mounted at ``/static``)."""
    return [
        Route("/login", login, methods=["GET"], name="dashboard_login"),
        Route("/", overview, methods=["GET"], name="dashboard_overview"),
        Route("/batches", batch_list, methods=["GET"], name="dashboard_batches"),
        Route("/batches/{batch_id}", batch_detail, methods=["GET"], name="dashboard_batch"),
        Route("/batches/{batch_id}/cancel", cancel_batch, methods=["POST"]),
        Route("/send", send, methods=["GET", "POST"], name="dashboard_send"),
        Route("/v1/docs", api_docs, methods=["GET"], name="api_docs"),
        Route("/keys", keys, methods=["GET", "POST"], name="dashboard_keys"),
        Route("/keys/{key_id}/revoke", revoke_key, methods=["POST"], name="dashboard_revoke"),
        Route("/sessions/end-all", end_sessions, methods=["POST"], name="dashboard_end_sessions"),
        Route("/suppressions", suppressions, methods=["GET", "POST"], name="dashboard_supp"),
        Route(
            "/suppressions/remove",
            remove_suppression,
            methods=["POST"],
            name="dashboard_supp_remove",
        ),
        Route("/domains", domains_page, methods=["GET", "POST"], name="dashboard_domains"),
        Route("/domains/verify", verify_domain, methods=["POST"], name="dashboard_domains_verify"),
        Route("/domains/remove", remove_domain, methods=["POST"], name="dashboard_domains_remove"),
        Mount("/static", app=StaticFiles(directory=STATIC), name="static"),
    ]
