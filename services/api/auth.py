"""API-key authentication for ``/v1``: one 401 body for every way a key can be wrong."""

from __future__ import annotations

from starlette.requests import Request

from shared import accounts
from shared.accounts import ApiKeyRecord
from shared.db import Database
from shared.http import ApiError

_UNAUTHORIZED = ApiError(
    401,
    "unauthorized",
    "missing or invalid API key",
    headers={"WWW-Authenticate": 'Bearer realm="safedelivr"'},
)


async def require_key(request: Request) -> ApiKeyRecord:
    """The caller's key record, or 401 (same body for unknown, revoked or wrong secret)."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise _UNAUTHORIZED
    db: Database = request.app.state.resources.db
    record = await accounts.authenticate(db, token.strip())
    if record is None:
        raise _UNAUTHORIZED
    return record
