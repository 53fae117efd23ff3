"""GitHub OAuth as GitHub applies it: sandbox users, PKCE S256, single-use codes, tokens.

Pure rules plus one bounded store. The sandbox approves every authorization as a user: a
built-in one (one with only an unverified address, one with a private address) or, for any
other valid login, an ad-hoc user with a verified ``<login>@example.com``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: Seconds an authorization code stays redeemable (GitHub: 10 minutes).
CODE_TTL = 600.0
#: Codes and tokens remembered; the oldest are forgotten first.
MAX_CODES = 10_000
MAX_TOKENS = 10_000

_LOGIN = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})$")
_ERROR_URI = (
    "https://docs.github.com/apps/managing-oauth-apps/"
    "troubleshooting-oauth-app-access-token-request-errors/"
)
_ERRORS = {
    "incorrect_client_credentials": "The client_id and/or client_secret passed are incorrect.",
    "redirect_uri_mismatch": (
        "The redirect_uri MUST match the registered callback URL for this application."
    ),
    "bad_verification_code": "The code passed is incorrect or expired.",
}


@dataclass(frozen=True, slots=True)
class GitHubEmail:
    email: str
    primary: bool
    verified: bool
    visibility: str | None

    def as_json(self) -> dict[str, Any]:
        return {
            "email": self.email,
            "primary": self.primary,
            "verified": self.verified,
            "visibility": self.visibility,
        }


@dataclass(frozen=True, slots=True)
class GitHubUser:
    login: str
    id: int
    name: str
    public_email: str | None
    """The ``email`` of ``GET /user``: null unless the user made an address public."""
    emails: tuple[GitHubEmail, ...]
    orgs: tuple[str, ...] = ()
    """The organisations the user belongs to (``GET /user/orgs``), each ``NAME`` or
    ``NAME:ID`` (:func:`org_json`)."""

    def as_json(self) -> dict[str, Any]:
        """GitHub's ``GET /user`` document for this user."""
        return {
            "login": self.login,
            "id": self.id,
            "node_id": "U_" + base64.b64encode(str(self.id).encode()).decode().rstrip("="),
            "avatar_url": f"https://avatars.githubusercontent.com/u/{self.id}?v=4",
            "gravatar_id": "",
            "url": f"https://api.github.com/users/{self.login}",
            "html_url": f"https://github.com/{self.login}",
            "type": "User",
            "site_admin": False,
            "name": self.name,
            "company": None,
            "blog": "",
            "location": None,
            "email": self.public_email,
            "hireable": None,
            "bio": None,
            "twitter_username": None,
            "public_repos": 0,
            "public_gists": 0,
            "followers": 0,
            "following": 0,
            "created_at": "2020-01-01T00:00:00Z",
            "updated_at": "2020-01-01T00:00:00Z",
        }


#: The built-in users, by lower-cased login.
BUILT_IN_USERS: Mapping[str, GitHubUser] = {
    u.login.lower(): u
    for u in (
        GitHubUser(
            "sandbox-user",
            1_000_001,
            "Sandbox User",
            "sandbox-user@example.com",
            (GitHubEmail("sandbox-user@example.com", True, True, "public"),),
        ),
        GitHubUser(
            "octocat",
            583_231,
            "The Octocat",
            "octocat@github.com",
            (
                GitHubEmail("octocat@github.com", True, True, "public"),
                GitHubEmail("octocat@users.noreply.github.com", False, True, None),
            ),
            ("github",),
        ),
        GitHubUser(
            "private-user",
            1_000_002,
            "Private User",
            None,
            (GitHubEmail("private-user@example.com", True, True, "private"),),
        ),
        GitHubUser(
            "unverified-user",
            1_000_003,
            "Unverified User",
            None,
            (GitHubEmail("unverified-user@example.com", True, False, None),),
        ),
    )
}


@dataclass(frozen=True, slots=True)
class Grant:
    """What an authorization code stands for."""

    client_id: str
    redirect_uri: str
    code_challenge: str | None
    user: GitHubUser
    scopes: tuple[str, ...]
    expires_at: float


def find_user(login: str) -> GitHubUser | None:
    """The built-in user ``login``, an ad-hoc user for any other valid login, else None."""
    known = BUILT_IN_USERS.get(login.lower())
    if known is not None:
        return known
    if not _LOGIN.match(login):
        return None
    email = f"{login.lower()}@example.com"
    user_id = 10_000_000 + zlib.crc32(login.lower().encode())
    return GitHubUser(login, user_id, login, email, (GitHubEmail(email, True, True, "public"),))


