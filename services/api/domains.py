"""``/v1/domains``: add a sending domain, show the TXT record that proves it is yours, verify
it, list and remove. Batches are sent only from verified domains (``shared.domains``)."""

from __future__ import annotations

import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from services.api.auth import require_key
from services.api.schema import DomainIn, checked
from shared import domains
from shared.domains import DohResolver, DomainError, DomainStore, SendingDomain
from shared.http import JSON, ApiError, read_json

SMALL_BODY = 4 * 1024


def view(d: SendingDomain) -> dict[str, Any]:
    """What users see of a domain: its state and the record to publish."""
    return {
        "domain": d.domain,
        "verified": d.verified,
        "verified_at": d.verified_at.isoformat() if d.verified_at else None,
        "created_at": d.created_at.isoformat(),
        "record": {
            "type": "TXT",
            "name": domains.record_name(d.domain),
            "value": domains.record_value(d.token),
        },
    }


def _store(request: Request) -> DomainStore:
    store: DomainStore = request.app.state.domains
    return store


def _path_domain(request: Request) -> str:
    try:
        return domains.normalize_domain(request.path_params["domain"])
    except DomainError:
        raise ApiError(404, "not_found", "no such domain") from None


async def _owned(request: Request, user_id: uuid.UUID) -> SendingDomain:
    found = await _store(request).get(user_id, _path_domain(request))
    if found is None:
        raise ApiError(404, "not_found", "no such domain")
    return found


async def list_domains(request: Request) -> Response:
    key = await require_key(request, "read")
    return JSON({"data": [view(d) for d in await _store(request).all(key.user_id)]})


async def add_domain(request: Request) -> Response:
    key = await require_key(request, "send")
    _, body = await read_json(request, SMALL_BODY)
    wanted = checked(DomainIn, body)
    try:
        name = domains.normalize_domain(wanted.domain)
    except DomainError as exc:
        raise ApiError(
            422, "invalid_fields", "the domain is not valid", fields={"domain": str(exc)}
        ) from None
    store = _store(request)
    existing = await store.all(key.user_id)
    if len(existing) >= domains.MAX_DOMAINS and name not in {d.domain for d in existing}:
        raise ApiError(409, "too_many_domains", f"at most {domains.MAX_DOMAINS} domains per user")
    return JSON(view(await store.add(key.user_id, name)), status_code=201)


async def get_domain(request: Request) -> Response:
    key = await require_key(request, "read")
    return JSON(view(await _owned(request, key.user_id)))


async def verify_domain(request: Request) -> Response:
    """Look the TXT record up now: 200 when it holds the token (the domain is verified),
    422 naming what to publish when it does not, 503 when DNS cannot be asked."""
    key = await require_key(request, "send")
    found = await _owned(request, key.user_id)
    if not found.verified:
        resolver: DohResolver = request.app.state.resolver
        name = domains.record_name(found.domain)
        if not domains.proven(await resolver.txt(name), found.token):
            raise ApiError(
                422,
                "not_verified",
                f"no TXT record {domains.record_value(found.token)!r} at {name} yet "
                "(DNS changes can take a while to be seen)",
                fields={"domain": "the TXT record was not found"},
            )
        await _store(request).mark_verified(key.user_id, found.domain)
        found = await _owned(request, key.user_id)
    return JSON(view(found))


async def delete_domain(request: Request) -> Response:
    key = await require_key(request, "send")
    if not await _store(request).remove(key.user_id, _path_domain(request)):
        raise ApiError(404, "not_found", "no such domain")
    return Response(status_code=204)
