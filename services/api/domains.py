"""``/v1/domains``: add a sending domain, show the TXT record that proves it is yours, verify
it, list and remove, and see its sending capacity today; :class:`SendingDomains` holds the use
cases the dashboard's Domains page shares. Batches are sent only from verified domains
(``shared.domains``)."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from services.api.auth import require_key
from services.api.schema import DomainIn, checked
from services.api.settings import settings_store
from shared import domains
from shared.config import Settings
from shared.domain_capacity import DayVolume, DomainVolumes, capacity
from shared.domains import DohResolver, DomainError, DomainStore, SendingDomain
from shared.http import JSON, ApiError, read_json
from shared.livesettings import resolve

SMALL_BODY = 4 * 1024


def view(d: SendingDomain, capacity: dict[str, Any] | None = None) -> dict[str, Any]:
    """What users see of a domain: its state, the record to publish, and its sending
    capacity today (None while capacity is off)."""
    return {
        "capacity": capacity,
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


@dataclass(frozen=True, slots=True)
class SendingDomains:
    """The use cases behind ``/v1/domains`` and the dashboard's Domains page. Raw names in;
    records out, or :class:`ApiError` (422 naming the field, 404, 409)."""

    store: DomainStore
    resolver: DohResolver

    @classmethod
    def of(cls, request: Request) -> SendingDomains:
        return cls(request.app.state.domains, request.app.state.resolver)

    async def add(self, user_id: uuid.UUID, raw: str) -> SendingDomain:
        """Add ``raw`` (again: the same record stays), up to :data:`domains.MAX_DOMAINS`."""
        try:
            name = domains.normalize_domain(raw)
        except DomainError as exc:
            raise ApiError(
                422, "invalid_fields", "the domain is not valid", fields={"domain": str(exc)}
            ) from None
        existing = await self.store.all(user_id)
        if len(existing) >= domains.MAX_DOMAINS and name not in {d.domain for d in existing}:
            raise ApiError(
                409, "too_many_domains", f"at most {domains.MAX_DOMAINS} domains per user"
            )
        return await self.store.add(user_id, name)

    async def owned(self, user_id: uuid.UUID, raw: str) -> SendingDomain:
        found = await self.store.get(user_id, _name_or_404(raw))
        if found is None:
            raise ApiError(404, "not_found", "no such domain")
        return found

    async def verify(self, user_id: uuid.UUID, raw: str) -> SendingDomain:
        """Look the TXT record up now: the verified domain, or 422 naming what to publish
        (503 via DependencyUnavailable when DNS cannot be asked)."""
        found = await self.owned(user_id, raw)
        if found.verified:
            return found
        name = domains.record_name(found.domain)
        if not domains.proven(await self.resolver.txt(name), found.token):
            raise ApiError(
                422,
                "not_verified",
                f"no TXT record {domains.record_value(found.token)!r} at {name} yet "
                "(DNS changes can take a while to be seen)",
                fields={"domain": "the TXT record was not found"},
            )
        await self.store.mark_verified(user_id, found.domain)
        return await self.owned(user_id, found.domain)

    async def remove(self, user_id: uuid.UUID, raw: str) -> None:
        if not await self.store.remove(user_id, _name_or_404(raw)):
            raise ApiError(404, "not_found", "no such domain")


def _name_or_404(raw: str) -> str:
    try:
        return domains.normalize_domain(raw)
    except DomainError:
        raise ApiError(404, "not_found", "no such domain") from None


async def capacities(request: Request, names: list[str]) -> dict[str, dict[str, Any] | None]:
    """Each domain's capacity today (``shared.domain_capacity``) for mail from exactly that
    domain; all None while the live setting ``capacity.enabled`` is off."""
    settings: Settings = request.app.state.settings
    rules = resolve(await settings_store(request).stored(), settings.providers).capacity
    if not rules.enabled:
        return dict.fromkeys(names)
    volumes = DomainVolumes(request.app.state.resources.db)
    today = datetime.now(UTC).date()

    async def one(name: str) -> dict[str, Any]:
        history = await volumes.history(name, today)
        cap = capacity(history, today, rules)
        sent = history.get(today, DayVolume()).sent
        return {"limit_today": cap.limit, "sent_today": sent, "state": cap.state, "why": cap.why}

    found = await asyncio.gather(*(one(n) for n in names))
    return dict(zip(names, found, strict=True))


async def list_domains(request: Request) -> Response:
    key = await require_key(request, "read")
    owned = await SendingDomains.of(request).store.all(key.user_id)
    caps = await capacities(request, [d.domain for d in owned])
    return JSON({"data": [view(d, caps[d.domain]) for d in owned]})


async def add_domain(request: Request) -> Response:
    key = await require_key(request, "send")
    _, body = await read_json(request, SMALL_BODY)
    wanted = checked(DomainIn, body)
    added = await SendingDomains.of(request).add(key.user_id, wanted.domain)
    return JSON(view(added), status_code=201)


async def get_domain(request: Request) -> Response:
    key = await require_key(request, "read")
    found = await SendingDomains.of(request).owned(key.user_id, request.path_params["domain"])
    caps = await capacities(request, [found.domain])
    return JSON(view(found, caps[found.domain]))


async def verify_domain(request: Request) -> Response:
    """200 when the TXT record holds the token (the domain is verified), 422 naming what to
    publish when it does not, 503 when DNS cannot be asked."""
    key = await require_key(request, "send")
    found = await SendingDomains.of(request).verify(key.user_id, request.path_params["domain"])
    return JSON(view(found))


async def delete_domain(request: Request) -> Response:
    key = await require_key(request, "send")
    await SendingDomains.of(request).remove(key.user_id, request.path_params["domain"])
    return Response(status_code=204)
