"""GitHub OAuth adapter: pure URL and PKCE helpers, and a client on an injected httpx client.

The web flow (https://docs.github.com/apps/oauth-apps/building-oauth-apps/authorizing-oauth-apps)
with PKCE S256: :func:`authorize_url` sends the exact registered ``redirect_uri``, a one-time
``state`` and the ``code_challenge``; :meth:`GitHubClient.exchange_code` redeems the code with
the ``code_verifier``; the token is then used once, as a ``Bearer`` header (never a query
parameter), to read ``/user`` and ``/user/emails`` (and ``/user/orgs`` when sign-up admits
organisations), and thrown away. Only ``user:email`` is requested, plus ``read:org`` then.
Transport failures become :class:`~shared.core.errors.DependencyUnavailable`; answers that mean
"this login is not valid" become :class:`LoginFailed`.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import httpx

from shared.core.errors import DependencyUnavailable
from shared.infra.config import GitHubSettings

#: The scope we ask for: enough to read the user's verified addresses.
SCOPE = "user:email"
#: Asked for as well when sign-up admits organisations: private memberships need it.
ORG_SCOPE = "read:org"
_API_HEADERS = {
    "Accept": "application/vnd.github+json",
    "X-GitHub-Api-Version": "2022-11-28",
}


class LoginFailed(Exception):
    """GitHub refused the code, the token or the account; the message is safe to show."""


@dataclass(frozen=True, slots=True)
class Email:
    email: str
    primary: bool
    verified: bool


@dataclass(frozen=True, slots=True)
class Profile:
    """What we keep of a GitHub account (the token is not part of it)."""

    github_id: int
    login: str
    name: str | None
    avatar_url: str | None
    email: str
    """The primary address, verified by GitHub."""


def new_verifier() -> str:
    """A PKCE code verifier: 43 URL-safe characters (256 random bits)."""
    return secrets.token_urlsafe(32)


def code_challenge(verifier: str) -> str:
    """The S256 challenge: unpadded base64url of SHA-256(verifier)."""
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def authorize_url(
    settings: GitHubSettings, *, state: str, challenge: str, orgs: bool = False
) -> str:
    """Where to send the browser to start a login; ``orgs`` also asks to read the user's
    organisation memberships (needed only when sign-up admits organisations)."""
    query = urlencode(
        {
            "client_id": settings.client_id,
            "redirect_uri": settings.redirect_uri,
            "scope": f"{SCOPE} {ORG_SCOPE}" if orgs else SCOPE,
            "state": state,
            "code_challenge": challenge,
            "code_challenge_method": "S256",
            "allow_signup": "true",
        }
    )
    return f"{settings.authorize_url}?{query}"


def primary_verified_email(emails: list[Email]) -> str | None:
    """The primary address if GitHub verified it, else None (an unverified one is no proof)."""
    for e in emails:
        if e.primary and e.verified:
            return e.email
    return None


def parse_emails(payload: Any) -> list[Email]:
    """``GET /user/emails`` as a list; malformed entries are skipped."""
    if not isinstance(payload, list):
        raise LoginFailed("GitHub returned no e-mail list")
    return [
        Email(item["email"], item.get("primary") is True, item.get("verified") is True)
        for item in payload
        if isinstance(item, dict) and isinstance(item.get("email"), str)
    ]


class GitHubClient:
    """Calls GitHub for one app on a shared ``httpx.AsyncClient`` owned by the caller."""

    def __init__(self, http: httpx.AsyncClient, settings: GitHubSettings) -> None:
        self._http = http
        self._settings = settings

    async def exchange_code(self, code: str, verifier: str) -> str:
        """The access token for ``code``; :class:`LoginFailed` when GitHub refuses it."""
        s = self._settings
        data = {
            "client_id": s.client_id,
            "client_secret": s.client_secret.get_secret_value(),
            "code": code,
            "redirect_uri": s.redirect_uri,
            "code_verifier": verifier,
        }
        resp = await self._call(
            "POST", s.token_url, data=data, headers={"Accept": "application/json"}
        )
        body = _json(resp)
        if resp.status_code != 200 or not isinstance(body, dict):
            raise LoginFailed(f"GitHub refused the code exchange (HTTP {resp.status_code})")
        token = body.get("access_token")
        if not isinstance(token, str) or not token:
            reason = body.get("error_description") or body.get("error") or "no access token"
            raise LoginFailed(f"GitHub refused the code: {reason}")
        return token

    async def profile(self, token: str) -> Profile:
        """``/user`` and its primary verified address; :class:`LoginFailed` if there is none."""
        user = await self._api(token, "/user")
        if not isinstance(user, dict) or not isinstance(user.get("id"), int):
            raise LoginFailed("GitHub returned no user")
        login = user.get("login")
        if not isinstance(login, str) or not login:
            raise LoginFailed("GitHub returned no login")
        email = primary_verified_email(parse_emails(await self._api(token, "/user/emails")))
        if email is None:
            raise LoginFailed(
                "your GitHub account has no verified primary e-mail address; "
                "verify one on GitHub and try again"
            )
        return Profile(
            github_id=user["id"],
            login=login,
            name=_str_or_none(user.get("name")),
            avatar_url=_str_or_none(user.get("avatar_url")),
            email=email,
        )

    async def orgs(self, token: str) -> list[int]:
        """The ids of the user's organisations (``GET /user/orgs``, first 100): an
        organisation's name, like a login, can be renamed and then registered by anyone."""
        found = await self._api(token, "/user/orgs?per_page=100")
        if not isinstance(found, list):
            raise LoginFailed("GitHub returned no organisation list")
        return [
            o["id"]
            for o in found
            if isinstance(o, dict) and type(o.get("id")) is int and o["id"] > 0
        ]

    async def _api(self, token: str, path: str) -> Any:
        resp = await self._call(
            "GET",
            self._settings.api_url + path,
            headers={**_API_HEADERS, "Authorization": f"Bearer {token}"},
        )
        if resp.status_code in (401, 403, 404):
            raise LoginFailed(f"GitHub refused {path} (HTTP {resp.status_code})")
        if resp.status_code != 200:
            raise DependencyUnavailable("github", f"{path} answered HTTP {resp.status_code}")
        return _json(resp)

    async def _call(self, method: str, url: str, **kw: Any) -> httpx.Response:
        try:
            resp = await self._http.request(method, url, **kw)
        except httpx.HTTPError as exc:
            raise DependencyUnavailable("github", f"{type(exc).__name__}: {exc}") from exc
        if resp.status_code >= 500 or resp.status_code == 429:
            raise DependencyUnavailable("github", f"HTTP {resp.status_code} from {url}")
        return resp


def _json(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError as exc:
        raise LoginFailed("GitHub sent an unreadable answer") from exc


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) and value else None
