"""API-key authentication for ``/v1``: one 401 body for every way a key can be wrong, then the
key's request rate limit (429 with ``Retry-After``) and a cheap ``last_used_at`` update.

The one owner of request rate limits: a dashboard session's requests that send
(``/send``, ``/api/batch``) are limited here too (:func:`limit_user`), by the same limiter
and policy, per user.

Keys are looked up through this process's :class:`services.api.keycache.KeyCache`: a row read
less than a second ago is used again, and a revoked key is dropped from every process's cache
by a broadcast (and refused everywhere within ``services.api.keycache.TTL`` without one).
``last_used_at`` is written at most once a minute per key per process, in the
background, so the hot path gains no write for it.
"""

from __future__ import annotations

import functools
import time
import uuid
from datetime import UTC, datetime

from starlette.requests import Request

from services.api.keycache import KeyCache
from shared.accounts import accounts, ratelimit
from shared.accounts.accounts import ApiKeyRecord
from shared.accounts.ratelimit import RateLimiter, RatePolicy, RateWindows, Verdict
from shared.infra.background import Background
from shared.infra.config import Settings
from shared.infra.db import Database
from shared.infra.http import ApiError

_UNAUTHORIZED = ApiError(
    401,
    "unauthorized",
    "missing or invalid API key",
    headers={"WWW-Authenticate": 'Bearer realm="safedelivr"'},
)
#: Seconds between two ``last_used_at`` writes for one key from one process.
TOUCH_INTERVAL = 60.0
_TOUCH_MEMO_LIMIT = 100_000


async def require_key(request: Request, scope: str | None) -> ApiKeyRecord:
    """The caller's key record, or 401 (same body for unknown, revoked, expired or wrong
    secret); 403 ``forbidden`` when the key lacks ``scope`` (None: any key will do).

    Within its rate limit only; otherwise 429 ``rate_limited`` with ``Retry-After``.
    """
    token = bearer_token(request)
    if token is None:
        raise _UNAUTHORIZED
    record = await admit_key(request, token)
    if record is None:
        raise _UNAUTHORIZED
    if scope is not None:
        require_scope(record, scope)
    return record


def require_scope(record: ApiKeyRecord, scope: str) -> None:
    """403 unless the key holds ``scope`` (see ``shared.accounts.apikeys.SCOPES``)."""
    if scope not in record.scopes:
        raise ApiError(
            403,
            "forbidden",
            f"this API key lacks the {scope!r} scope",
            fields={"scope": f"needs {scope}; the key holds {', '.join(sorted(record.scopes))}"},
        )


def bearer_token(request: Request) -> str | None:
    """The token of an ``Authorization: Bearer`` header, if the request has one."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


async def admit_key(request: Request, token: str) -> ApiKeyRecord | None:
    """The record of a presented key within its rate limit; None when the key is not valid
    (unknown, revoked, wrong secret). Over the limit: 429 ``rate_limited``."""
    db: Database = request.app.state.resources.db
    record = await key_cache(request).authenticate(token, datetime.now(UTC))
    if record is None:
        return None
    verdict = await rate_limiter(request).hit(record.key_id)
    _within(verdict, "too many requests for this API key; retry after the Retry-After seconds")
    _touch(request, db, record.key_id)
    return record


async def limit_user(request: Request, user_id: uuid.UUID) -> None:
    """Count one request of a dashboard session's user: the keys' limit and policy, one
    budget per user across their sessions. Over the limit: 429 ``rate_limited``."""
    verdict = await rate_limiter(request).hit(ratelimit.user_bucket(user_id))
    _within(verdict, "too many requests from this account; retry after the Retry-After seconds")


def _within(verdict: Verdict, message: str) -> None:
    if not verdict.allowed:
        raise ApiError(
            429, "rate_limited", message, headers={"Retry-After": str(verdict.retry_after)}
        )


def key_cache(request: Request) -> KeyCache:
    """This process's key cache (made on first use where the lifespan made none)."""
    state = request.app.state
    cache: KeyCache | None = getattr(state, "keys", None)
    if cache is None:
        cache = state.keys = KeyCache(functools.partial(accounts.read_key, state.resources.db))
    return cache


def rate_limiter(request: Request) -> RateLimiter:
    """This process's limiter (made on first use from the app's settings)."""
    state = request.app.state
    limiter: RateLimiter | None = getattr(state, "rate_limiter", None)
    if limiter is None:
        settings: Settings = state.settings
        policy = RatePolicy(settings.api.rate_limit_per_second, settings.api.rate_burst)
        limiter = RateLimiter(RateWindows(state.resources.db), policy)
        state.rate_limiter = limiter
    return limiter


def _touch(request: Request, db: Database, key_id: str) -> None:
    state = request.app.state
    touched: dict[str, float] | None = getattr(state, "key_touched", None)
    if touched is None:
        touched = state.key_touched = {}
    now = time.monotonic()
    last = touched.get(key_id)
    if last is not None and now - last < TOUCH_INTERVAL:
        return
    if len(touched) >= _TOUCH_MEMO_LIMIT:
        touched.clear()
    touched[key_id] = now
    background: Background | None = getattr(state, "background", None)
    if background is not None:
        background.spawn(accounts.touch_key(db, key_id))
