"""The GitHub logins a browser has in flight, kept in that browser's login cookie.

Starting a login must not write anything on the server: ``/auth/github/login`` is reachable
without authentication, and one database row per request let anyone fill a table. So each
login in flight, ``(state, code_verifier, next, started)``, travels in the HttpOnly login
cookie itself (``__Host-sd_login`` over HTTPS, which another subdomain cannot set: no cookie
tossing). The callback accepts a ``state`` only if this browser's cookie holds it, within
:data:`LOGIN_TTL`, and the cookie it sends back no longer holds it. The cookie needs no
signature: a browser can only change logins it started itself, and GitHub redeems each code
once, with the verifier that matches the challenge it was shown.

Pure: encoding, decoding, adding and taking; the handlers in :mod:`services.api.oauth` do
the HTTP.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import re
from dataclasses import dataclass
from typing import Final

import orjson

#: Seconds a login may take between our redirect and GitHub's callback (GitHub: 10 min codes).
LOGIN_TTL: Final = 600
#: Logins one browser may have in flight at once (a few tabs); the oldest makes way.
MAX_PENDING: Final = 3
#: A ``next`` longer than this is not kept (the cookie must stay well under 4 KB).
MAX_NEXT_LENGTH: Final = 512
#: Our tokens are 43 URL-safe characters; anything else is not ours.
_TOKEN: Final = re.compile(r"^[A-Za-z0-9_-]{20,128}$")
_MAX_COOKIE: Final = 4096


@dataclass(frozen=True, slots=True)
class PendingLogin:
    """One login this browser started: what the callback needs to finish it."""

    state: str
    verifier: str
    next_path: str
    started: int  # Unix seconds


def decode(value: str | None, now: int) -> list[PendingLogin]:
    """The live logins in a cookie value; anything malformed or expired is left out."""
    if not value or len(value) > _MAX_COOKIE:
        return []
    try:
        items = orjson.loads(base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)))
    except (ValueError, binascii.Error):
        return []
    if not isinstance(items, list):
        return []
    found: list[PendingLogin] = []
    for item in items[:MAX_PENDING]:
        login = _login(item)
        if login is not None and 0 <= now - login.started < LOGIN_TTL:
            found.append(login)
    return found


def encode(pending: list[PendingLogin]) -> str:
    """The cookie value holding ``pending`` (URL-safe base64 of a JSON list)."""
    rows = [[p.state, p.verifier, p.next_path, p.started] for p in pending]
    return base64.urlsafe_b64encode(orjson.dumps(rows)).decode().rstrip("=")


def add(pending: list[PendingLogin], login: PendingLogin) -> list[PendingLogin]:
    """``login`` first, then the newest of the others (at most :data:`MAX_PENDING`)."""
    if len(login.next_path) > MAX_NEXT_LENGTH:
        login = PendingLogin(login.state, login.verifier, "/", login.started)
    return [login, *pending][:MAX_PENDING]


def take(
    pending: list[PendingLogin], state: str | None
) -> tuple[PendingLogin | None, list[PendingLogin]]:
    """The login started with ``state`` (compared in constant time) and the ones left."""
    if not state or not _TOKEN.match(state):
        return None, pending
    match = None
    for login in pending:
        if hmac.compare_digest(login.state.encode(), state.encode()):
            match = login
    if match is None:
        return None, pending
    return match, [p for p in pending if p is not match]


def _login(item: object) -> PendingLogin | None:
    if not isinstance(item, list) or len(item) != 4:
        return None
    state, verifier, next_path, started = item
    if not (isinstance(state, str) and _TOKEN.match(state)):
        return None
    if not (isinstance(verifier, str) and _TOKEN.match(verifier)):
        return None
    if not isinstance(next_path, str) or len(next_path) > MAX_NEXT_LENGTH:
        return None
    if not isinstance(started, int) or isinstance(started, bool):
        return None
    return PendingLogin(state, verifier, next_path, started)