def parse_scopes(scope: str | None) -> tuple[str, ...]:
    """Requested scopes (GitHub accepts spaces or commas between them)."""
    return tuple(dict.fromkeys(s for s in re.split(r"[\s,]+", scope or "") if s))


def default_org_id(name: str) -> int:
    """The id of the organisation ``name`` when none is given: stable, like GitHub's."""
    return 9_000_000 + zlib.crc32(name.lower().encode()) % 1_000_000


def org_json(entry: str) -> dict[str, Any]:
    """An item of GitHub's ``GET /user/orgs`` for ``NAME`` or ``NAME:ID`` (an organisation
    renamed, or a new one that took a released name, has the id it is given)."""
    login, _, given = entry.partition(":")
    org_id = int(given) if given.isascii() and given.isdecimal() else default_org_id(login)
    return {
        "login": login,
        "id": org_id,
        "node_id": "O_" + base64.b64encode(str(org_id).encode()).decode().rstrip("="),
        "url": f"https://api.github.com/orgs/{login}",
        "description": None,
    }


def can_read_emails(scopes: tuple[str, ...]) -> bool:
    """Whether a token with ``scopes`` may call ``GET /user/emails``."""
    return "user" in scopes or "user:email" in scopes


def pkce_challenge(verifier: str) -> str:
    """The S256 challenge of ``verifier``: unpadded ``base64url(sha256(verifier))``."""
    digest = hashlib.sha256(verifier.encode("ascii", "replace")).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def token_error(code: str, description: str | None = None) -> dict[str, str]:
    """GitHub's access-token error document (sent with status 200, as GitHub does)."""
    return {
        "error": code,
        "error_description": description or _ERRORS[code],
        "error_uri": _ERROR_URI + "#" + code.replace("_", "-"),
    }


class OAuthStore:
    """Outstanding authorization codes and issued access tokens, bounded."""

    def __init__(self) -> None:
        self._codes: dict[str, Grant] = {}
        self._tokens: dict[str, tuple[GitHubUser, tuple[str, ...]]] = {}

    def issue_code(self, grant: Grant) -> str:
        code = secrets.token_hex(10)
        _bounded_put(self._codes, code, grant, MAX_CODES)
        return code

    def issue_token(self, user: GitHubUser, scopes: tuple[str, ...]) -> str:
        token = "gho_" + secrets.token_urlsafe(27)[:36]
        _bounded_put(self._tokens, token, (user, scopes), MAX_TOKENS)
        return token

    def token(self, token: str) -> tuple[GitHubUser, tuple[str, ...]] | None:
        """The user and scopes of ``token``, if it was issued."""
        return self._tokens.get(token)

    def exchange(self, params: Mapping[str, str], *, now: float) -> dict[str, str]:
        """The access-token answer for ``params``; a code is spent by its first use."""
        client_id = params.get("client_id", "")
        offered = params.get("client_secret", "")
        if not client_id or not offered or offered == "invalid":
            return token_error("incorrect_client_credentials")
        grant = self._codes.pop(params.get("code", ""), None)
        if grant is None or grant.expires_at < now:
            return token_error("bad_verification_code")
        if grant.client_id != client_id:
            return token_error("incorrect_client_credentials")
        redirect_uri = params.get("redirect_uri")
        if redirect_uri is not None and redirect_uri != grant.redirect_uri:
            return token_error("redirect_uri_mismatch")
        if grant.code_challenge is not None and not _verifier_matches(
            params.get("code_verifier"), grant.code_challenge
        ):
            return token_error(
                "bad_verification_code", "The code_verifier does not match the code_challenge."
            )
        token = self.issue_token(grant.user, grant.scopes)
        return {"access_token": token, "token_type": "bearer", "scope": ",".join(grant.scopes)}


def _verifier_matches(verifier: str | None, challenge: str) -> bool:
    if not verifier:
        return False
    return hmac.compare_digest(pkce_challenge(verifier), challenge)


def _bounded_put(store: dict[str, Any], key: str, value: Any, limit: int) -> None:
    while len(store) >= limit:
        del store[next(iter(store))]
    store[key] = value
