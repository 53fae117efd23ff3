"""``/auth/github/login``, ``/auth/github/callback`` and ``/auth/logout``.

Login CSRF and code injection are stopped twice over (RFC 9700): a one-time ``state`` bound to
this browser, and PKCE S256. ``/auth/github/login`` writes nothing on the server: it keeps
``(state, code_verifier, next)`` in the browser's short-lived HttpOnly login cookie
(:mod:`services.api.loginstate`); the callback accepts only a state that cookie holds, takes it
out of the cookie (a second use finds nothing: 400) and redeems the code with the verifier.
Any failure answers 400 and starts no session. On success the user (keyed by
GitHub id) is created or refreshed, the browser's previous session id is discarded for a new
one (no fixation) and the browser goes to ``next``, which may only be a local path.
"""

from __future__ import annotations

import html
import time
from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from services.api import github, loginstate
from services.api.loginstate import LOGIN_TTL
from services.api.session_store import LOGIN_COOKIE, new_token, safe_next
from services.api.sessions import (
    clear_session_cookie,
    cookie_name,
    current_user,
    session_cookie,
    session_store,
    set_cookie,
    set_session_cookie,
    verify_csrf,
)
from shared.accounts import accounts, signup
from shared.infra.config import Settings
from shared.infra.db import Database
from shared.infra.http import ApiError, error_response, read_capped

_FORM_LIMIT = 16 * 1024


async def login(request: Request) -> Response:
    """Start a GitHub login: remember state + PKCE verifier in this browser, then redirect."""
    settings: Settings = request.app.state.settings
    now = int(time.time())
    state, verifier = new_token(), github.new_verifier()
    started = loginstate.PendingLogin(
        state, verifier, safe_next(request.query_params.get("next")), now
    )
    pending = loginstate.add(loginstate.decode(_login_cookie(request), now), started)
    target = github.authorize_url(
        settings.github,
        state=state,
        challenge=github.code_challenge(verifier),
        orgs=signup.needs_orgs(
            settings.signup_policy, signup.Allowlist.parse(settings.signup_allow)
        ),
    )
    response = RedirectResponse(target, status_code=302)
    response.headers["Cache-Control"] = "no-store"
    set_cookie(response, settings, LOGIN_COOKIE, loginstate.encode(pending), LOGIN_TTL)
    return response


async def callback(request: Request) -> Response:
    """Finish a login: check and spend the state, redeem the code, start a fresh session."""
    settings: Settings = request.app.state.settings
    pending = loginstate.decode(_login_cookie(request), int(time.time()))
    login, others = loginstate.take(pending, request.query_params.get("state"))
    if login is None:
        return _failed(request, "login_state", "this login link is invalid or was already used")
    response = await _finish(request, login)
    # Whatever the outcome, this state is spent: the cookie keeps only the other logins.
    if others:
        set_cookie(response, settings, LOGIN_COOKIE, loginstate.encode(others), LOGIN_TTL)
    else:
        set_cookie(response, settings, LOGIN_COOKIE, "", 0)
    return response


async def _finish(request: Request, login: loginstate.PendingLogin) -> Response:
    """Redeem the code of a login this browser started; a session, or the page saying why not."""
    settings: Settings = request.app.state.settings
    db: Database = request.app.state.resources.db
    query = request.query_params
    verifier, next_path = login.verifier, login.next_path
    if "error" in query:
        return _failed(request, "login_denied", "GitHub did not authorise the login")
    code = query.get("code", "")
    if not code or len(code) > 512:
        return _failed(request, "login_failed", "GitHub sent no authorisation code")
    client = github.GitHubClient(request.app.state.github_http, settings.github)
    policy, allowlist = settings.signup_policy, signup.Allowlist.parse(settings.signup_allow)
    try:
        token = await client.exchange_code(code, verifier)
        profile = await client.profile(token)
        orgs = await client.orgs(token) if signup.needs_orgs(policy, allowlist) else []
    except github.LoginFailed as exc:
        return _failed(request, "login_failed", str(exc))
    # The token has done its job; it is not stored anywhere.
    existing = await accounts.github_user(db, profile.github_id)
    requests = signup.SignupRequests(db)
    asked = None
    if existing is None and policy == "approval":
        asked = await requests.state(profile.github_id)
    decision = signup.decide(
        policy,
        existing=existing is not None,
        github_id=profile.github_id,
        orgs=orgs,
        allowlist=allowlist,
        request=asked,
    )
    if decision == "pending":
        await requests.ask(profile.github_id, profile.login, profile.name, profile.email)
        return _not_admitted(
            request,
            "signup_pending",
            f"Your request to sign up as {profile.login} is waiting for an operator's approval. "
            "Log in again once you have been told it was approved.",
        )
    if decision == "refuse":
        return _not_admitted(
            request,
            "signup_closed",
            f"{profile.login} has no account here, and this Safedelivr does not let new "
            "accounts sign up. Ask its operator for access.",
        )
    user_id = await accounts.upsert_github_user(
        db,
        github_id=profile.github_id,
        login=profile.login,
        name=profile.name,
        email=profile.email,
        avatar_url=profile.avatar_url,
    )
    if asked == "approved":
        await requests.done(profile.github_id)
    session_id, _ = await session_store(request).create(user_id, replaces=session_cookie(request))
    response = RedirectResponse(safe_next(next_path), status_code=302)
    response.headers["Cache-Control"] = "no-store"
    set_session_cookie(response, settings, session_id)
    return response


async def logout(request: Request) -> Response:
    """End the session server-side (CSRF-checked) and clear the cookie; then go to ``/``."""
    settings: Settings = request.app.state.settings
    user = await current_user(request)
    if user is not None:
        await verify_csrf(request, user, await _form_token(request))
        await session_store(request).delete(user.session_id)
    response = RedirectResponse("/", status_code=303)
    clear_session_cookie(response, settings)
    return response


def _login_cookie(request: Request) -> str | None:
    return request.cookies.get(cookie_name(request.app.state.settings, LOGIN_COOKIE))


async def _form_token(request: Request) -> str | None:
    """The ``csrf_token`` field of a url-encoded form body, if that is what was posted."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/x-www-form-urlencoded":
        return None
    raw = await read_capped(request, _FORM_LIMIT)
    for name, value in parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=True):
        if name == "csrf_token":
            return value
    return None


def _failed(request: Request, code: str, message: str) -> Response:
    """400 without a session: the error envelope for JSON callers, a small page for browsers."""
    return _page(request, 400, code, "Login failed", message, retry=True)


def _not_admitted(request: Request, code: str, message: str) -> Response:
    """403 without a session, a user row or a key: the sign-up policy did not admit them."""
    return _page(request, 403, code, "Not admitted", message, retry=False)


def _page(
    request: Request, status: int, code: str, title: str, message: str, *, retry: bool
) -> Response:
    accept = request.headers.get("accept", "")
    if "application/json" in accept and "text/html" not in accept:
        return error_response(ApiError(status, code, message))
    again = '<p><a href="/auth/github/login">Try again</a></p>' if retry else ""
    page = (
        f"<!doctype html><html lang=en><meta charset=utf-8><title>{title}</title>"
        f"<body><h1>{title}</h1>"
        f"<p>{html.escape(message)}</p>{again}</body></html>"
    )
    response = HTMLResponse(page, status_code=status)
    response.headers["Cache-Control"] = "no-store"
    return response
