"""Cookie sessions for the dashboard: who is logged in, login redirects, CSRF checks, cookies.

Contract for dashboard handlers:

* :func:`current_user` — the :class:`SessionUser` behind the ``sd_session`` cookie, or None;
* :func:`require_user` — the same, or :class:`LoginRequired` (the app answers 302 to
  ``/login?next=<path>``);
* :func:`verify_csrf` — call before every cookie-authenticated state change (POST, DELETE).
  It refuses a cross-origin ``Origin`` (or ``Sec-Fetch-Site: cross-site``) and requires the
  session's synchroniser token, from the form field ``csrf_token`` (pass it in) or the
  ``X-CSRF-Token`` header; failures are ``ApiError(403, "csrf", ...)``.

The session cookie is ``HttpOnly; SameSite=Lax; Path=/``; whenever the public URL is https it
is also ``Secure`` and named with the ``__Host-`` prefix (:func:`cookie_name`), which browsers
accept only from this exact host over HTTPS: a sibling subdomain cannot plant one (cookie
tossing, session fixation). It lives as long as the session's absolute lifetime, while the
server enforces the (shorter, sliding) idle timeout.
"""

from __future__ import annotations

import hmac
import uuid
from dataclasses import dataclass
from typing import Literal
from urllib.parse import quote, urlsplit

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from services.api.session_store import SESSION_COOKIE, Sessions, SessionStore, safe_next
from shared.accounts import accounts
from shared.infra.config import Settings
from shared.infra.db import Database
from shared.infra.http import ApiError

_CACHE = "safedelivr_session_user"


@dataclass(frozen=True)
class SessionUser:
    """The logged-in dashboard user of one request."""

    user_id: uuid.UUID
    login: str
    name: str | None
    email: str | None
    avatar_url: str | None
    csrf_token: str
    session_id: str
    github_id: int | None = None
    """The GitHub account behind the user (None: an account made by the CLI)."""


def is_operator(settings: Settings, user: SessionUser | None) -> bool:
    """Whether ``user`` is one of ``SAFEDELIVR_OPERATORS``: by GitHub id, which no rename can
    take over (a login can be registered by anyone once its owner lets it go)."""
    return (
        user is not None
        and user.github_id is not None
        and (user.github_id in settings.operator_ids)
    )


class LoginRequired(Exception):
    """Raised by :func:`require_user`; the app turns it into a redirect to the login page."""

    def __init__(self, next_path: str) -> None:
        super().__init__(next_path)
        self.next_path = next_path


def session_store(request: Request) -> Sessions:
    """A store configured from the app's settings (cheap to build per request)."""
    settings: Settings = request.app.state.settings
    db: Database = request.app.state.resources.db
    return SessionStore(
        db, idle_ttl=settings.api.session_idle_ttl, max_age=settings.api.session_max_age
    )


async def current_user(request: Request) -> SessionUser | None:
    """The user whose live session the request's cookie names, else None (memoised)."""
    if _CACHE in request.scope:
        cached: SessionUser | None = request.scope[_CACHE]
        return cached
    user = await _load_user(request)
    request.scope[_CACHE] = user
    return user


async def require_user(request: Request) -> SessionUser:
    """The logged-in user, or :class:`LoginRequired` carrying this page's path."""
    user = await current_user(request)
    if user is None:
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise LoginRequired(safe_next(path))
    return user


async def verify_csrf(request: Request, user: SessionUser, form_token: str | None) -> None:
    """Refuse a cookie-authenticated state change that is cross-origin or lacks the token."""
    if not same_origin(
        request.headers.get("origin"), request.headers.get("sec-fetch-site"), own_origins(request)
    ):
        raise ApiError(403, "csrf", "cross-origin request refused")
    token = form_token or request.headers.get("x-csrf-token") or ""
    if not token or not hmac.compare_digest(token.encode(), user.csrf_token.encode()):
        raise ApiError(403, "csrf", "missing or invalid CSRF token; reload the page and retry")


def own_origins(request: Request) -> set[str]:
    """The origins our own pages are served from: the public URL's and this request's."""
    settings: Settings = request.app.state.settings
    return {_origin(settings.api.public_url), _origin(str(request.base_url))}


def same_origin(origin: str | None, fetch_site: str | None, allowed: set[str]) -> bool:
    """Whether browser-supplied origin headers allow a state change (absent headers do)."""
    if fetch_site is not None and fetch_site.lower() == "cross-site":
        return False
    if origin is None:
        return True
    return origin.rstrip("/").lower() in allowed


def cookie_secure(settings: Settings) -> bool:
    """Whether the dashboard is served over HTTPS (cookies ``Secure``, HSTS sent)."""
    return settings.api.public_url.lower().startswith("https://")


def cookie_name(settings: Settings, base: str) -> str:
    """``base``, prefixed ``__Host-`` over HTTPS (only this host may set it, with Path=/)."""
    return f"__Host-{base}" if cookie_secure(settings) else base


def session_cookie(request: Request) -> str | None:
    """The session id the request's cookie carries, if any."""
    return request.cookies.get(cookie_name(request.app.state.settings, SESSION_COOKIE))


def set_session_cookie(response: Response, settings: Settings, session_id: str) -> None:
    set_cookie(response, settings, SESSION_COOKIE, session_id, settings.api.session_max_age)


def clear_session_cookie(response: Response, settings: Settings) -> None:
    set_cookie(response, settings, SESSION_COOKIE, "", 0)


def set_cookie(
    response: Response,
    settings: Settings,
    base: str,
    value: str,
    max_age: int,
    *,
    samesite: Literal["lax", "strict", "none"] = "lax",
) -> None:
    """Set our cookie ``base`` (``HttpOnly``, ``Path=/``; ``Secure`` and ``__Host-`` over HTTPS)."""
    response.set_cookie(
        cookie_name(settings, base),
        value,
        max_age=max_age,
        path="/",
        secure=cookie_secure(settings),
        httponly=True,
        samesite=samesite,
    )


async def login_required_response(request: Request, exc: Exception) -> Response:
    """Exception handler: :class:`LoginRequired` becomes a 302 to the login page."""
    assert isinstance(exc, LoginRequired)  # noqa: S101 - registered for LoginRequired only
    target = "/login"
    if exc.next_path != "/":
        target += "?next=" + quote(exc.next_path, safe="")
    return RedirectResponse(target, status_code=302)


async def _load_user(request: Request) -> SessionUser | None:
    session_id = session_cookie(request)
    if not session_id:
        return None
    session = await session_store(request).get(session_id)
    if session is None:
        return None
    profile = await accounts.get_user(request.app.state.resources.db, session.user_id)
    if profile is None:
        return None
    if profile.sessions_after is not None and session.created_at <= profile.sessions_after:
        return None  # the user logged out everywhere after this session began
    return SessionUser(
        user_id=profile.user_id,
        login=profile.login,
        name=profile.name,
        email=profile.email,
        avatar_url=profile.avatar_url,
        csrf_token=session.csrf_token,
        session_id=session_id,
        github_id=profile.github_id,
    )


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()
